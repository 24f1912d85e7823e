"""Metrics: functions of one cell (its KeepMask, its decode, the full-cache reference) → record fields.

Each metric lives in its own file and registers itself by name in :data:`METRICS`; the name is
what a sweep config lists under ``metrics``. A metric declares the record fields it fills (see
kvroute/records.py) and what it needs captured, so unrequested captures are never computed.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from kvroute.registry import Registry

if TYPE_CHECKING:
    from kvroute.tasks.instance import TaskInstance
    from kvroute.tasks.prompt import Prompt


@dataclass(frozen=True)
class MetricSettings:
    """Operational choices of the metric definitions (documented in docs/metrics.md)."""

    reach_kappa: float = 5.0  # ε = κ / (number of keys visible to the head): κ× uniform attention
    # uncalibrated rule: a kept token carries evidence if its share ≥ τ · the best evidence token's
    route_tau: float = 0.5
    route_null: int = 19  # null sources (shifted copies of the evidence pattern) rolled out beside the evidence
    route_alpha: float = 0.05  # routed_reachable iff the rank-test p-value against the null draws is ≤ this
    # null shifts are drawn within ± this many tokens of the evidence (or wider, to hold 2n)
    route_null_window: int = 128
    n_sink: int = 4  # positions ignored by the *_nosink consensus variants
    partial_f1: float = 0.0  # F1 above this (but not correct) counts as partial
    probe_layer: float = 2 / 3  # depth (fraction of L) whose last-prompt-token state feeds the probe


@dataclass
class CellContext:
    """Everything a metric may read about one cell. Positions index the prompt's input_ids."""

    instance: TaskInstance
    prompt: Prompt
    mask: Any  # KeepMask [L, Hkv, T]
    output: Any  # CellOutput of this cell
    full: Any  # CellOutput of the uncompressed cache
    group_size: int  # G: query heads per KV head
    settings: MetricSettings
    evidence_share: torch.Tensor | None = None  # [L, T] rollout evidence share per layer (routes capture)
    candidates: Any = None  # kvroute.metrics.representation.LensCandidates: the logit lens's columns (lens capture)
    null_share: torch.Tensor | None = None  # [L, T, n_null] the same share from each null source (routes capture)
    cache: dict[str, Any] = field(default_factory=dict)

    @property
    def T(self) -> int:
        return self.prompt.n_context

    @property
    def layers(self) -> list[int] | None:
        """The layers the cell's press compressed (the keep mask's ``layers``; None: every layer). The keep-mask
        metrics (kept fraction, GER, reachability) are read over these: a layer left whole (Gemma 3's sliding
        layers) neither evicts nor loses evidence, and would otherwise dilute the ratio's effect."""
        layers = getattr(self.mask, "layers", None)
        return None if layers is None else list(layers)

    def compressed(self, per_layer: torch.Tensor) -> torch.Tensor:
        """``per_layer`` (layers first: ``[L, ...]``) restricted to :attr:`layers` (``[L', ...]``)."""
        layers = self.layers
        return per_layer if layers is None else per_layer[layers]

    def context_positions(self, positions: list[int]) -> list[int]:
        return [p for p in positions if 0 <= p < self.T]


class Metric(ABC):
    name: ClassVar[str]
    fields: ClassVar[tuple[str, ...]]
    needs: ClassVar[frozenset[str]] = frozenset()  # captures: "attention", "hidden", "gold", "routes", "lens", "argmax"

    @abstractmethod
    def compute(self, ctx: CellContext) -> dict[str, Any]: ...


METRICS: Registry[Metric] = Registry("metric")


def register(cls: type[Metric]) -> type[Metric]:
    METRICS.register(cls.name, cls())
    return cls
