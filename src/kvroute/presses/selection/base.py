"""Selection strategies: scores ``[L, Hkv, T]`` and a ratio → a bool keep mask ``[L, Hkv, T]``.

Ratio semantics are kvpress's: α is the fraction of context entries removed per (layer, KV head),
protected tokens (sinks, observation windows) counted, and ``n_kept = int(T · (1 − α))``.
Selection is pure tensor code, testable without a model.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from kvroute.errors import ConfigError, EngineError
from kvroute.presses.params import Param
from kvroute.presses.scorers.base import ScoreInputs, Scorer, check_params
from kvroute.presses.spec import Component, ComponentSpec, parse_component
from kvroute.registry import Registry

#: significant digits of a ratio: 0.3 and 0.1 + 0.2 (0.30000000000000004) are one ratio, not two cells
RATIO_DIGITS = 12


def check_ratio(ratio: float) -> float:
    """``ratio`` checked (a number in [0, 1)) and in its canonical form (:data:`RATIO_DIGITS` significant
    digits), so two spellings of one ratio make one cell, one key and one point of a curve."""
    try:
        r = float(ratio)
    except (TypeError, ValueError):
        raise ConfigError(f"compression ratio must be a number in [0, 1), got {ratio!r}") from None
    if not 0.0 <= r < 1.0 or not 0.0 <= float(f"{r:.{RATIO_DIGITS}g}") < 1.0:
        raise ConfigError(f"compression ratio must be in [0, 1) (the fraction of context entries removed), got {r}")
    return float(f"{r:.{RATIO_DIGITS}g}")


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


@dataclass(frozen=True)
class ScoreVariant:
    """How a selection runs its scorer in the prefill (:meth:`Selection.score_layer`): requests with equal
    variants (and scorer, and ratio where scores depend on it) share one score computation."""

    kind: str = "full"  # "full": the scorer on the whole context; else the selection's own way (chunk, block)
    params: tuple[int, ...] = ()  # what else decides the scores (chunk length, last-chunk minimum, block size)


FULL = ScoreVariant()


class Selection(Component, ABC):
    """Subclasses are dataclasses whose fields are their parameters.

    Three steps, each overridable: :meth:`score_layer` runs the press's scorer on one layer in the
    prefill (the whole context by default; chunk by chunk, block by block for the selections that
    score that way), :meth:`aux_scorers` names further scores the selection reads (CriticalKV's value
    projections), and :meth:`select` turns the scores into the keep mask for one ratio.
    """

    name: ClassVar[str]
    description: ClassVar[str] = ""
    schema: ClassVar[dict[str, Param]] = {}  # allowed range of each numeric parameter (checked at build time)
    # score_layer depends on the ratio (e.g. block's iterative pruning): the prefill scores once per ratio
    scores_per_ratio: ClassVar[bool] = False
    # kvpress applies this selection with "fake keys" (evicted keys overwritten, the cache kept whole) rather
    # than by pruning: checks against kvpress then compare the keep masks kvpress decides
    kvpress_fake_keys: ClassVar[bool] = False

    def score_variant(self) -> ScoreVariant:
        """What identifies this selection's way of scoring (:meth:`score_layer`): equal variants share scores.

        :data:`FULL`: the scorer on the whole context, shared by every selection that scores so.
        """
        return FULL

    def fit(self, scorer: Scorer) -> None:
        """Adapt to the press's ``scorer`` when the press is built, before :meth:`check_scorer` (e.g. chunked
        selections keep a last chunk the scorer can score)."""
        return None

    def score_layer(self, scorer: Scorer, x: ScoreInputs, ratio: float) -> torch.Tensor:
        """``[1, Hkv, T]`` scores of one layer in the prefill: the scorer on the whole context by default."""
        return scorer.score(x, ratio)

    def check_scorer(self, scorer: Scorer) -> None:
        """Raise :class:`~kvroute.errors.ConfigError` when this selection cannot use ``scorer`` (at build time)."""
        if scorer.scores_after_prefill and self.score_variant() != FULL:
            raise ConfigError(f"{scorer.name} scores every layer at once after the prefill; selection "
                              f"{self.name!r} scores part by part, so the two cannot be combined")
        if scorer.needs_question_window and self.score_variant() != FULL:
            raise ConfigError(f"{scorer.name} scores by the question at the end of the context; selection "
                              f"{self.name!r} scores parts of the context that do not hold it: use per_head, adakv "
                              "or chunk[rescore=false] (chunks of the whole-context scores)")

    def aux_scorers(self) -> Mapping[str, Scorer]:
        """Further scores this selection reads (name → scorer, run whole-context in the same prefill)."""
        return {}

    @abstractmethod
    def select(self, scores: torch.Tensor, ratio: float) -> torch.Tensor:
        """``scores`` ``[L, Hkv, T]`` (from :meth:`score_layer`) → bool keep mask ``[L, Hkv, T]``."""

    def select_aux(self, scores: torch.Tensor, ratio: float, aux: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """:meth:`select` for selections with :meth:`aux_scorers`: ``aux`` holds their ``[L, Hkv, T]`` scores."""
        return self.select(scores, ratio)

    def kvpress_counterpart(self, scorer: Scorer, ratio: float, question_window: int = 0) -> Any:
        """The kvpress press that does what ``scorer`` + this selection do at ``ratio`` (the equivalence reference).

        Raises :class:`~kvroute.errors.EngineError` saying why when kvpress has none.
        """
        raise EngineError(f"selection {self.name!r} is kvroute's own; kvpress has no press that selects this way")


def scorer_press(scorer: Scorer, ratio: float, question_window: int, wrapper: str) -> Any:
    """``scorer``'s kvpress press for a kvpress wrapper (``wrapper`` names it), which takes ScorerPress subclasses
    only."""
    from kvpress import ScorerPress

    inner = scorer.kvpress_press(ratio, question_window)
    if not isinstance(inner, ScorerPress):
        raise EngineError(f"kvpress's {wrapper} wraps a ScorerPress; {scorer.name} ({type(inner).__name__}) is not one")
    return inner


SELECTIONS: Registry[type[Selection]] = Registry("selection")


def build_selection(spec: ComponentSpec | str) -> Selection:
    if isinstance(spec, str):
        spec = parse_component(spec, "selection")
    cls = SELECTIONS.get(spec.name)
    return cls(**check_params("selection", spec.name, spec.kwargs, cls.parameters(), cls.schema))
