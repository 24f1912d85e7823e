"""A press = a scorer + a selection strategy, built from a spec string."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from kvroute.presses.constraints import Constrained, constrained
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
        constraints = self.selection.constraint_specs() if isinstance(self.selection, Constrained) else ()
        return str(PressSpec(self.scorer.spec(), self.selection.spec(), constraints))

    def keep_mask(self, scores: torch.Tensor, ratio: float, aux: Mapping[str, torch.Tensor] | None = None,
                  layers: tuple[int, ...] | None = None) -> KeepMask:
        """The KeepMask at ``ratio`` from the scorer's ``[L, Hkv, T]`` scores (and the selection's aux scores).

        ``layers``: the layers the press compresses (:attr:`~kvroute.models.loading.ModelInfo.compressed_layers`;
        None: all). The selection decides every layer as kvpress's hooks would (each layer by its own index: a
        pyramid's budgets stay those of the layer's depth), then the other layers are left whole, as kvpress skips
        their hooks."""
        ratio = check_ratio(ratio)
        mask = self.selection.select_aux(scores, ratio, aux) if aux else self.selection.select(scores, ratio)
        return KeepMask(mask, self.name, ratio).with_layers(layers)


def build_press(spec: str | PressSpec) -> Press:
    """Parse and build ``scorer[...]+selection[...]``; unknown names and parameters fail with suggestions."""
    ps = parse_press(spec) if isinstance(spec, str) else spec
    scorer = build_scorer(ps.scorer)
    selection = build_selection(ps.selection if ps.selection is not None else scorer.default_selection)
    selection = constrained(selection, ps.constraints)  # serving constraints wrap the selection (or none)
    selection.fit(scorer)
    selection.check_scorer(scorer)
    return Press(ps, scorer, selection)
