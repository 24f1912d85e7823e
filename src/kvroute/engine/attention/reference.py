"""The reference backend: explicit scores, masked, one softmax over [context; suffix]. The definition of the masked
attention, the form that hands the captures from its own softmax, and the one every other backend is tested
against."""

from __future__ import annotations

import torch

from kvroute.engine.attention.backend import AttentionCall, Backend, register
from kvroute.engine.attention.capture import deliver
from kvroute.engine.attention.streaming import suffix_causal


@register
class Reference(Backend):
    name = "reference"
    captures = True

    def forward(self, call: AttentionCall) -> torch.Tensor:
        qg, k_ctx, v_ctx, key, value, q, scale, own = (call.qg, call.k_ctx, call.v_ctx, call.key, call.value, call.q,
                                                       call.scale, call.own)
        B, Hkv, R, D = qg.shape
        G, T, s = R // q, k_ctx.shape[1], key.shape[2]
        # context part: fold cells into rows -> one bmm per KV head against the shared keys
        q_rows = qg.transpose(0, 1).reshape(Hkv, B * G * q, D)  # [Hkv, B·G·q, D]
        s_ctx = torch.bmm(q_rows, k_ctx.transpose(1, 2)).view(Hkv, B, G * q, T).mul_(scale)  # [Hkv, B, G·q, T]
        s_ctx.add_(call.bias())  # masked: −inf (in place on fresh tensors: the numbers of a masked fill, no copies)
        # suffix part: each cell's own tokens, causal
        s_suf = torch.matmul(qg, key.transpose(2, 3)).transpose(0, 1) * scale  # [Hkv, B, G·q, s]
        s_suf.masked_fill_(suffix_causal(q, G, s, qg.device), float("-inf"))
        if own is not None:
            s_suf.masked_fill_(~own[None, :, None, :], float("-inf"))

        probs = torch.softmax(torch.cat([s_ctx, s_suf], dim=-1), dim=-1, dtype=torch.float32)  # [Hkv, B, G·q, T+s]
        for i in call.captured:  # the captures from this softmax (capture.deliver: the rows, and masses from them)
            rows = probs[:, :, i::q, :]  # [Hkv, B, G, T+s]: rows g·q + i, i.e. query index i of each group head
            deliver(call, i, rows=rows.transpose(0, 1).reshape(B, Hkv * G, T + s))  # query head kv·G + g
        p = probs.to(qg.dtype)
        out = torch.bmm(p[..., :T].reshape(Hkv, B * G * q, T), v_ctx).view(Hkv, B, G * q, D)
        return out + torch.matmul(p[..., T:], value.transpose(0, 1))  # [Hkv, B, G·q, s] @ [Hkv, B, s, D]
