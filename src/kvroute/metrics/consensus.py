"""Head consensus at the last prompt token: Consensus(ℓ) and the agreement fraction ρ_ℓ.

Consensus(ℓ) = (number of distinct argmax keys over the query heads of layer ℓ) / (query heads);
low = heads agree = rigid. ρ_ℓ = the largest share of heads sharing one argmax key. Both are also
computed ignoring the first ``n_sink`` positions, since attention sinks dominate argmax.
"""

from __future__ import annotations

from typing import Any

import torch

from kvroute.metrics.base import CellContext, Metric, register


def consensus_and_rho(attn_row: torch.Tensor, skip: int = 0) -> tuple[list[float], list[float]]:
    """From rows ``[L, H, K]``: per-layer Consensus(ℓ) and ρ_ℓ over keys ``skip:``."""
    L, H, K = attn_row.shape
    arg = attn_row[..., skip:].argmax(-1)  # [L, H]
    cons, rho = [], []
    for layer in range(L):
        _, counts = torch.unique(arg[layer], return_counts=True)
        cons.append(counts.numel() / H)
        rho.append(float(counts.max()) / H)
    return cons, rho


@register
class Consensus(Metric):
    name = "consensus"
    needs = frozenset({"attention"})
    fields = ("consensus", "rho", "consensus_nosink", "rho_nosink", "consensus_mean", "rho_mean")

    def compute(self, ctx: CellContext) -> dict[str, Any]:
        a = ctx.output.last_attention
        c, r = consensus_and_rho(a)
        cn, rn = consensus_and_rho(a, ctx.settings.n_sink)
        return {"consensus": c, "rho": r, "consensus_nosink": cn, "rho_nosink": rn,
                "consensus_mean": sum(cn) / len(cn), "rho_mean": sum(rn) / len(rn)}
