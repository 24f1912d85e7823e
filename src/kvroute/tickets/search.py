"""Token-route lottery tickets: a small set of kept (layer, KV head, token) entries that still answers.

The search, for one instance (all candidate masks of a round are decoded in one batch):

1. **Importance.** Decode the instance with the full cache, keeping the attention rows of the last
   prompt token and of every generated answer token. An entry's importance is the attention mass
   those answer queries put on it, summed over the query heads of its KV group.
2. **Forward pruning.** Keep the top-k entries by importance for k on a geometric grid (N/2, N/4,
   …); then refine k between the smallest passing and the next failing size, ``batch`` sizes per
   round, for ``refine_rounds`` rounds.
3. **Backward pass.** Split the ticket's entries, least important first, into groups; try removing
   each group (all in one batch); remove every group whose removal alone kept the answer; if the
   combined mask fails, add groups back (most important first) until it passes again. Repeat with
   halved groups while the evaluation budget lasts.

"Passes" means the greedy answer is classified ``correct`` against the gold answers
(``target="gold"``) or reproduces the full cache's answer tokens exactly (``target="full"``).
Every ticket returned has been decoded and passed; its size is reported as a share of the
``L · Hkv · T`` context entries (the entries a press's ratio refers to), and separately with the
``L · Hkv · Q`` entries of the question suffix, which every cell keeps whole (they are appended
after compression), so the full footprint of the ticket is never understated.

The prompt is built exactly as the sweep builds it: pass the sweep's ``system_prompt`` and
``answer_prefix`` (``kvroute ticket --out RUN_DIR`` reads them from the run's manifest), or the
ticket answers a different prompt than the cells it is compared with.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from kvroute import heap
from kvroute.config import DEFAULT_MAX_NEW_TOKENS, check_max_new_tokens
from kvroute.engine.decode import CellOutput, DecodeSettings, decode_cells
from kvroute.engine.prefill import prefill
from kvroute.errors import ConfigError, EngineError
from kvroute.metrics.hallucination import classify
from kvroute.presses.keepmask import KeepMask
from kvroute.progress import SILENT, Progress
from kvroute.tasks.prompt import build_prompt

if TYPE_CHECKING:
    from kvroute.models.loading import LoadedModel
    from kvroute.tasks.instance import TaskInstance

log = logging.getLogger(__name__)
TARGETS = ("gold", "full")


@dataclass(frozen=True)
class TicketSettings:
    target: str = "gold"
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    batch: int = 16  # candidate masks decoded per batch
    refine_rounds: int = 3
    groups: int = 16  # backward-pass groups in the first round
    max_evaluations: int = 400

    def __post_init__(self) -> None:
        if self.target not in TARGETS:
            raise ConfigError(f"ticket target must be one of {', '.join(TARGETS)}, got {self.target!r}")
        check_max_new_tokens(self.max_new_tokens, "ticket max_new_tokens")
        for name in ("batch", "groups", "max_evaluations"):
            if getattr(self, name) < 1:
                raise ConfigError(f"ticket {name} must be ≥ 1, got {getattr(self, name)}")


@dataclass
class Ticket:
    instance_id: str
    mask: KeepMask  # the ticket: bool [L, Hkv, T]
    answer: str
    full_answer: str
    evaluations: int
    evidence: list[int]  # context positions of the evidence tokens
    answer_positions: list[int]
    history: list[tuple[int, bool]] = field(default_factory=list)  # (entries kept, passed) for every decode
    question_tokens: int = 0  # Q: the suffix appended after compression, kept whole by every head
    regime: str = "agnostic"
    answer_prefix: str = ""
    system_prompt: str | None = None

    @property
    def size(self) -> int:
        return int(self.mask.mask.sum())

    @property
    def fraction(self) -> float:
        return self.size / self.mask.mask.numel()

    @property
    def question_entries(self) -> int:
        """``L · Hkv · Q``: the question suffix's entries, kept in every cell (not part of the search)."""
        L, Hkv, _ = self.mask.shape
        return L * Hkv * self.question_tokens

    @property
    def fraction_with_question(self) -> float:
        """Share of all cache entries (context and question suffix) the ticket keeps, the suffix included."""
        return (self.size + self.question_entries) / (self.mask.mask.numel() + self.question_entries)

    def heads_per_token(self, positions: list[int]) -> list[int]:
        """For each position, how many (layer, KV head) pairs keep it in the ticket."""
        return [int(self.mask.mask[:, :, p].sum()) for p in positions]

    def summary(self) -> dict[str, Any]:
        L, Hkv, T = self.mask.shape
        ev_heads = self.heads_per_token(self.evidence)
        return {
            "instance_id": self.instance_id, "entries": self.size, "total_entries": L * Hkv * T,
            "fraction": self.fraction, "tokens_kept": int(self.mask.mask.any(0).any(0).sum()), "context_tokens": T,
            "question_tokens": self.question_tokens, "question_entries": self.question_entries,
            "fraction_with_question": self.fraction_with_question, "regime": self.regime,
            "answer_prefix": self.answer_prefix, "system_prompt": self.system_prompt,
            "answer": self.answer, "full_answer": self.full_answer, "evaluations": self.evaluations,
            "evidence_heads_per_token": ev_heads,
            "evidence_tokens_in_ticket": sum(1 for k in ev_heads if k > 0), "evidence_tokens": len(ev_heads),
            "answer_heads_per_token": self.heads_per_token(self.answer_positions),
        }


