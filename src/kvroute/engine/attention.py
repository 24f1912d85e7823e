"""The masked attention function: per-KV-head keep masks over a shared context cache.

Registered in transformers' attention-function registry under ``kvroute_masked`` only inside
:func:`masked_attention`, which also switches the model's config to it and restores everything in
``finally``. For each layer it computes, for a batch of B cells,

    softmax([q·K_ctxᵀ masked by keep[cell, kv_head], q·K_sufᵀ causal]) · [V_ctx; V_suf]

with the context K/V ``[1, Hkv, T, D]`` shared by all cells: queries of all cells are folded into
the row dimension of one batched matmul per KV head, so the context is never copied per cell.
Query heads of a GQA group share their KV head's mask (query head h ↔ KV head h // G).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from kvroute.engine.gather import GATHER_MIN_QUERIES, GATHER_SLICE_BYTES, gathered_bytes, gathered_context_attention
from kvroute.engine.kept import kept_available, kept_context, kept_index, select_index
from kvroute.engine.streaming import (
    chunked_context_attention,
    fused_available,
    fused_context,
    keep_bias,
    probability_rows,
    suffix_causal,
    suffix_scores,
    with_suffix,
)
from kvroute.errors import EngineError

IMPLEMENTATION = "kvroute_masked"
_state = threading.local()


@dataclass
class MaskedContext:
    """What the attention function needs besides its arguments, per decoding batch."""

    keys: list[torch.Tensor]  # per layer [1, Hkv, T, D]
    values: list[torch.Tensor]  # per layer [1, Hkv, T, D]
    keep: torch.Tensor  # bool [B, L, Hkv, T]
    # called with (layer_idx, rows [B, H, T + s], query index) when set: the float32 attention of query index
    # ``capture_query`` of the forward (negative counts from the end), every query head; with
    # ``capture_query=None``, once per query index of the forward, in order
    on_probs: Callable[[int, torch.Tensor, int], None] | None = None
    capture_query: int | None = -1
    # context keys per step of the chunked (online-softmax) form; None: the whole context at once
    # (see kvroute.engine.streaming: the planner sets it only where the one-shot tensors would not fit)
    context_chunk: int | None = None
    # bool [B, capacity] over the cells' suffix cache slots: False where a slot holds no token of that cell
    # (a draft token the cell rejected, see kvroute.engine.decode); None: every slot so far is the cell's
    suffix_keep: torch.Tensor | None = None
    # bytes the masked attention's transient tensors may take: the chunked form's chunk comes from it, and a gathered
    # slice takes at most this and kvroute.engine.gather.GATHER_SLICE_BYTES; None: no limit but that cap
    budget: int | None = None
    # forwards of at least this many queries per cell attend each cell's kept context entries only (gathered,
    # kvroute.engine.gather); None: every forward multiplies all T context keys (one-shot or chunked)
    gather_from: int | None = GATHER_MIN_QUERIES
    # per layer, the additive form of ``keep`` (kvroute.engine.streaming.keep_bias, two bytes an entry) and which
    # (KV head, cell) pairs keep nothing, built on first use and reused by every forward of the batch; emptied when
    # ``keep`` is replaced (see __setattr__)
    _bias: dict[int, torch.Tensor] = field(default_factory=dict, repr=False)
    _empty: dict[int, torch.Tensor] = field(default_factory=dict, repr=False)
    # per layer, the kept positions of every (KV head, cell) in the CSR form the kept-entries kernel reads
    # (kvroute.engine.kept.kept_index), built on first use like the bias
    _index: dict[int, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict, repr=False)

    def __setattr__(self, name: str, value: Any) -> None:
        super().__setattr__(name, value)
        if name == "keep":
            super().__setattr__("_bias", {})
            super().__setattr__("_empty", {})
            super().__setattr__("_index", {})

    def context_bias(self, layer: int, dtype: torch.dtype) -> torch.Tensor:
        """``[Hkv, B, 1, T]``: 0 where a cell keeps a context entry of ``layer``, −inf where not, to add to scores of
        ``dtype`` (:func:`kvroute.engine.streaming.keep_bias`; two bytes an entry, cached)."""
        bias = self._bias.get(layer)
        if bias is None:
            bias = self._bias[layer] = keep_bias(self.keep[:, layer].transpose(0, 1).unsqueeze(2), dtype)
        return bias

    def context_empty(self, layer: int) -> torch.Tensor:
        """bool ``[Hkv, B, 1]``: the (KV head, cell) pairs that keep no context entry of ``layer`` (cached)."""
        empty = self._empty.get(layer)
        if empty is None:
            empty = self._empty[layer] = ~self.keep[:, layer].transpose(0, 1).any(-1, keepdim=True)
        return empty

    def context_index(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The kept positions of every (KV head, cell) of ``layer``, as (offsets, index) (cached)."""
        index = self._index.get(layer)
        if index is None:
            index = self._index[layer] = kept_index(self.keep[:, layer].transpose(0, 1))
        return index

    def select(self, rows: torch.Tensor) -> None:
        """Keep only the cells ``rows`` (ascending: the ones still decoding), their cached masks included. Each layer's
        cached tensors are replaced one layer at a time, so the old and new caches are never both held whole."""
        cached: list[dict[int, torch.Tensor]] = [{}, {}]
        for old, new in zip((self._bias, self._empty), cached, strict=True):
            for layer in list(old):
                new[layer] = old.pop(layer).index_select(1, rows)
        heads, ascending = self.keep.shape[2], bool((rows[1:] > rows[:-1]).all())
        index: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        for layer in list(self._index) if ascending else []:
            index[layer] = select_index(*self._index.pop(layer), heads, rows)
        self.keep = self.keep.index_select(0, rows)
        self._bias, self._empty, self._index = *cached, index
        if self.suffix_keep is not None:
            self.suffix_keep = self.suffix_keep.index_select(0, rows)

    @contextlib.contextmanager
    def rows_of(self, rows: torch.Tensor) -> Iterator[None]:
        """Within the block, row i of a forward is cell ``rows[i]`` (cells may repeat) and nothing is captured;
        afterwards ``keep``, ``on_probs`` and the cached masks are as before."""
        saved = self.keep, self.on_probs, self._bias, self._empty, self._index
        self.keep, self.on_probs = self.keep.index_select(0, rows), None
        try:
            yield
        finally:
            self.keep, self.on_probs = saved[:2]
            super().__setattr__("_bias", saved[2])  # (replacing keep emptied the caches)
            super().__setattr__("_empty", saved[3])
            super().__setattr__("_index", saved[4])

    def captured(self, q: int) -> range:
        """The query indices of a forward of ``q`` queries whose attention rows ``on_probs`` receives."""
        if self.on_probs is None:
            return range(0)
        return range(q) if self.capture_query is None else range(self.capture_query % q, self.capture_query % q + 1)


