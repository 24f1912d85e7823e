"""A press = a scorer + a selection strategy, built from a spec string."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvroute.presses.keepmask import KeepMask
from kvroute.presses.scorers import Scorer, build_scorer
from kvroute.presses.selection import Selection, build_selection, check_ratio
from kvroute.presses.spec import PressSpec, parse_press


@dataclass(frozen=True)
class Press:
    spec: PressSpec
    scorer: Scorer
    selection: Selection

    @property
    def name(self) -> str:
        """Canonical name, e.g. ``expected_attention+adakv`` (parameters only where not default)."""
        return str(PressSpec(self.scorer.spec(), self.selection.spec()))

    def keep_mask(self, scores: torch.Tensor, ratio: float) -> KeepMask:
        ratio = check_ratio(ratio)
        return KeepMask(self.selection.select(scores, ratio), self.name, ratio)


def build_press(spec: str | PressSpec) -> Press:
    """Parse and build ``scorer[...]+selection[...]``; unknown names and parameters fail with suggestions."""
    ps = parse_press(spec) if isinstance(spec, str) else spec
    scorer, selection = build_scorer(ps.scorer), build_selection(ps.selection)
    if hasattr(selection, "min_last"):  # chunked selection: a tail chunk must be scorable
        selection.min_last = scorer.min_tokens()
    return Press(ps, scorer, selection)
