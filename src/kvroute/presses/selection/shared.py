from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from kvroute.presses.selection.base import SELECTIONS, Selection, n_kept, topk_mask


@SELECTIONS.add
@dataclass
class Shared(Selection):
    """The same tokens for every KV head of a layer: top-k of the scores averaged over heads."""

    name: ClassVar[str] = "shared"
    description: ClassVar[str] = "Same kept tokens for all KV heads of a layer (head-averaged scores)."

    def select(self, scores: torch.Tensor, ratio: float) -> torch.Tensor:
        L, Hkv, T = scores.shape
        k = n_kept(T, ratio)
        mean = scores.float().mean(dim=1, keepdim=True)  # [L, 1, T]
        return topk_mask(mean, k).expand(L, Hkv, T).clone()
