from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from kvroute.errors import EngineError
from kvroute.presses.scorers.base import Scorer
from kvroute.presses.selection.base import SELECTIONS, Selection, n_kept


def bottom_across_heads(scores: torch.Tensor, n_pruned: int) -> torch.Tensor:
    """One layer ``[1, Hkv, T]`` → keep mask with the ``n_pruned`` lowest entries across its heads evicted."""
    bsz, Hkv, T = scores.shape
    keep = torch.ones(bsz, Hkv * T, dtype=torch.bool, device=scores.device)
    if n_pruned > 0:
        keep.scatter_(1, torch.topk(-scores.reshape(bsz, -1), n_pruned, dim=1).indices, False)
    return keep.view(bsz, Hkv, T)


@SELECTIONS.add
@dataclass
class Global(Selection):
    """Evict the lowest entries across all layers and heads at once (kvpress KVzipPress's selection).

    ``int(L · Hkv · T · α)`` entries are evicted model-wide: layers and heads whose scores are low give
    up more, so budgets differ per layer and per head while the model-wide ratio is α. With
    ``per_layer=true`` every layer evicts ``int(Hkv · T · α)`` across its own heads (KVzip's
    ``layerwise``). No per-head floor: a head may lose every entry.
    """

    name: ClassVar[str] = "global"
    kvpress_fake_keys: ClassVar[bool] = True
    description: ClassVar[str] = ("Evict the lowest entries across all layers and heads (kvpress KVzipPress); "
                                  "per_layer=true: across the heads of each layer.")
    per_layer: bool = False

    def select(self, scores: torch.Tensor, ratio: float) -> torch.Tensor:
        L, Hkv, T = scores.shape
        n_kept(T, ratio)  # the same range of ratios as every selection
        if ratio == 0:
            return torch.ones_like(scores, dtype=torch.bool)
        if self.per_layer:
            counts = [int(Hkv * T * ratio)] * L
        else:  # the model-wide bottom set, then per layer as kvpress evicts it (same ties)
            pruned = torch.topk(-scores.reshape(-1), int(scores.numel() * ratio)).indices
            counts = torch.bincount(pruned // (Hkv * T), minlength=L).tolist()
        return torch.cat([bottom_across_heads(scores[layer : layer + 1], counts[layer]) for layer in range(L)])

    def kvpress_counterpart(self, scorer: Scorer, ratio: float, question_window: int = 0) -> Any:
        press = scorer.kvpress_press(ratio, question_window)
        if not hasattr(press, "layerwise"):
            raise EngineError(f"kvpress selects across layers only inside KVzipPress; {scorer.name} has no "
                              "counterpart with selection 'global'")
        press.layerwise = self.per_layer
        return press
