from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from kvroute.errors import ConfigError, EngineError
from kvroute.presses.params import Param
from kvroute.presses.scorers.base import Scorer
from kvroute.presses.selection.base import SELECTIONS, Selection, n_kept, topk_mask


def pyramid_budgets(num_tokens: int, num_layers: int, ratio: float, window_size: int = 64, beta: int = 20) -> list[int]:
    """Per-layer budgets of PyramidKV (more entries in lower layers, fewer in upper ones).

    The formula is kvpress's ``PyramidKVPress.get_layer_budget`` (from KVCache-Factory): the total
    over layers equals ``L · T · (1 − α)`` up to rounding. When the pyramid does not fit (short
    contexts), every layer gets the uniform budget ``max(1, round(T · (1 − α)))``, as kvpress falls
    back to SnapKV (rounded, where per-head top-k truncates). Budgets are clamped into ``[1, T]``.
    """
    T, L = num_tokens, num_layers
    n_kept(T, ratio)  # the ratio keeps at least one token
    uniform = min(T, max(1, round(T * (1 - ratio))))
    max_capacity = window_size + T * (1 - ratio)
    min_num = (max_capacity - window_size) / beta
    max_num = (max_capacity - window_size) * 2 - min_num
    if max_num >= T - window_size:
        max_num = T - window_size
        min_num = (max_capacity - window_size) * 2 - max_num
    if not (T >= max_num >= min_num >= window_size):
        return [uniform] * L
    steps = (max_num - min_num) / (L - 1) if L > 1 else 0.0
    return [min(T, max(1, round(max_num - layer * steps))) for layer in range(L)]


@SELECTIONS.add
@dataclass
class Pyramid(Selection):
    """Per-layer budgets shaped like a pyramid (PyramidKV), top-k per KV head inside each layer."""

    name: ClassVar[str] = "pyramid"
    description: ClassVar[str] = "Per-layer pyramid budgets (PyramidKV), top-k per KV head."
    window_size: int = 64
    beta: int = 20
    schema: ClassVar[dict[str, Param]] = {"window_size": Param(lo=0, why="protected recent tokens"),
                                          "beta": Param(lo=1, why="the pyramid's slope divisor")}

    def __post_init__(self) -> None:
        if self.beta < 1:
            raise ConfigError(f"pyramid: beta must be ≥ 1, got {self.beta}")
        if self.window_size < 0:
            raise ConfigError(f"pyramid: window_size must be ≥ 0, got {self.window_size}")

    def select(self, scores: torch.Tensor, ratio: float) -> torch.Tensor:
        L, Hkv, T = scores.shape
        if ratio == 0:
            return torch.ones_like(scores, dtype=torch.bool)
        budgets = pyramid_budgets(T, L, ratio, self.window_size, self.beta)
        return torch.cat([topk_mask(scores[layer : layer + 1], budgets[layer]) for layer in range(L)])

    def kvpress_counterpart(self, scorer: Scorer, ratio: float, question_window: int = 0) -> Any:
        from kvpress import PyramidKVPress, SnapKVPress

        inner = scorer.kvpress_press(ratio, question_window)
        if type(inner) is not SnapKVPress:
            raise EngineError("kvpress's PyramidKVPress scores with SnapKV only; "
                              f"{scorer.name}+pyramid has no counterpart")
        if inner.window_size != self.window_size:
            raise EngineError("kvpress's PyramidKVPress uses one window_size for SnapKV and the pyramid; here snapkv "
                              f"has {inner.window_size} and pyramid {self.window_size}")
        return PyramidKVPress(compression_ratio=ratio, window_size=self.window_size, kernel_size=inner.kernel_size,
                              beta=self.beta)
