"""The fused backend: the whole context in PyTorch's fused CPU attention kernel (a private operator, through
:func:`kvroute.engine.private_ops.flash_attention_cpu`), which never materialises the scores and returns each row's
log-sum-exp; the cells' own suffix is joined after (:func:`kvroute.engine.attention.streaming.with_suffix`)."""

from __future__ import annotations

import torch

from kvroute.engine.attention.backend import AttentionCall, Availability, Backend, register
from kvroute.engine.attention.streaming import fused_available, fused_context, joined, suffix_scores
from kvroute.engine.private_ops import flash_attention_cpu


@register
class Fused(Backend):
    name = "fused"
    devices = ("cpu",)
    lse = True

    def available(self) -> Availability:
        if flash_attention_cpu() is None:
            return Availability(False, "this PyTorch has no checked fused CPU attention operator (see the log)")
        return Availability(True)

    def serves(self, call: AttentionCall) -> bool:
        return call.ctx.backend.fused and fused_available(call.qg) and super().serves(call)

    def forward(self, call: AttentionCall) -> torch.Tensor:
        return self.attend(call)[0]

    def attend(self, call: AttentionCall) -> tuple[torch.Tensor, torch.Tensor | None]:
        qg, k_ctx, v_ctx = call.qg, call.k_ctx, call.v_ctx
        R = qg.shape[2]
        # a KV group's query rows are the kernel's batch and the cells its rows: every row of a cell shares the cell's
        # mask, which then broadcasts ([1, Hkv, B, T]) instead of being copied per row, and the shared context is
        # expanded over the rows without a copy
        o, lse = fused_context(qg.permute(2, 1, 0, 3), k_ctx[None].expand(R, -1, -1, -1),
                               v_ctx[None].expand(R, -1, -1, -1), call.bias().to(qg.dtype).squeeze(2)[None],
                               scale=call.scale)
        s_suf = suffix_scores(qg, call.key, call.q, call.scale, call.own)  # [Hkv, B, G·q, s] float32
        return joined(o.permute(1, 2, 0, 3), lse.permute(1, 2, 0), call.ctx.context_empty(call.layer), s_suf,
                      call.value.transpose(0, 1), qg.dtype)
