"""The masked attention function: per-KV-head keep masks over a shared context cache.

Registered in transformers' attention-function registry under ``kvroute_masked`` only inside
:func:`masked_attention`, which also switches the model's config to it and restores everything in
``finally``. For each layer it computes, for a batch of B cells,

    softmax([q·K_ctxᵀ masked by keep[cell, kv_head], q·K_sufᵀ causal]) · [V_ctx; V_suf]

with the context K/V ``[1, Hkv, T, D]`` shared by all cells: queries of all cells are folded into
the row dimension of one batched matmul per KV head, so the context is never copied per cell.
Query heads of a GQA group share their KV head's mask (query head h ↔ KV head h // G). Which form computes a forward
is one backend's (:mod:`kvroute.engine.attention.backend`), chosen per forward by :func:`choose`.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from kvroute.engine.attention.backend import AUTO, BACKENDS, AttentionCall, Backend, record
from kvroute.engine.attention.capture import deliver
from kvroute.engine.attention.context import MaskedContext
from kvroute.engine.attention.gather import gather_limit, gathered_bytes
from kvroute.errors import EngineError

IMPLEMENTATION = "kvroute_masked"
_state = threading.local()


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
    own = None if ctx.suffix_keep is None else ctx.suffix_keep[:, : key.shape[2]]  # [B, s]
    call = AttentionCall(ctx, layer, qg, k_ctx, v_ctx, key, value, q, scale, own)
    backend = choose(call)
    record(backend.name)
    if backend.captures or not call.captured:
        out = backend.forward(call)  # [Hkv, B, G·q, D]
    else:  # the captures on their own, beside the backend (the other queries' rows are never materialised)
        out, lse = backend.attend(call) if ctx.on_masses is not None else (backend.forward(call), None)
        for i in call.captured:
            deliver(call, i, lse=lse)
    # [Hkv, B, G·q, D] -> [B, Hkv, G, q, D] -> [B, q, H, D]
    return out.transpose(0, 1).reshape(B, Hkv, G, q, D).reshape(B, H, q, D).transpose(1, 2).contiguous(), None


def choose(call: AttentionCall) -> Backend:
    """The backend of one forward: the one the setting names where it serves the call, else the ``auto`` rule, in
    this order:

    1. ``gathered`` where the forward has at least ``gather_from`` queries per cell (the question forward) and one
       query row of one cell over the whole context fits the gathered slice's limit; else ``chunked`` where the
       memory planner set a context chunk smaller than the context;
    2. ``kept`` in place of either, or of a one-shot forward, where the kernel serves the call (a CPU with AVX-512,
       float32, a head size it was built for, at most ``KEPT_MAX_ROWS`` rows per pair);
    3. otherwise one shot: ``fused`` where PyTorch's fused CPU kernel serves it and the context is not empty, else
       ``reference``.

    A forward's captures are computed beside the backend (:func:`kvroute.engine.attention.capture.deliver`): the
    whole rows of the queries captured (the question forward's last) and tracked masses from the backend's
    log-sum-exp. Only a one-shot forward that captures the whole row of every query it has (a decode step's rows for
    the argmax or ``keep_generated_rows``) keeps to ``reference`` in steps 2 and 3: its own softmax is those rows,
    which beside a fast backend would be computed a second time.
    """
    ctx = call.ctx
    if ctx.backend.name != AUTO:
        named = BACKENDS.get(ctx.backend.name)
        if named.serves(call):
            return named
    T = call.T
    gather = ctx.gather_from is not None and call.q >= ctx.gather_from and (
        gathered_bytes(1, call.qg.shape[1], 1, T, call.key.shape[2], call.qg.shape[3], call.k_ctx.element_size())
        <= gather_limit(ctx.budget))
    chunked = not gather and ctx.context_chunk is not None and ctx.context_chunk < T
    every_row = ctx.on_probs is not None and len(call.captured) == call.q  # each query's whole row is captured
    kept = BACKENDS.get("kept")
    if (gather or chunked or not every_row) and kept.serves(call):
        return kept
    if gather or chunked:
        return BACKENDS.get("gathered" if gather else "chunked")
    fused = BACKENDS.get("fused")
    if T and not every_row and fused.serves(call):
        return fused
    return BACKENDS.get("reference")


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
