"""The analysis's settings (:class:`AnalysisConfig`), apart from the summary so its sections can read them."""

from __future__ import annotations

from dataclasses import dataclass

from kvroute.analysis.context import LONG_CONTEXT
from kvroute.analysis.league import MIN_LEAGUE_INSTANCES
from kvroute.errors import ConfigError


@dataclass(frozen=True)
class AnalysisConfig:
    """The analysis's operational choices; validated on construction."""

    delta: float = 0.05  # safe ratio: allowed rise of H over the baseline
    n_boot: int = 1000  # bootstrap replicates (resampling instances)
    seed: int = 0
    confidence: float = 0.95
    ger_threshold: float = 1.0  # ger_all_layers at or above this = answer globally evicted
    min_amplitude: float = 0.1  # H must rise this much for a cliff to be fitted
    long_context_family: str = LONG_CONTEXT
    length_edges: tuple[float, ...] | None = None  # context-length bin edges (default: half octaves)
    probe_folds: int = 5
    league_min_instances: int = MIN_LEAGUE_INSTANCES  # press league: fewer instances = undecided, unranked

    def __post_init__(self) -> None:
        checks = [("delta", 0 < self.delta < 1, "in (0, 1)"), ("n_boot", self.n_boot >= 10, "at least 10"),
                  ("confidence", 0.5 <= self.confidence < 1, "in [0.5, 1)"),
                  ("ger_threshold", 0 < self.ger_threshold <= 1, "in (0, 1]"),
                  ("min_amplitude", 0 < self.min_amplitude < 1, "in (0, 1)"),
                  ("probe_folds", self.probe_folds >= 2, "at least 2"),
                  ("league_min_instances", self.league_min_instances >= 2, "at least 2")]
        for name, ok, allowed in checks:
            if not ok:
                raise ConfigError(f"analysis setting {name}={getattr(self, name)!r} is out of range; "
                                  f"it must be {allowed}")