def _masked_attention_forward(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                              attention_mask: torch.Tensor | None, dropout: float = 0.0,
                              scaling: float | None = None, **kwargs: Any) -> tuple[torch.Tensor, None]:
    ctx: MaskedContext | None = getattr(_state, "ctx", None)
    if ctx is None:
        raise EngineError("kvroute_masked attention was called outside masked_attention()")
    if kwargs.get("softcap") is not None:
        raise EngineError("the masked engine does not support soft-capped attention logits")
    layer: int = module.layer_idx
    B, H, q, D = query.shape  # query [B, H, q, D]; key/value: the cells' suffix [B, Hkv, s, D]
    Hkv = key.shape[1]
    G = H // Hkv
    k_ctx, v_ctx = ctx.keys[layer][0], ctx.values[layer][0]  # [Hkv, T, D]
    T = k_ctx.shape[1]
    window = kwargs.get("sliding_window")
    if window is not None and T + key.shape[2] > window:  # inside its window a sliding layer is full attention
        raise EngineError(f"layer {layer} attends through a sliding window of {window} tokens, and the context and "
                          f"answer so far ({T + key.shape[2]} tokens) pass it; the masked engine covers a context "
                          "every layer sees whole")
    scale = scaling if scaling is not None else D**-0.5

    qg = query.reshape(B, Hkv, G * q, D)  # [B, Hkv, G·q, D]: rows of one KV head's group, (g, i) order
    keep = ctx.keep[:, layer].transpose(0, 1).unsqueeze(2)  # [Hkv, B, 1, T] (the gathered form's indices)
    own = None if ctx.suffix_keep is None else ctx.suffix_keep[:, : key.shape[2]]  # [B, s]
    # a gathered slice takes at most the budget and GATHER_SLICE_BYTES; it gathers unless one query row of one cell
    # over the whole context is past that (a budget of a few MB: the chunked form runs)
    limit = GATHER_SLICE_BYTES if ctx.budget is None else min(ctx.budget, GATHER_SLICE_BYTES)
    gather = ctx.gather_from is not None and q >= ctx.gather_from and (
        gathered_bytes(1, Hkv, 1, T, key.shape[2], D, k_ctx.element_size()) <= limit)
    chunked = not gather and ctx.context_chunk is not None and ctx.context_chunk < T
    # the kept-entries kernel (kvroute.engine.kept) in place of all three forms where it runs, except a one-shot forward
    # that captures rows: it keeps computing every probability at once
    kept = T > 0 and (gather or chunked or not ctx.captured(q)) and kept_available(qg, G * q)
    if gather or chunked:  # the captured rows on their own (the other queries' rows are never materialised)
        for i in ctx.captured(q):
            assert ctx.on_probs is not None
            ctx.on_probs(layer, probability_rows(qg, k_ctx, ctx.context_bias(layer, qg.dtype), key, q=q, index=i,
                                                   scale=scale, own=own), i)
    if kept:
        offsets, index = ctx.context_index(layer)
        # context and suffix in one online softmax: [Hkv, B, G·q, D]
        out, _ = kept_context(qg, k_ctx, v_ctx, offsets, index, scale=scale, key=key, value=value, q=q, own=own)
    elif gather:
        out = gathered_context_attention(qg, k_ctx, v_ctx, keep, key, value, q=q, scale=scale, own=own,
                                         budget=limit)  # [Hkv, B, G·q, D]
    elif chunked:
        assert ctx.context_chunk is not None
        out = chunked_context_attention(qg, k_ctx, v_ctx, ctx.context_bias(layer, qg.dtype), key, value, q=q,
                                        scale=scale, chunk=ctx.context_chunk, own=own)  # [Hkv, B, G·q, D]
    else:
        out = _one_shot(ctx, layer, qg, k_ctx, v_ctx, ctx.context_bias(layer, qg.dtype), key, value, q=q, scale=scale,
                        own=own)
    # [Hkv, B, G·q, D] -> [B, Hkv, G, q, D] -> [B, q, H, D]
    return out.transpose(0, 1).reshape(B, Hkv, G, q, D).reshape(B, H, q, D).transpose(1, 2).contiguous(), None