def importance(full: CellOutput, T: int, group_size: int) -> torch.Tensor:
    """``[L, Hkv, T]`` attention mass from the answer's queries (last prompt token + generated tokens)."""
    if full.last_attention is None:
        raise EngineError("importance needs the full cache's attention rows (decode with capture=True)")
    rows = [full.last_attention[..., :T]]  # [L, H, T]
    rows += [r[..., :T].float() for r in (full.generated_rows or [])]
    a = torch.stack(rows).sum(0)  # [L, H, T]
    L, H, _ = a.shape
    return a.view(L, H // group_size, group_size, T).sum(2)  # [L, Hkv, T]: query head h -> KV head h // G


# complexity: the search's phases (baseline, bisection, pruning, verification) share the candidate mask and its tally
@heap.retaining(lambda lm: lm.device)  # its many forwards reuse freed memory in place (kvroute.heap)
def find_ticket(lm: LoadedModel, instance: TaskInstance, *, regime: str = "agnostic",  # noqa: C901
                settings: TicketSettings = TicketSettings(),
                system_prompt: str | None = None, answer_prefix: str = "", progress: Progress = SILENT) -> Ticket:
    """Search a token-route lottery ticket for ``instance`` on ``lm`` (see the module docstring).

    ``system_prompt`` and ``answer_prefix`` build the prompt as a sweep with those decoding
    settings does; use the sweep's own when the ticket is compared with its cliffs.
    """
    prompt = build_prompt(lm.tokenizer, instance, regime=regime, system_prompt=system_prompt,
                          answer_prefix=answer_prefix)
    T = prompt.n_context
    pre = prefill(lm.model, prompt.context_ids)
    L, Hkv = len(pre.keys), pre.keys[0].shape[1]
    G = lm.info.group_size
    ds = DecodeSettings(max_new_tokens=settings.max_new_tokens, batch_size=settings.batch, capture=False)
    full_mask = KeepMask.full(L, Hkv, T, pre.keys[0].device)
    full = decode_cells(lm.model, lm.tokenizer, pre, prompt.question_ids, [full_mask],
                        settings=DecodeSettings(max_new_tokens=settings.max_new_tokens, keep_generated_rows=True))[0]

    def passes(out: CellOutput) -> bool:
        if settings.target == "full":
            return out.tokens == full.tokens
        return classify(out.text.strip(), instance.answers, instance.distractors,
                        unanswerable=instance.unanswerable) == "correct"

    if not passes(full):
        raise EngineError(f"instance {instance.id}: the full cache's answer {full.text.strip()!r} does not pass "
                          f"target {settings.target!r}; a ticket needs a correct uncompressed answer")
    imp = importance(full, T, G).flatten()
    order = torch.argsort(imp, descending=True, stable=True)  # entries, most important first
    N = imp.numel()
    history: list[tuple[int, bool]] = []

    def from_entries(idx: torch.Tensor) -> KeepMask:
        m = torch.zeros(N, dtype=torch.bool, device=order.device)
        m[idx] = True
        return KeepMask(m.view(L, Hkv, T), "ticket", 1.0 - len(idx) / N)

    def evaluate(masks: list[KeepMask]) -> list[bool]:
        outs = decode_cells(lm.model, lm.tokenizer, pre, prompt.question_ids, masks, settings=ds)
        ok = [passes(o) for o in outs]
        history.extend((int(m.mask.sum()), p) for m, p in zip(masks, ok, strict=True))
        return ok

    def left() -> int:  # evaluations still allowed; max_evaluations is a hard cap
        return settings.max_evaluations - len(history)

    with progress.task(f"ticket search for {instance.id}", total=settings.max_evaluations) as bar:
        def run(masks: list[KeepMask]) -> list[bool]:
            ok = evaluate(masks)
            bar.advance(len(masks))
            return ok

        # 2) forward pruning on a geometric grid, then refinement
        sizes: list[int] = []
        k = N // 2
        while k >= 1 and len(sizes) < min(settings.batch, left()):
            sizes.append(k)
            k //= 2
        ok = run([from_entries(order[:k]) for k in sizes])
        passing = [k for k, p in zip(sizes, ok, strict=True) if p]
        best = min(passing) if passing else N
        fail_below = max([k for k in sizes if k < best], default=0)
        for _ in range(settings.refine_rounds):
            if best - fail_below <= 1 or len(history) >= settings.max_evaluations:
                break
            step = max(1, (best - fail_below) // (settings.batch + 1))
            cand = sorted({k for k in range(fail_below + step, best, step)})[: min(settings.batch, left())]
            if not cand:
                break
            ok = run([from_entries(order[:k]) for k in cand])
            passing = [k for k, p in zip(cand, ok, strict=True) if p]
            if passing:
                best = min(passing)
            fail_below = max([k for k in cand if k < best], default=fail_below)
        rank = torch.empty_like(order)
        rank[order] = torch.arange(N, device=order.device)  # importance rank of every entry

        def by_importance(idx: torch.Tensor) -> torch.Tensor:
            return idx[torch.argsort(rank[idx])]  # most important first

        entries = order[:best]  # most important first

        # 3) backward pass: drop groups that are not needed, add back what is
        groups = settings.groups
        while groups <= len(entries) and len(history) < settings.max_evaluations:
            chunks = list(torch.tensor_split(entries.flip(0), groups))  # least important first
            chunks = [c for c in chunks if len(c)]
            keep_sets = [torch.cat([c for j, c in enumerate(chunks) if j != i]) for i in range(len(chunks))]
            removable: list[int] = []
            for s in range(0, len(keep_sets), settings.batch):
                part = [e for e in keep_sets[s : s + settings.batch] if len(e)][: left()]
                if not part:
                    break
                ok = run([from_entries(e) for e in part])
                removable += [s + i for i, p in enumerate(ok) if p]
            if removable and left() > 0:
                rest = [c for j, c in enumerate(chunks) if j not in set(removable)]
                trial = torch.cat(rest) if rest else entries[:0]
                if len(trial) and run([from_entries(trial)])[0]:
                    entries = by_importance(trial)
                else:
                    # add removed groups back, most important first, until the answer passes again
                    back = sorted(removable, reverse=True)
                    for i in range(len(back)):
                        if left() <= 0:
                            break
                        with_back = torch.cat(rest + [chunks[j] for j in back[: i + 1]])
                        if run([from_entries(with_back)])[0]:
                            entries = by_importance(with_back)
                            break
            groups *= 2

    ticket = from_entries(entries)
    final = decode_cells(lm.model, lm.tokenizer, pre, prompt.question_ids, [ticket], settings=ds)[0]
    if not passes(final):  # pragma: no cover - every accepted mask was decoded and passed
        raise EngineError("internal error: the ticket does not reproduce a passing answer")
    ev = [p for p in prompt.evidence_positions if p < T]
    ans = [p for p in prompt.answer_positions if p < T]
    return Ticket(instance.id, ticket, final.text.strip(), full.text.strip(), len(history) + 1, ev, ans, history,
                  question_tokens=len(prompt.question_ids), regime=regime, answer_prefix=prompt.answer_prefix,
                  system_prompt=system_prompt)

