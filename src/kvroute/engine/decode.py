"""Batched greedy decoding of many cells against one shared, masked context cache.

For a batch of B cells (KeepMasks) of one prompt: one forward of the question tokens (plus the
gold answer, teacher-forced, when asked) for all cells at once, then one forward per generated
token, each cell stopping at EOS or ``max_new_tokens``. Finished cells leave the batch. Only the
cells' own suffix K/V are per cell; the context K/V come from the prefill and are shared.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import nn

from kvroute import heap
from kvroute.config import DEFAULT_MAX_NEW_TOKENS, check_max_new_tokens
from kvroute.engine.attention import MaskedContext, check_backend_name, masked_attention, resolve_backend, streaming
from kvroute.engine.attention.gather import GATHER_MIN_QUERIES
from kvroute.engine.attention.streaming import ATTENTION_SHARE, context_chunk
from kvroute.engine.cache import SuffixCache
from kvroute.engine.linear import onednn_linear
from kvroute.engine.observers import Observers, positions
from kvroute.engine.plan import MemoryShape, plan_batch
from kvroute.engine.prefill import PrefillResult
from kvroute.errors import EngineError
from kvroute.presses.keepmask import KeepMask

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DecodeSettings:
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    batch_size: int | None = None  # cells per decoding batch; None: as many as the free memory takes (engine.plan)
    capture: bool = True  # last-prompt-token attention rows and hidden states, generated-token masses
    keep_generated_rows: bool = False  # also keep each generated token's full attention rows (float16)
    keep_logits: bool = False  # keep the question forward's logits (for equivalence checks)
    # each generated token's argmax context position per layer and query head (the retrieval-head criterion)
    argmax: bool = False
    # verify a given draft answer in one forward (decode_cells' ``draft``) before stepping; off by default: on the
    # benchmarks so far it costs more than it saves (docs/performance.md, "Draft verification")
    draft: bool = False
    # bytes the masked attention's transient tensors may take per forward; None: a quarter of the free memory
    # (device memory on CUDA, RAM on the CPU). Past it, the context is attended in chunks
    # (kvroute.engine.attention.streaming)
    attention_memory: int | None = None
    # forwards with at least GATHER_MIN_QUERIES queries per cell (the question, a long draft) attend each cell's kept
    # context entries only (kvroute.engine.attention.gather), equal to float32 rounding; False: all T entries, masked
    gather: bool = True
    # the masked attention's backend (kvroute.engine.attention.backend): "auto" (its rule) or a backend's name
    attention_backend: str = "auto"

    def __post_init__(self) -> None:
        check_backend_name(self.attention_backend)  # an unknown name fails with the closest ones
        check_max_new_tokens(self.max_new_tokens)
        if self.batch_size is not None and self.batch_size < 1:
            raise EngineError(f"batch_size must be ≥ 1, got {self.batch_size}")
        if self.attention_memory is not None and self.attention_memory < 1:
            raise EngineError(f"attention_memory must be a positive number of bytes, got {self.attention_memory}")


@dataclass
class CellOutput:
    """What one cell produced. Shapes: L layers, H query heads, T context, Q question tokens."""

    tokens: list[int]  # generated ids, including the stopping EOS when there was one
    text: str  # decoded with special tokens skipped (as kvpress), not stripped
    gold_logprob: float | None = None  # teacher-forced log p(gold | prompt) under this cell's mask
    last_attention: torch.Tensor | None = None  # [L, H, T + Q] float32: rows of the last prompt token
    hidden: torch.Tensor | None = None  # [L + 1, hidden]: last prompt token's hidden states (embeddings first)
    generated_mass: dict[str, torch.Tensor] = field(default_factory=dict)  # name -> [steps, L, H]
    generated_rows: list[torch.Tensor] | None = None  # per step [L, H, T + Q + step] float16
    # per generated token fed back (all but the last): the context position each layer's query heads attend to most
    generated_argmax: torch.Tensor | None = None  # [steps, L, H] int64 (DecodeSettings.argmax)
    logits: torch.Tensor | None = None  # [G + 1, V]: logits at prompt positions Q-1 … Q+G-1 (keep_logits)
    # logit lens at the last prompt token, layers 1 … L (final norm + unembedding; the last layer is the
    # model's own logits), one column per requested ``lens_ids`` token: log-prob, and rank (0 = top-1)
    lens_logprob: torch.Tensor | None = None  # [L, n_ids] float32
    lens_rank: torch.Tensor | None = None  # [L, n_ids] int64
    # the whole of each requested ``lens_seqs`` token sequence, teacher-forced after the prompt: per layer,
    # the sum over its tokens of the lens log-prob of each token at the position before it (the last
    # layer: the model's own log-likelihood of the sequence under this cell's mask)
    lens_seq_logprob: torch.Tensor | None = None  # [L, n_seqs] float32


def stop_ids(model: nn.Module, tokenizer: Any) -> set[int]:
    """The tokens that end an answer, everywhere kvroute decodes (as kvpress's pipeline uses them): the
    generation config's EOS, else the tokenizer's."""
    generation_config: Any = model.generation_config
    eos = generation_config.eos_token_id
    if eos is None and tokenizer is not None:
        eos = getattr(tokenizer, "eos_token_id", None)
    if eos is None:
        return set()
    return set(eos if isinstance(eos, list) else [eos])


def _final_norm(model: nn.Module) -> nn.Module:
    """The decoder's final norm (applied before the unembedding), for the logit lens."""
    get_decoder: Any = getattr(model, "get_decoder", None)
    base: Any = get_decoder() if callable(get_decoder) else getattr(model, "model", None)
    for owner in (base, getattr(base, "language_model", None), getattr(model, "model", None)):
        norm = getattr(owner, "norm", None) if owner is not None else None
        if isinstance(norm, nn.Module):
            return norm
    raise EngineError(f"cannot find the final norm of {type(model).__name__} (looked for .model.norm); "
                      "the logit lens needs it — drop the 'lens' metric for this model")


def _lens_head(model: nn.Module) -> tuple[nn.Module, nn.Module, float | None]:
    """The logit lens's pieces: the final norm, the unembedding and the final logit soft-cap (None without one)."""
    get_head: Any = getattr(model, "get_output_embeddings", None)
    norm, head = _final_norm(model), get_head() if callable(get_head) else None
    if head is None:
        raise EngineError(f"{type(model).__name__} has no output embeddings; the logit lens needs the unembedding")
    config: Any = model.config
    return norm, head, getattr(getattr(config, "text_config", config), "final_logit_softcapping", None)


#: logits held at once by the lens (rows × vocabulary, float32; the projection and its log-softmax: 2 × 128 MiB); rows
#: of every layer share a chunk, so the unembedding's weights are read once per chunk rather than once per layer
LENS_CHUNK = 2**25


def _lens_pass(model: nn.Module, hidden: Sequence[torch.Tensor], final_logits: torch.Tensor, cols: torch.Tensor,
               ranked: int = 0, chunk: int = LENS_CHUNK) -> tuple[torch.Tensor, torch.Tensor]:
    """The logit lens of N positions at every layer: log-probs ``[N, L, n]`` of the token ids ``cols [N, n]`` and
    ranks ``[N, L, ranked]`` (int64) of the first ``ranked`` of them.

    ``hidden``: L + 1 entries of ``[N, d]`` (embeddings first; as in transformers the last is already normed),
    ``final_logits [N, V]``: the model's own logits there, used for layer L. Layer ℓ < L: log-softmax of
    ``unembed(final_norm(h_ℓ))`` over the vocabulary, final logit soft-capping applied where the config has one.
    A rank counts the vocabulary entries strictly more likely (0 = top-1). The rows of all layers below L go through
    the unembedding together, in chunks of about ``chunk`` logits, so that its weights (V × d, the largest matrix of
    a small model) are read once per chunk rather than once per layer.
    """
    norm, head, cap = _lens_head(model)
    N, V = final_logits.shape
    L, n = len(hidden) - 1, cols.shape[-1]
    lp = torch.empty(N, L, n, dtype=torch.float32, device=final_logits.device)
    rank = torch.empty(N, L, ranked, dtype=torch.long, device=final_logits.device)
    step = max(1, chunk // max(V, 1))

    def score(logits: torch.Tensor, c: torch.Tensor, scratch: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logp = torch.log_softmax(logits, dim=-1)
        chosen = logp.gather(-1, c)  # [rows, n]
        # a float 0/1 comparison summed: several times faster than summing a boolean tensor, and exact below 2**24
        counts = [torch.gt(logp, chosen[:, j : j + 1], out=scratch).sum(-1) for j in range(ranked)]
        return chosen, (torch.stack(counts, -1).long() if counts else chosen.new_empty(len(c), 0, dtype=torch.long))

    if L > 1:  # layers 1 … L-1: rows (position i, layer ℓ) at i·(L-1) + ℓ-1
        inner = torch.stack(list(hidden[1:L]), dim=1).flatten(0, 1)  # [N·(L-1), d]
        inner_cols = cols.repeat_interleave(L - 1, dim=0)
        out_lp, out_rank = [], []
        for a in range(0, inner.shape[0], step):
            logits = head(norm(inner[a : a + step])).float()
            if cap:
                logits = torch.tanh(logits / cap) * cap
            chosen, r = score(logits, inner_cols[a : a + step], logits)  # the projection is free once soft-maxed
            out_lp.append(chosen)
            out_rank.append(r)
        lp[:, : L - 1] = torch.cat(out_lp).view(N, L - 1, n)
        rank[:, : L - 1] = torch.cat(out_rank).view(N, L - 1, ranked)
    for a in range(0, N, step):  # layer L: the model's own logits (not to be overwritten)
        logits = final_logits[a : a + step].float()
        chosen, r = score(logits, cols[a : a + step], torch.empty_like(logits))
        lp[a : a + step, L - 1], rank[a : a + step, L - 1] = chosen, r
    return lp, rank


def logit_lens(model: nn.Module, hidden: Sequence[torch.Tensor], final_logits: torch.Tensor,
               ids: Sequence[int], ranked: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-prob and rank of each of ``ids`` under the logit lens of every layer, at one position.

    ``hidden``: the model's ``hidden_states`` (embeddings first, L + 1 entries of ``[B, d]``; as in
    transformers, the last entry is already normed); ``final_logits`` ``[B, V]``: the model's own
    logits there (used for layer L, so the lens's last layer is exactly the model's next-token
    distribution). Layer ℓ < L: log-softmax of ``unembed(final_norm(h_ℓ))`` over the full vocabulary
    (final logit soft-capping applied when the config has one). Returns ``[B, L, n]`` float32 log-probs
    and ``[B, L, ranked]`` int64 ranks of the first ``ranked`` ids (all of them by default; number of
    vocabulary entries strictly more likely; 0 = top-1).
    """
    B = final_logits.shape[0]
    cols = torch.as_tensor(list(ids), dtype=torch.long, device=final_logits.device).expand(B, -1)
    return _lens_pass(model, hidden, final_logits, cols, len(ids) if ranked is None else ranked)


def _lens_targets(model: nn.Module, hidden: Sequence[torch.Tensor], final_logits: torch.Tensor,
                  targets: torch.Tensor) -> torch.Tensor:
    """Lens log-prob of ``targets [N]`` at N positions, every layer: ``[N, L]`` float32.

    ``hidden``: L + 1 entries of ``[N, d]`` (embeddings first, the last already normed), ``final_logits``
    ``[N, V]``: the model's own logits there.
    """
    return _lens_pass(model, hidden, final_logits, targets.view(-1, 1))[0][:, :, 0]


def _sequence_lens(model: nn.Module, cache: SuffixCache, ctx: MaskedContext, question_len: int,
                   first: torch.Tensor, seqs: list[list[int]]) -> torch.Tensor:
    """Per cell, per layer, the lens log-likelihood of each of ``seqs`` teacher-forced after the question.

    ``cache`` holds the question's suffix K/V of the B cells (its first ``question_len`` entries are
    used, nothing is written to it) and ``ctx`` their masks; ``first [B, L, S]``: the lens log-prob
    of each sequence's first token at the last prompt token (read from the question forward). The
    rest of each sequence is fed in one forward of B·S rows, each row a copy of its cell's suffix
    cache and mask (the shared context is not copied), right-padded (causal, so padding changes
    nothing before it). Returns ``[B, L, S]``.
    """
    B, L, S = first.shape
    M = max(len(s) for s in seqs) - 1
    if M == 0:
        return first
    device = first.device
    rows = torch.arange(B, device=device).repeat_interleave(S)  # row b·S + j: cell b, sequence j
    sub = SuffixCache(L, B * S, cache.k[0].shape[1], cache.k[0].shape[3], question_len + M, cache.context_len,
                      cache.k[0].dtype, device)
    for layer in range(L):
        sub.k[layer][:, :, :question_len] = cache.k[layer][:, :, :question_len].index_select(0, rows)
        sub.v[layer][:, :, :question_len] = cache.v[layer][:, :, :question_len].index_select(0, rows)
    sub.lens = [question_len] * L
    inputs = torch.tensor([(s[:-1] + [s[-1]] * M)[:M] for s in seqs], device=device)  # [S, M]
    targets = torch.tensor([(s[1:] + [s[-1]] * M)[:M] for s in seqs], device=device)  # [S, M]
    valid = torch.tensor([[j < len(s) - 1 for j in range(M)] for s in seqs], device=device)  # [S, M]
    pos = torch.arange(cache.context_len + question_len, cache.context_len + question_len + M, device=device)
    with ctx.rows_of(rows):
        res = model(input_ids=inputs.repeat(B, 1), past_key_values=sub, position_ids=pos.unsqueeze(0).expand(B * S, -1),
                    cache_position=pos, use_cache=True, output_hidden_states=True)
    sel = valid.repeat(B, 1)  # [B·S, M]
    lp = _lens_targets(model, [h[sel] for h in res.hidden_states], res.logits[sel], targets.repeat(B, 1)[sel])
    total = torch.zeros(B * S, L, dtype=torch.float32, device=device)
    total.index_add_(0, sel.nonzero()[:, 0], lp)  # sum over each row's positions
    return first + total.view(B, S, L).transpose(1, 2)


def draft_feed(draft: Sequence[int], stop: set[int], max_new_tokens: int) -> list[int]:
    """The draft tokens worth feeding: a last stop token is not (a cell that reaches it stops), nor anything past
    the ``max_new_tokens - 1``-th (the answer ends there)."""
    feed = list(draft)
    if feed and feed[-1] in stop:
        feed.pop()
    return feed[: max(max_new_tokens - 1, 0)]


def _verify_draft(model: nn.Module, cache: SuffixCache, feed: list[int], first: torch.Tensor, T: int,
                  Q: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One forward of the draft tokens ``feed`` (k of them) after the question for every cell of the batch.

    ``first [B]``: each cell's first generated token. The logits after draft token j are the cell's greedy
    choice for generated token j + 1 as long as the cell generated draft tokens 0 … j itself; so a cell that
    agrees with the first ``a`` draft tokens has its tokens 0 … a decided (the last one its first disagreement,
    or the token after the whole draft). Returns ``pending [B, k + 1]`` (those tokens, -1 after them),
    ``agree [B]`` (a: the decided tokens already fed, their K/V in the cache) and ``suffix_keep [B, capacity]``
    (False on the slots of draft tokens the cell did not generate, which later steps must not see).
    """
    B, k, device = first.shape[0], len(feed), first.device
    d = torch.tensor(feed, device=device)
    pos = torch.arange(T + Q, T + Q + k, device=device)
    res = model(input_ids=d.view(1, k).expand(B, -1), past_key_values=cache,
                position_ids=pos.unsqueeze(0).expand(B, -1), cache_position=pos, use_cache=True, logits_to_keep=k)
    seq = torch.cat([first.view(B, 1), res.logits.argmax(-1)], dim=1)  # [B, k + 1]
    agree = (seq[:, :k] == d).long().cumprod(1).sum(1)  # [B]
    pending = seq.masked_fill(torch.arange(k + 1, device=device)[None] > agree[:, None], -1)
    slots = torch.arange(cache.capacity, device=device)[None]
    rejected = (slots >= Q + agree[:, None]) & (slots < Q + k)
    return pending, agree, ~rejected


def _emit(results: list[CellOutput], rows: torch.Tensor, pending: torch.Tensor, stop: set[int],
          max_new_tokens: int) -> torch.Tensor:
    """Append each active row's pending tokens (``[b, n]``, -1 padded) to its cell, up to a stop token or
    ``max_new_tokens``; returns which rows are finished (``[b]`` bool)."""
    done = []
    for j, r in enumerate(rows.tolist()):
        out, finished = results[r].tokens, False
        for t in pending[j].tolist():
            if t < 0:
                break
            out.append(t)
            if t in stop or len(out) >= max_new_tokens:
                finished = True
                break
        done.append(finished)
    return torch.tensor(done, dtype=torch.bool, device=pending.device)


@torch.inference_mode()
def decode_cells(model: nn.Module, tokenizer: Any, pre: PrefillResult, question_ids: Sequence[int],
                 masks: Sequence[KeepMask], *, gold_ids: Sequence[int] | None = None,
                 track: Mapping[str, Sequence[int]] | None = None, lens_ids: Sequence[int] | None = None,
                 lens_seqs: Sequence[Sequence[int]] | None = None, draft: Sequence[int] | None = None,
                 settings: DecodeSettings = DecodeSettings()) -> list[CellOutput]:
    """Decode every mask in ``masks`` (batched by ``settings.batch_size``); results in the same order.

    ``tokenizer`` (a transformers tokenizer, or None for no text) decodes the generated tokens.
    ``lens_ids``: token ids whose logit-lens log-prob and rank at the last prompt token are
    recorded per layer (``CellOutput.lens_logprob`` / ``lens_rank``; see :func:`logit_lens`).
    ``lens_seqs``: token sequences (non-empty) whose whole-sequence lens log-likelihood after the
    prompt is recorded per layer (``CellOutput.lens_seq_logprob``; one extra forward of the
    sequences' tokens, every sequence for every cell).
    ``draft``: a likely answer (the full cache's greedy tokens), verified for all cells of a batch in one
    forward (:func:`_verify_draft`); each cell then decodes step by step only from its first disagreement.
    The tokens are those of plain greedy decoding; ignored when ``settings.draft`` is False or with
    ``keep_generated_rows``.
    """
    if len(question_ids) == 0:
        raise EngineError("the question part of the prompt is empty; the engine needs at least one suffix token")
    seqs = [list(s) for s in (lens_seqs or [])]
    if any(not s for s in seqs):
        raise EngineError("lens_seqs must be non-empty token sequences")
    device = pre.keys[0].device
    heap.release()  # what the prefill freed goes back first: the planner reads the free memory, the decode reuses
    available = streaming.available_memory(device)  # (looked up at call time: one place to read or replace it)
    settings = replace(settings, attention_memory=settings.attention_memory or int(available * ATTENTION_SHARE))
    assert settings.attention_memory is not None
    plan = plan_batch(MemoryShape.of(model), T=pre.num_tokens, q=len(question_ids) + len(gold_ids or []),
                      new=settings.max_new_tokens, cells=len(masks), available=available,
                      attention=settings.attention_memory, capture=settings.capture, tracks=len(track or {}),
                      requested=settings.batch_size)
    if settings.batch_size is not None and settings.batch_size > plan.fits:
        log.warning("batch_size %d is more cells than the free memory is planned to take (%d)", settings.batch_size,
                    plan.fits)
    out: list[CellOutput] = []
    for i in range(0, len(masks), plan.batch):
        if i:
            heap.release()  # a batch's freed blocks do not outlive it
        out.extend(_decode_batch(model, tokenizer, pre, list(question_ids), masks[i : i + plan.batch],
                                 list(gold_ids or []), track or {}, settings, list(lens_ids or []), seqs,
                                 list(draft or []) if settings.draft else None))
    return out


@dataclass
class _Batch:
    """One batch's shared state: the model, its cells' suffix cache and masked context, the capture observers
    (:mod:`kvroute.engine.observers`, built from what the metrics need) and the cells' outputs; ``T``/``Q``: the
    context and question lengths, ``budget``: the attention memory that sizes each forward's context chunk."""

    model: nn.Module
    cache: SuffixCache
    ctx: MaskedContext
    obs: Observers
    results: list[CellOutput]
    settings: DecodeSettings
    T: int
    Q: int
    H: int
    budget: int

    @property
    def B(self) -> int:
        return len(self.results)

    @property
    def device(self) -> torch.device:
        return self.ctx.keep.device

    def chunk(self, cells: int, queries: int, keys: int) -> int | None:
        """The context chunk of one forward (None: the whole context at once)."""
        return context_chunk(cells, self.H, queries, keys, self.budget)


def _decode_batch(model: nn.Module, tokenizer: Any, pre: PrefillResult, question: list[int],
                  masks: Sequence[KeepMask], gold: list[int], track: Mapping[str, Sequence[int]],
                  settings: DecodeSettings, lens_ids: list[int] | None = None,
                  lens_seqs: list[list[int]] | None = None, draft: list[int] | None = None) -> list[CellOutput]:
    """One batch of cells: the question forward (:func:`_question_forward`), the draft checked in one forward
    (:func:`_draft_forward`), then one forward per generated token (:func:`_greedy_steps`); the captures are
    the observers'."""
    device = pre.keys[0].device
    B, T, Q, G = len(masks), pre.num_tokens, len(question), len(gold)
    L = len(pre.keys)
    Hkv, D = pre.keys[0].shape[1], pre.keys[0].shape[3]
    for m in masks:
        if m.shape != (L, Hkv, T):
            raise EngineError(f"KeepMask shape {m.shape} does not match the prefill ({L}, {Hkv}, {T})")
    keep = torch.stack([m.mask.to(device) for m in masks])  # [B, L, Hkv, T]
    stop = stop_ids(model, tokenizer)
    feed = [] if settings.keep_generated_rows else draft_feed(draft or [], stop, settings.max_new_tokens)
    cache = SuffixCache(L, B, Hkv, D, Q + max(G, len(feed) + settings.max_new_tokens) + 1, T, pre.keys[0].dtype,
                        device)
    config: Any = model.config
    H: int = getattr(config, "text_config", config).num_attention_heads
    obs = Observers(B, L, H, T, Q, positions(track, device), device, new=settings.max_new_tokens,
                    capture=settings.capture, argmax=settings.argmax, keep_rows=settings.keep_generated_rows)
    budget = settings.attention_memory  # decode_cells sets it (the default: a share of the free memory)
    assert budget is not None
    ctx = MaskedContext(pre.keys, pre.values, keep, context_chunk=context_chunk(B, H, Q + G, T + Q + G, budget),
                        budget=budget, gather_from=GATHER_MIN_QUERIES if settings.gather else None,
                        backend=resolve_backend(settings.attention_backend))
    batch = _Batch(model, cache, ctx, obs, [CellOutput(tokens=[], text="") for _ in range(B)], settings, T, Q, H,
                   budget)
    obs.question(ctx)
    with masked_attention(model, ctx), onednn_linear(model):  # (the linear layers: kvroute.engine.linear)
        first = _question_forward(batch, question, gold, lens_ids or [], lens_seqs or [])
        cache.truncate(Q)
        obs.generated(ctx)  # from here on, forwards feed generated tokens back
        pending, fed = _draft_forward(batch, feed, first)
        _greedy_steps(batch, pending, fed, stop, len(feed))
    results = batch.results
    for r in results:
        r.text = tokenizer.decode(r.tokens, skip_special_tokens=True) if tokenizer is not None else ""
    obs.done(results)
    return results


def _question_forward(batch: _Batch, question: list[int], gold: list[int], lens_ids: list[int],
                      lens_seqs: list[list[int]]) -> torch.Tensor:
    """The question (and the teacher-forced gold answer) for every cell at once: the gold log-probability, the
    captures at the last prompt token, the logit lens (one pass at that token, then each sequence's own forward)
    and the logits kept when asked. Returns each cell's first generated token ``[B]``."""
    model, cache, ctx, obs, results, settings = (batch.model, batch.cache, batch.ctx, batch.obs, batch.results,
                                                 batch.settings)
    B, T, Q, G, device = batch.B, batch.T, batch.Q, len(gold), batch.device
    ids = torch.tensor([question + gold], device=device).expand(B, -1)
    pos = torch.arange(T, T + Q + G, device=device)
    res = model(input_ids=ids, past_key_values=cache, position_ids=pos.unsqueeze(0).expand(B, -1),
                cache_position=pos, use_cache=True, logits_to_keep=G + 1,
                output_hidden_states=settings.capture or bool(lens_ids) or bool(lens_seqs))
    logits = res.logits  # [B, G + 1, V]: positions Q-1 … Q+G-1
    if G:
        logp = torch.log_softmax(logits[:, :G].float(), dim=-1)  # [B, G, V]
        gold_lp = logp.gather(-1, torch.tensor(gold, device=device).view(1, G, 1).expand(B, G, 1)).sum((1, 2))
        for b in range(B):
            results[b].gold_logprob = float(gold_lp[b])
    obs.question_done(results, res.hidden_states if settings.capture else ())
    if lens_ids or lens_seqs:  # one lens pass at the last prompt token: lens_ids, then each sequence's first token
        n = len(lens_ids)
        lens_lp, lens_rank = logit_lens(model, [h[:, Q - 1] for h in res.hidden_states], logits[:, 0],
                                        [*lens_ids, *(s[0] for s in lens_seqs)], ranked=n)
        for b in range(B if lens_ids else 0):
            results[b].lens_logprob, results[b].lens_rank = lens_lp[b, :, :n], lens_rank[b]
        if lens_seqs:
            M = max(len(s) for s in lens_seqs)
            ctx.context_chunk = batch.chunk(B * len(lens_seqs), M, T + Q + M)
            seq_lp = _sequence_lens(model, cache, ctx, Q, lens_lp[:, :, n:], lens_seqs)  # [B, L, S]
            for b in range(B):
                results[b].lens_seq_logprob = seq_lp[b]
    if settings.keep_logits:
        for b in range(B):
            results[b].logits = logits[b].float().clone()
    return logits[:, 0].argmax(-1)


def _draft_forward(batch: _Batch, feed: list[int], first: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The draft (the full cache's answer) checked in one forward: per cell, its tokens up to and including its
    first disagreement with the draft (``pending [B, n]``, -1 padded; the last of them not fed yet) and how many
    generated tokens it has fed (``fed [B]``); the rejected draft slots are masked out of the cell's suffix.
    Without a draft: each cell's first token, none fed."""
    if not feed:
        return first.view(-1, 1), batch.obs.fed
    batch.obs.forward = 0
    batch.ctx.capture_query = None  # every query: the generated-token masses of each fed draft token
    batch.ctx.context_chunk = batch.chunk(batch.B, len(feed), batch.T + batch.Q + len(feed))
    pending, fed, batch.ctx.suffix_keep = _verify_draft(batch.model, batch.cache, feed, first, batch.T, batch.Q)
    return pending, fed


def _greedy_steps(batch: _Batch, pending: torch.Tensor, fed: torch.Tensor, stop: set[int], drafted: int) -> None:
    """Greedy decoding, one token per forward for the cells still going; finished cells leave the batch (their
    rows of the cache, the masks and the observers with them)."""
    model, cache, ctx, obs, results, settings = (batch.model, batch.cache, batch.ctx, batch.obs, batch.results,
                                                 batch.settings)
    T, Q, device = batch.T, batch.Q, batch.device
    rows = obs.rows  # active batch row -> cell index
    ctx.capture_query = 0  # decode steps have one query per cell
    ctx.context_chunk = batch.chunk(batch.B, 1, T + Q + drafted + settings.max_new_tokens)
    while True:
        done = _emit(results, rows, pending, stop, settings.max_new_tokens)  # [b] bool
        if bool(done.all()):
            return
        nxt = pending[torch.arange(len(rows), device=device), (pending >= 0).sum(1) - 1]  # each row's last token
        if bool(done.any()):
            alive = (~done).nonzero().flatten()
            rows, nxt, fed = rows[alive], nxt[alive], fed[alive]
            cache.keep_rows(alive)
            ctx.select(alive)
        obs.forward += 1
        obs.rows, obs.fed = rows, fed
        obs.step()
        slot = torch.full((1,), T + cache.lens[0], device=device)  # where the new K/V go (= position, no draft)
        res = model(input_ids=nxt.view(-1, 1), past_key_values=cache, position_ids=(T + Q + fed).view(-1, 1),
                    cache_position=slot, use_cache=True, logits_to_keep=1)
        fed = fed + 1
        pending = res.logits[:, -1].argmax(-1).view(-1, 1)
        obs.step_done(results)
