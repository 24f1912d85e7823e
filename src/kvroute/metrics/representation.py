"""Representation: compressed vs full last-prompt-token hidden states, and probe features."""

from __future__ import annotations

from typing import Any

import torch

from kvroute.metrics.base import CellContext, Metric, register


def hidden_cosine(h: torch.Tensor, h_full: torch.Tensor) -> list[float]:
    """Per-layer cosine of ``[L + 1, d]`` hidden states (embeddings row dropped: it never changes)."""
    return torch.nn.functional.cosine_similarity(h[1:].float(), h_full[1:].float(), dim=-1).tolist()


@register
class Representation(Metric):
    name = "representation"
    needs = frozenset({"hidden"})
    fields = ("hidden_cosine", "hidden_cosine_last", "probe_features", "probe_layer")

    def compute(self, ctx: CellContext) -> dict[str, Any]:
        h, f = ctx.output.hidden, ctx.full.hidden  # [L + 1, d]
        cos = hidden_cosine(h, f)
        L = h.shape[0] - 1
        layer = max(1, min(L, round(ctx.settings.probe_layer * L)))
        return {"hidden_cosine": cos, "hidden_cosine_last": cos[-1],
                "probe_features": h[layer].half().float().tolist(), "probe_layer": layer}
