"""Uniform random scores: the control every method should beat."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from kvroute.presses.params import Param
from kvroute.presses.scorers.base import SCORERS, ScoreInputs, Scorer


@SCORERS.add
@dataclass
class RandomScorer(Scorer):
    """Random scores from a generator seeded by (seed, layer), so each layer draws its own tokens.

    kvpress's RandomPress re-seeds identically on every layer (all layers keep the same tokens);
    kvroute seeds per layer, which is the baseline a routing study needs. ``seed`` defaults to the
    sweep seed when left at -1.
    """

    name: ClassVar[str] = "random"
    description: ClassVar[str] = "Uniform random scores, seeded per (seed, layer)."
    seed: int = -1
    schema: ClassVar[dict[str, Param]] = {"seed": Param(lo=-1, why="-1 = the sweep seed")}

    def score(self, x: ScoreInputs, ratio: float) -> torch.Tensor:
        seed = x.seed if self.seed < 0 else self.seed
        g = torch.Generator(device="cpu").manual_seed(seed * 100_003 + x.layer_idx)
        return torch.rand(x.keys.shape[:-1], generator=g).to(x.keys.device)
