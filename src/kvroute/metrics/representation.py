"""Representation: compressed vs full hidden states, the answer-type control, and the logit lens.

Three readings of the last prompt token (the one that predicts the first answer token):

* ``hidden_cosine``: compressed vs full hidden state per layer.
* ``probe_features``: the hidden state at ``probe_layer`` for the answer-*type* probe. It is a
  **control that reads the question**: the type follows from the question's wording, which the
  question-agnostic regime never compresses, so it stays perfect with every evidence token evicted.
* The **logit lens** (the probes that can fail when the evidence is gone): per layer ℓ the final norm
  and unembedding applied to h_ℓ (the engine computes it, see :func:`kvroute.engine.decode.logit_lens`),
  read at the first in-context token of the gold answer (``lens_gold_*``) and of every candidate value
  of the instance (gold first, then its distractors: ``lens_candidates``), and the **sequence lens**
  (``lens_candidates_seq``): per layer, the log-likelihood of each candidate's whole token sequence,
  teacher-forced after the prompt under the cell's mask (at the last layer it is the compressed
  model's own likelihood of that answer). Both feed the answer-identity probe of
  :mod:`kvroute.analysis.probe`, which prefers the sequence lens.

The first-token lens tells candidates apart by their first in-context token only; a distractor whose
first token equals the gold's (or an earlier kept distractor's) cannot be, so it is dropped there and
counted (``lens_candidates_dropped``). The sequence lens keeps every distinct candidate
(``lens_seq_n_candidates``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from kvroute.metrics.base import CellContext, Metric, register
from kvroute.tasks.instance import IDK

if TYPE_CHECKING:
    from kvroute.tasks.instance import TaskInstance
    from kvroute.tasks.prompt import Prompt


@dataclass(frozen=True)
class LensCandidates:
    """The candidate answer values of one prompt and the tokens the logit lens reads for them.

    ``texts[0]`` is the gold answer (``"I don't know"`` on an unanswerable item), the rest are the
    instance's distractors that survived; ``ids[i]`` is the first token of ``texts[i]`` as the model
    would generate it right after the prompt (distinct); ``dropped`` are the distractors whose first
    token coincided with a kept candidate's. ``seq_texts`` / ``seqs`` are every distinct candidate (the
    gold first, no first-token drops) and its whole token sequence, for the sequence lens.
    """

    texts: tuple[str, ...]
    ids: tuple[int, ...]
    dropped: tuple[str, ...] = ()
    seq_texts: tuple[str, ...] = ()
    seqs: tuple[tuple[int, ...], ...] = ()


def answer_candidates(tokenizer: Any, prompt: Prompt, instance: TaskInstance,
                      gold_ids: Sequence[int] | None = None) -> LensCandidates:
    """The gold answer and the instance's distractors with their first in-context tokens.

    ``gold_ids`` (the runner's in-context tokens of the gold, :func:`kvroute.runner.gold_ids`) give
    the gold's first token; otherwise it is tokenised here the same way as the distractors. Distractors that
    normalise to a gold answer are not candidates; those whose first token is already taken are
    ``dropped``.
    """
    from kvroute.metrics.utilization import normalize_answer
    from kvroute.tasks.prompt import answer_ids

    gold = IDK if instance.unanswerable else instance.answers[0]
    gold_seq = tuple(gold_ids) if gold_ids else tuple(answer_ids(tokenizer, prompt, gold))
    golds = {normalize_answer(a) for a in instance.answers}
    texts, ids, dropped = [gold], [gold_seq[0]], []
    seq_texts, seqs = [gold], [gold_seq]
    for d in dict.fromkeys(instance.distractors):
        if normalize_answer(d) in golds:
            continue
        seq = tuple(answer_ids(tokenizer, prompt, d))
        if not seq:
            continue
        if seq not in seqs:
            seq_texts.append(d)
            seqs.append(seq)
        if seq[0] in ids:
            dropped.append(d)
        else:
            texts.append(d)
            ids.append(seq[0])
    return LensCandidates(tuple(texts), tuple(ids), tuple(dropped), tuple(seq_texts), tuple(seqs))


def hidden_cosine(h: torch.Tensor, h_full: torch.Tensor) -> list[float]:
    """Per-layer cosine of ``[L + 1, d]`` hidden states (embeddings row dropped: it never changes)."""
    return torch.nn.functional.cosine_similarity(h[1:].float(), h_full[1:].float(), dim=-1).tolist()


def identity_credit(scores: Sequence[float]) -> float:
    """Credit of an argmax guess that the first entry (the gold) is the answer: 1/k if it ties k-way for the top."""
    top = max(scores)
    tied = [i for i, s in enumerate(scores) if s == top]
    return 1.0 / len(tied) if 0 in tied else 0.0


LENS_FIELDS = ("lens_gold_logprob", "lens_gold_rank", "lens_gold_logprob_final", "lens_gold_rank_final",
               "lens_gold_logprob_delta", "lens_top1_layer", "lens_candidates", "lens_n_candidates",
               "lens_candidates_dropped", "lens_identity_top1", "lens_candidates_seq", "lens_seq_n_candidates",
               "lens_seq_identity_top1", "lens_gold_seq_logprob_final")


def lens_fields(ctx: CellContext) -> dict[str, Any]:
    """The logit-lens fields of one cell (all None when the engine recorded no lens)."""
    out: dict[str, Any] = dict.fromkeys(LENS_FIELDS)
    lp, rank, cands = ctx.output.lens_logprob, ctx.output.lens_rank, ctx.candidates
    if lp is None or rank is None or cands is None:
        return out
    lp, rank = lp.float(), rank.long()  # [L, n]: columns follow cands.ids, the gold first
    gold_lp, gold_rank = lp[:, 0], rank[:, 0]
    top1 = (gold_rank == 0).nonzero().flatten()
    full_lp = ctx.full.lens_logprob if ctx.full is not None else None
    n = len(cands.ids)
    out.update({
        "lens_gold_logprob": gold_lp.tolist(), "lens_gold_rank": gold_rank.float().tolist(),
        "lens_gold_logprob_final": float(gold_lp[-1]), "lens_gold_rank_final": int(gold_rank[-1]),
        "lens_gold_logprob_delta": float(gold_lp[-1] - full_lp[-1, 0]) if full_lp is not None else None,
        "lens_top1_layer": int(top1[0]) + 1 if len(top1) else None,
        "lens_candidates": lp.T.tolist(), "lens_n_candidates": n, "lens_candidates_dropped": len(cands.dropped),
        "lens_identity_top1": identity_credit(lp[-1].tolist()) if n >= 2 else None,
    })
    seq = ctx.output.lens_seq_logprob  # [L, S]: columns follow cands.seqs, the gold first
    if seq is not None and cands.seqs:
        seq = seq.float()
        out.update({"lens_candidates_seq": seq.T.tolist(), "lens_seq_n_candidates": len(cands.seqs),
                    "lens_seq_identity_top1": identity_credit(seq[-1].tolist()) if len(cands.seqs) >= 2 else None,
                    "lens_gold_seq_logprob_final": float(seq[-1, 0])})
    return out


@register
class Representation(Metric):
    name = "representation"
    needs = frozenset({"hidden", "lens"})
    fields = ("hidden_cosine", "hidden_cosine_last", "probe_features", "probe_layer", *LENS_FIELDS)

    def compute(self, ctx: CellContext) -> dict[str, Any]:
        h, f = ctx.output.hidden, ctx.full.hidden  # [L + 1, d]
        cos = hidden_cosine(h, f)
        L = h.shape[0] - 1
        layer = max(1, min(L, round(ctx.settings.probe_layer * L)))
        return {"hidden_cosine": cos, "hidden_cosine_last": cos[-1],
                "probe_features": h[layer].half().float().tolist(), "probe_layer": layer, **lens_fields(ctx)}
