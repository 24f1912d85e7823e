from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from kvroute.errors import ConfigError
from kvroute.presses.params import Param
from kvroute.presses.scorers.base import Scorer
from kvroute.presses.selection.base import SELECTIONS, Selection, n_kept, scorer_press


def adakv_layer(scores: torch.Tensor, k: int, alpha_safeguard: float) -> torch.Tensor:
    """One layer ``[1, Hkv, T]`` → keep mask, exactly as kvpress's AdaKVPress.compress.

    Each head first protects its top ``int(k · α_safe)`` entries (at least one), then the
    ``Hkv · (T − k)`` lowest-scoring entries across all heads of the layer are evicted.
    """
    bsz, Hkv, T = scores.shape
    s = scores.clone()
    n_safe = int(k * alpha_safeguard)
    if alpha_safeguard > 0:
        n_safe = max(1, n_safe)
    top = torch.topk(s, n_safe, dim=-1).indices
    s.scatter_(-1, top, torch.finfo(s.dtype).max)
    n_pruned = Hkv * (T - k)
    keep = torch.ones(bsz, Hkv * T, dtype=torch.bool, device=s.device)
    if n_pruned > 0:
        pruned = torch.topk(-s.reshape(bsz, -1), n_pruned, dim=1).indices  # [1, n_pruned] into Hkv*T
        keep.scatter_(1, pruned, False)
    return keep.view(bsz, Hkv, T)


@SELECTIONS.add
@dataclass
class AdaKV(Selection):
    """Top-k across all KV heads of a layer with a per-head safeguard (kvpress AdaKVPress).

    The layer's total budget is the same as per-head top-k (``Hkv · int(T · (1 − α))``), but heads
    compete for it; each keeps at least ``alpha_safeguard`` of its even share.
    """

    name: ClassVar[str] = "adakv"
    kvpress_fake_keys: ClassVar[bool] = True
    description: ClassVar[str] = "Top-k across the KV heads of a layer, per-head safeguard (kvpress AdaKVPress)."
    alpha_safeguard: float = 0.20
    schema: ClassVar[dict[str, Param]] = {"alpha_safeguard": Param(lo=0, hi=1, why="a share of each head's budget")}

    def __post_init__(self) -> None:
        if not 0.0 <= self.alpha_safeguard <= 1.0:
            raise ConfigError(f"adakv: alpha_safeguard must be in [0, 1], got {self.alpha_safeguard}")

    def select(self, scores: torch.Tensor, ratio: float) -> torch.Tensor:
        L, Hkv, T = scores.shape
        k = n_kept(T, ratio)
        if ratio == 0:
            return torch.ones_like(scores, dtype=torch.bool)
        return torch.cat([adakv_layer(scores[layer : layer + 1], k, self.alpha_safeguard) for layer in range(L)])

    def kvpress_counterpart(self, scorer: Scorer, ratio: float, question_window: int = 0) -> Any:
        from kvpress import AdaKVPress

        return AdaKVPress(scorer_press(scorer, ratio, question_window, "AdaKVPress"),
                          alpha_safeguard=self.alpha_safeguard)