def _one_shot(ctx: MaskedContext, layer: int, qg: torch.Tensor, k_ctx: torch.Tensor, v_ctx: torch.Tensor,
              bias: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *, q: int, scale: float,
              own: torch.Tensor | None = None) -> torch.Tensor:
    """The masked attention output ``[Hkv, B, G·q, D]`` with the whole context at once (shapes as in the caller;
    ``bias`` ``[Hkv, B, 1, T]``: the additive keep mask; ``own`` bool ``[B, s]``: the suffix slots each cell may
    see, None for all)."""
    B, Hkv, R, D = qg.shape
    G, T, s = R // q, k_ctx.shape[1], key.shape[2]
    if T and fused_available(qg) and not ctx.captured(q):  # one fused kernel, the suffix joined after
        # a KV group's query rows are the kernel's batch and the cells its rows: every row of a cell shares the cell's
        # mask, which then broadcasts ([1, Hkv, B, T]) instead of being copied per row, and the shared context is
        # expanded over the rows without a copy
        o, lse = fused_context(qg.permute(2, 1, 0, 3), k_ctx[None].expand(R, -1, -1, -1),
                               v_ctx[None].expand(R, -1, -1, -1), bias.to(qg.dtype).squeeze(2)[None], scale=scale)
        s_suf = suffix_scores(qg, key, q, scale, own)  # [Hkv, B, G·q, s] float32
        return with_suffix(o.permute(1, 2, 0, 3), lse.permute(1, 2, 0), ctx.context_empty(layer), s_suf,
                           value.transpose(0, 1), qg.dtype)
    # context part: fold cells into rows -> one bmm per KV head against the shared keys
    q_rows = qg.transpose(0, 1).reshape(Hkv, B * G * q, D)  # [Hkv, B·G·q, D]
    s_ctx = torch.bmm(q_rows, k_ctx.transpose(1, 2)).view(Hkv, B, G * q, T).mul_(scale)  # [Hkv, B, G·q, T]
    s_ctx.add_(bias)  # masked: −inf (in place on fresh tensors: the same numbers as a masked fill, no copies)
    # suffix part: each cell's own tokens, causal
    s_suf = torch.matmul(qg, key.transpose(2, 3)).transpose(0, 1) * scale  # [Hkv, B, G·q, s]
    s_suf.masked_fill_(suffix_causal(q, G, s, qg.device), float("-inf"))
    if own is not None:
        s_suf.masked_fill_(~own[None, :, None, :], float("-inf"))

    probs = torch.softmax(torch.cat([s_ctx, s_suf], dim=-1), dim=-1, dtype=torch.float32)  # [Hkv, B, G·q, T+s]
    for i in ctx.captured(q):
        assert ctx.on_probs is not None
        rows = probs[:, :, i::q, :]  # [Hkv, B, G, T+s]: rows g·q + i, i.e. query index i of each head in the group
        ctx.on_probs(layer, rows.transpose(0, 1).reshape(B, Hkv * G, T + s), i)  # query head = kv·G + g
    p = probs.to(qg.dtype)
    out = torch.bmm(p[..., :T].reshape(Hkv, B * G * q, T), v_ctx).view(Hkv, B, G * q, D)
    return out + torch.matmul(p[..., T:], value.transpose(0, 1))  # [Hkv, B, G·q, s] @ [Hkv, B, s, D]


@contextlib.contextmanager
def masked_attention(model: nn.Module, ctx: MaskedContext) -> Iterator[None]:
    """Route ``model``'s attention through the masked function for the duration of the block."""
    config: Any = model.config  # a transformers config; _attn_implementation selects the function
    previous = config._attn_implementation
    had = IMPLEMENTATION in ALL_ATTENTION_FUNCTIONS._local_mapping
    ALL_ATTENTION_FUNCTIONS[IMPLEMENTATION] = _masked_attention_forward
    _state.ctx = ctx
    config._attn_implementation = IMPLEMENTATION
    try:
        yield
    finally:
        config._attn_implementation = previous
        _state.ctx = None
        if not had:
            del ALL_ATTENTION_FUNCTIONS[IMPLEMENTATION]
