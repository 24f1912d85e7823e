"""Retention: which answer and evidence tokens survive in which heads; GER and eviction rate."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from kvroute.metrics.base import CellContext, Metric, register


def ger(mask: torch.Tensor, positions: Sequence[int]) -> float | None:
    """Global Eviction Ratio: over layers ℓ and t in ``positions``, the share of (ℓ, t) evicted from every KV head.

    ``mask`` bool ``[L, Hkv, T]``. None when there are no positions (GER is undefined).
    """
    if len(positions) == 0:
        return None
    gone = ~mask[:, :, list(positions)].any(dim=1)  # [L, n]: evicted from every head of layer ℓ
    return float(gone.float().mean())


def ger_all_layers(mask: torch.Tensor, positions: Sequence[int]) -> float | None:
    """Share of t in ``positions`` evicted from every head of every layer."""
    if len(positions) == 0:
        return None
    gone = ~mask[:, :, list(positions)].any(dim=1).any(dim=0)  # [n]
    return float(gone.float().mean())


def ger_per_layer(mask: torch.Tensor, positions: Sequence[int]) -> list[float] | None:
    if len(positions) == 0:
        return None
    return (~mask[:, :, list(positions)].any(dim=1)).float().mean(dim=1).tolist()


def heads_retaining(mask: torch.Tensor, positions: Sequence[int]) -> int | None:
    """Number of (layer, KV head) pairs that keep at least one of ``positions`` (redundancy k)."""
    if len(positions) == 0:
        return None
    return int(mask[:, :, list(positions)].any(dim=-1).sum())


def eviction_rate(mask: torch.Tensor) -> float:
    """Share of (layer, context token) evicted from every KV head of the layer."""
    return float((~mask.any(dim=1)).float().mean())


@register
class Retention(Metric):
    name = "retention"
    fields = ("kept_fraction", "eviction_rate", "ger", "ger_all_layers", "ger_evidence", "ger_evidence_all_layers",
              "ger_layer", "evidence_heads", "answer_heads")

    def compute(self, ctx: CellContext) -> dict[str, Any]:
        m = ctx.mask.compressed  # [L', Hkv, T]: the compressed layers (all L but where a press leaves some whole)
        ans = ctx.context_positions(ctx.prompt.answer_positions)
        ev = ctx.context_positions(ctx.prompt.evidence_positions)
        return {
            "kept_fraction": ctx.mask.kept_fraction,
            "eviction_rate": eviction_rate(m),
            "ger": ger(m, ans),
            "ger_all_layers": ger_all_layers(m, ans),
            "ger_evidence": ger(m, ev),
            "ger_evidence_all_layers": ger_all_layers(m, ev),
            "ger_layer": ger_per_layer(ctx.mask.mask, ans),  # every layer, by index (a layer left whole: 0)
            "evidence_heads": heads_retaining(m, ev),
            "answer_heads": heads_retaining(m, ans),
        }
