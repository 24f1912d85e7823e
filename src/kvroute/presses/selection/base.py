"""Selection strategies: scores ``[L, Hkv, T]`` and a ratio → a bool keep mask ``[L, Hkv, T]``.

Ratio semantics are kvpress's: α is the fraction of context entries removed per (layer, KV head),
protected tokens (sinks, observation windows) counted, and ``n_kept = int(T · (1 − α))``.
Selection is pure tensor code, testable without a model.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Hashable
from typing import Any, ClassVar

import torch

from kvroute.errors import ConfigError, EngineError
from kvroute.presses.params import Param
from kvroute.presses.scorers.base import check_params
from kvroute.presses.spec import ComponentSpec, parse_component
from kvroute.registry import Registry


def check_ratio(ratio: float) -> float:
    try:
        r = float(ratio)
    except (TypeError, ValueError):
        raise ConfigError(f"compression ratio must be a number in [0, 1), got {ratio!r}") from None
    if not 0.0 <= r < 1.0:
        raise ConfigError(f"compression ratio must be in [0, 1) (the fraction of context entries removed), got {r}")
    return r


def n_kept(num_tokens: int, ratio: float) -> int:
    """kvpress's ``compute_n_kept`` without its silent clamp: a zero budget is an error here."""
    ratio = check_ratio(ratio)
    n = int(num_tokens * (1 - ratio))
    if n < 1:
        smallest = 1.0 - 1.0 / num_tokens
        raise EngineError(
            f"ratio {ratio} keeps 0 of {num_tokens} context tokens per head; use a ratio below {smallest:.4f} "
            "or a longer context"
        )
    return n


def topk_mask(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Bool mask of the top-``k`` entries along the last axis (torch.topk, as kvpress uses)."""
    idx = scores.topk(k, dim=-1).indices
    return torch.zeros_like(scores, dtype=torch.bool).scatter_(-1, idx, True)


class Selection(ABC):
    """Subclasses are dataclasses whose fields are their parameters."""

    name: ClassVar[str]
    description: ClassVar[str] = ""
    schema: ClassVar[dict[str, Param]] = {}  # allowed range of each numeric parameter (checked at build time)

    def score_variant(self) -> Hashable:
        """How the scorer must be run in the prefill: ``"full"`` (whole context) or e.g. ``("chunk", n)``."""
        return "full"

    @abstractmethod
    def select(self, scores: torch.Tensor, ratio: float) -> torch.Tensor:
        """``scores`` ``[L, Hkv, T]`` (from :meth:`score_variant`) → bool keep mask ``[L, Hkv, T]``."""

    @classmethod
    def parameters(cls) -> dict[str, Any]:
        import dataclasses

        return {f.name: f.default for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else {}

    def spec(self) -> ComponentSpec:
        defaults = self.parameters()
        return ComponentSpec(self.name, tuple(sorted((k, getattr(self, k)) for k in defaults
                                                     if getattr(self, k) != defaults[k])))


SELECTIONS: Registry[type[Selection]] = Registry("selection")


def build_selection(spec: ComponentSpec | str) -> Selection:
    if isinstance(spec, str):
        spec = parse_component(spec, "selection")
    cls = SELECTIONS.get(spec.name)
    return cls(**check_params("selection", spec.name, spec.kwargs, cls.parameters(), cls.schema))
