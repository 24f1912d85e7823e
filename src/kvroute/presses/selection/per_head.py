from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from kvroute.presses.scorers.base import Scorer
from kvroute.presses.selection.base import SELECTIONS, Selection, n_kept, topk_mask


@SELECTIONS.add
@dataclass
class PerHead(Selection):
    """Top-k per (layer, KV head): kvpress ScorerPress semantics, the same budget in every head."""

    name: ClassVar[str] = "per_head"
    description: ClassVar[str] = "Top-k per KV head (kvpress ScorerPress)."

    def select(self, scores: torch.Tensor, ratio: float) -> torch.Tensor:
        L, Hkv, T = scores.shape
        k = n_kept(T, ratio)
        # one layer at a time with kvpress's [1, Hkv, T] shape, so ties break exactly as in kvpress
        return torch.cat([topk_mask(scores[layer : layer + 1], k) for layer in range(L)])

    def kvpress_counterpart(self, scorer: Scorer, ratio: float, question_window: int = 0) -> Any:
        return scorer.kvpress_press(ratio, question_window)  # a kvpress ScorerPress selects per head itself
