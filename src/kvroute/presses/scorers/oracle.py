"""Controls kvpress lacks: keep the evidence first (oracle) or evict it first (anti-oracle)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch import nn

from kvroute.errors import EngineError
from kvroute.presses.scorers.base import SCORERS, ScoreInputs, Scorer, build_scorer


@dataclass
class _EvidenceControl(Scorer):
    """Scores of ``base`` shifted so evidence tokens rank above (oracle) or below (anti) all others.

    The order among evidence tokens, and among the rest, stays the base scorer's order, so under any
    budget the oracle keeps evidence first and fills the rest by ``base``.
    """

    needs_evidence: ClassVar[bool] = True
    sign: ClassVar[float] = 1.0
    base: str = "expected_attention"
    _base: Any = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.base in ("oracle", "anti_oracle"):
            raise EngineError(f"{self.name}: base must be an ordinary scorer, not {self.base!r}")
        self._base = build_scorer(self.base)
        if self._base.scores_after_prefill or self._base.needs_question_window:
            raise EngineError(f"{self.name}: base {self.base!r} does not score layer by layer on the context alone; "
                              "use a per-layer scorer such as expected_attention, snapkv or knorm")

    @classmethod
    def parameters(cls) -> dict[str, Any]:
        return {"base": "expected_attention"}

    @property
    def ratio_dependent(self) -> bool:  # type: ignore[override]
        return self._base.ratio_dependent

    @property
    def needs_attentions(self) -> bool:  # type: ignore[override]
        return self._base.needs_attentions

    def setup(self, model: nn.Module) -> None:
        self._base.setup(model)

    def min_tokens(self) -> int:
        return self._base.min_tokens()

    def check(self, num_tokens: int) -> None:
        self._base.check(num_tokens)

    def score(self, x: ScoreInputs, ratio: float) -> torch.Tensor:
        if x.evidence is None:
            raise EngineError(f"{self.name} needs the instance's evidence positions; give a task instance with "
                              "evidence spans")
        s = self._base.score(x, ratio).float()  # [1, Hkv, T]
        span = (s.max() - s.min()).item() + 1.0
        s = s.clone()
        s[..., x.evidence] += self.sign * span
        return s


@SCORERS.add
@dataclass
class OracleScorer(_EvidenceControl):
    name: ClassVar[str] = "oracle"
    description: ClassVar[str] = "Control: keeps evidence tokens first, then the rest by a base scorer."
    sign: ClassVar[float] = 1.0


@SCORERS.add
@dataclass
class AntiOracleScorer(_EvidenceControl):
    name: ClassVar[str] = "anti_oracle"
    description: ClassVar[str] = "Control: evicts evidence tokens first, then the rest by a base scorer."
    sign: ClassVar[float] = -1.0
