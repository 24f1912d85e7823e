"""The chunked backend: the context a chunk at a time with a running maximum and sum (the online softmax), so that a
forward's transient memory is bounded by the chunk, which the memory planner sets
(:func:`kvroute.engine.attention.streaming.chunked_context_attention`). Public PyTorch operators only: any device."""

from __future__ import annotations

import torch

from kvroute.engine.attention.backend import AttentionCall, Backend, register
from kvroute.engine.attention.streaming import chunked_context_attention


@register
class Chunked(Backend):
    name = "chunked"

    def forward(self, call: AttentionCall) -> torch.Tensor:
        chunk = call.ctx.context_chunk or max(call.T, 1)  # named by the setting without a planned chunk: one chunk
        return chunked_context_attention(call.qg, call.k_ctx, call.v_ctx, call.bias(), call.key, call.value, q=call.q,
                                         scale=call.scale, chunk=chunk, own=call.own)  # [Hkv, B, G·q, D]
