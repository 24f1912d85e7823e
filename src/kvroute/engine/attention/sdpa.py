"""The sdpa backend: PyTorch's public ``scaled_dot_product_attention`` with a boolean keep mask, on any device.

The public operator returns no log-sum-exp, so the context and the cells' suffix cannot be attended apart and joined
(as :mod:`kvroute.engine.attention.fused` does); instead each KV head's query rows of all cells are one batch row
over the shared context followed by every cell's suffix keys, ``[T + B·s]``, and the mask lets a row see its cell's
kept context entries and its own cell's suffix, causally. The context is not copied per cell; the mask takes
``Hkv · B·G·q · (T + B·s)`` bytes, which suits decode steps (q = 1) and is large for the question forwards of many
cells (where ``gathered`` or ``kept`` pay for the kept entries only).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F  # noqa: N812 - PyTorch's own spelling

from kvroute.engine.attention.backend import AttentionCall, Backend, register
from kvroute.engine.attention.streaming import suffix_causal


def sdpa_mask(keep: torch.Tensor, q: int, G: int, s: int, own: torch.Tensor | None) -> torch.Tensor:
    """bool ``[Hkv, B·G·q, T + B·s]``: True where a query row (cell b, rows in (g, i) order) may attend a key of the
    shared context (``keep`` bool ``[Hkv, B, 1, T]``) or of the cells' suffixes laid end to end (its own cell's
    only, causally, and only the slots of ``own`` bool ``[B, s]``, None: all)."""
    Hkv, B, _, T = keep.shape
    R = G * q
    sees = ~suffix_causal(q, G, s, keep.device)  # [R, s]
    mine = sees[None] if own is None else sees[None] & own[:, None, :]  # [B or 1, R, s]
    eye = torch.eye(B, dtype=torch.bool, device=keep.device)  # row cell × key cell
    suffix = (eye[:, None, :, None] & mine[:, :, None, :]).reshape(B, R, B * s)  # [B, R, B·s]
    context = keep.expand(Hkv, B, R, T)
    return torch.cat([context, suffix[None].expand(Hkv, B, R, B * s)], dim=-1).reshape(Hkv, B * R, T + B * s)


@register
class Sdpa(Backend):
    name = "sdpa"

    def forward(self, call: AttentionCall) -> torch.Tensor:
        qg, key, value = call.qg, call.key, call.value
        B, Hkv, R, D = qg.shape
        s = key.shape[2]
        rows = qg.transpose(0, 1).reshape(1, Hkv, B * R, D)  # [1, Hkv, B·R, D]: the cells' rows of each KV head
        suffix_k = key.transpose(0, 1).reshape(Hkv, B * s, D)  # [Hkv, B·s, D]: every cell's suffix, end to end
        suffix_v = value.transpose(0, 1).reshape(Hkv, B * s, D)
        k = torch.cat([call.k_ctx, suffix_k], dim=1)[None]  # [1, Hkv, T + B·s, D]
        v = torch.cat([call.v_ctx, suffix_v], dim=1)[None]
        mask = sdpa_mask(call.keep, call.q, call.G, s, call.own)[None]  # [1, Hkv, B·R, T + B·s]
        out = F.scaled_dot_product_attention(rows, k, v, attn_mask=mask, scale=call.scale)  # [1, Hkv, B·R, D]
        return out[0].view(Hkv, B, R, D)
