"""The analysis sections of a summary, registered in the order :func:`~kvroute.analysis.summary.run_analysis` runs them.

A section names the record columns it needs and the tables it produces; ``run`` computes those
tables from a :class:`SectionInput`. ``applies`` may add a condition columns cannot state (a family
present, more than one model) and returns the reason the section does not apply, or None. A section
that does not apply, or whose columns are absent, or whose estimator raises
:class:`~kvroute.analysis.common.AnalysisError`, is named in ``summary["notes"]`` with the reason.
Sections run in registration order and a later one may read an earlier one's tables
(``press_league`` reads ``cliffs`` and ``ger_within_ratio``).

Records of conversations (``decoding.history``) reach every section as turn 1 only, the single-question
setting every estimator but the turn analysis is defined on; a section registered with ``every_turn``
(the turn analysis) reads every turn. Later turns hold earlier exchanges in the cache — a condition of
their own — and share their context, compression and instance draw with turn 1, so pooling them would
count one conversation as several independent instances.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeAlias

import pandas as pd

from kvroute.analysis.cliff import cliff_tables
from kvroute.analysis.common import PRESS_KEYS, AnalysisError, caused_view, has_columns
from kvroute.analysis.compare import selection_comparison
from kvroute.analysis.context import cliff_vs_length
from kvroute.analysis.correlation import conditional_hallucination, ger_hallucination_correlation, within_ratio_link
from kvroute.analysis.curves import (
    CONSENSUS_COL,
    CONSENSUS_GROUP_COL,
    breakdown,
    layer_profiles,
    profile_trend,
    routing_curves,
)
from kvroute.analysis.decomposition import failure_decomposition, rigidity_comparison
from kvroute.analysis.league import press_league
from kvroute.analysis.probe import identity_by_ratio, lens_profiles, probe_by_ratio
from kvroute.analysis.redundancy import redundancy_table
from kvroute.analysis.retrieval import retrieval_vs_ger
from kvroute.analysis.serving import has_constrained, serving_cost
from kvroute.analysis.settings import AnalysisConfig
from kvroute.analysis.size import cliff_vs_size
from kvroute.analysis.turns import has_turns, turn_cliffs, turn_curves, turn_pairs
from kvroute.registry import Registry


@dataclass
class SectionInput:
    """What a section reads: the records, the settings, and the tables of the sections before it."""

    df: pd.DataFrame
    cfg: AnalysisConfig
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)

    @property
    def boot(self) -> dict[str, Any]:
        """The bootstrap settings most estimators take."""
        return dict(n_boot=self.cfg.n_boot, confidence=self.cfg.confidence, seed=self.cfg.seed)


Tables: TypeAlias = pd.DataFrame | tuple[pd.DataFrame, ...]


@dataclass(frozen=True)
class AnalysisSection:
    """One part of the summary: the columns it needs, the tables it produces (in the order ``run`` returns them)."""

    name: str
    needs: tuple[str, ...]
    produces: tuple[str, ...]
    run: Callable[[SectionInput], Tables]
    applies: Callable[[SectionInput], str | None] | None = None
    every_turn: bool = False  # reads every turn of a conversation (else turn 1 only)

    def skip_reason(self, x: SectionInput) -> str | None:
        """Why this section does not run on these records (the note's text), or None when it runs."""
        reason = self.applies(x) if self.applies is not None else None
        if reason is not None:
            return f"skipped: {reason}"
        missing = [c for c in self.needs if not has_columns(x.df, [c])]
        return f"skipped: the records have no {', '.join(missing)}" if missing else None

    def tables(self, x: SectionInput) -> dict[str, pd.DataFrame]:
        """The section's tables by name (may raise AnalysisError)."""
        out = self.run(x)
        return dict(zip(self.produces, (out,) if isinstance(out, pd.DataFrame) else out, strict=True))


SECTIONS: Registry[AnalysisSection] = Registry("analysis section")


def section(name: str, needs: Sequence[str], produces: Sequence[str] | None = None, *,
            applies: Callable[[SectionInput], str | None] | None = None, every_turn: bool = False
            ) -> Callable[[Callable[[SectionInput], Tables]], Callable[[SectionInput], Tables]]:
    """Register the decorated function as section ``name`` (``produces`` defaults to one table of that name)."""

    def add(run: Callable[[SectionInput], Tables]) -> Callable[[SectionInput], Tables]:
        SECTIONS.add(AnalysisSection(name, tuple(needs), tuple(produces or (name,)), run, applies, every_turn))
        return run

    return add


def first_turns(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` without the later turns of its conversations (records with no turn are kept)."""
    if not has_turns(df):
        return df
    turn = pd.to_numeric(df["turn"], errors="coerce")
    return df[turn.isna() | (turn == 1)]


def _nonempty(df: pd.DataFrame) -> pd.DataFrame:
    if df.empty:
        raise AnalysisError("no instance is answered right with the full cache")
    return df


@section("cliff", ["hallucinated"], ["cliff_curves", "cliffs"])
def _cliff(x: SectionInput) -> Tables:
    return cliff_tables(x.df, delta=x.cfg.delta, min_amplitude=x.cfg.min_amplitude, **x.boot)


# the headline view: hallucination caused by compression, among the instances right uncompressed
@section("cliff_caused", ["hallucinated", "outcome"], ["cliff_curves_caused", "cliffs_caused"])
def _cliff_caused(x: SectionInput) -> Tables:
    return cliff_tables(_nonempty(caused_view(x.df)), delta=x.cfg.delta, min_amplitude=x.cfg.min_amplitude, **x.boot)


def _long_context_absent(x: SectionInput) -> str | None:
    fam = x.cfg.long_context_family
    return None if (x.df["family"] == fam).any() else f"no {fam!r} family cells in these records"


@section("context_length", ["hallucinated", "context_tokens"], ["length_cliffs", "length_verdicts"],
         applies=_long_context_absent)
def _context_length(x: SectionInput) -> Tables:
    return cliff_vs_length(x.df, family=x.cfg.long_context_family, edges=x.cfg.length_edges,
                           min_amplitude=x.cfg.min_amplitude, **x.boot)


# α* against model size: per family, models with a known parameter count (the zoo's), trend and projection
@section("model_size", ["hallucinated"], ["size_cliffs", "size_trends"],
         applies=lambda x: None if x.df["model"].nunique() > 1 else "one model in these records")
def _model_size(x: SectionInput) -> Tables:
    return cliff_vs_size(x.df, exclude_families=(x.cfg.long_context_family,), min_amplitude=x.cfg.min_amplitude,
                         **x.boot)


# the headline GER reading: within instance at matched ratios (conditional logit, instance-clustered bootstrap)
@section("ger_within_ratio", ["ger", "hallucinated"])
def _ger_within_ratio(x: SectionInput) -> Tables:
    return within_ratio_link(x.df, threshold=x.cfg.ger_threshold, **x.boot)


# the routing view of the leaderboard: the run's cliffs and within-ratio links side by side, matched budgets
@section("press_league", ["hallucinated"])
def _press_league(x: SectionInput) -> Tables:
    c = x.cfg
    return press_league(x.df, cliffs=x.tables.get("cliffs"), within=x.tables.get("ger_within_ratio"), delta=c.delta,
                        min_amplitude=c.min_amplitude, ger_threshold=c.ger_threshold,
                        min_instances=c.league_min_instances, **x.boot)


@section("ger_correlation", ["ger", "hallucinated"], ["ger_points", "ger_correlation"])
def _ger_correlation(x: SectionInput) -> Tables:
    return ger_hallucination_correlation(x.df)


@section("conditional", ["ger_all_layers", "hallucinated"], ["conditional", "conditional_by_ratio"])
def _conditional(x: SectionInput) -> Tables:
    return (conditional_hallucination(x.df, threshold=x.cfg.ger_threshold),
            conditional_hallucination(x.df, threshold=x.cfg.ger_threshold, keys=PRESS_KEYS, by_ratio=True))


@section("decomposition", ["outcome", "ger_all_layers"])
def _decomposition(x: SectionInput) -> Tables:
    return failure_decomposition(x.df, ger_threshold=x.cfg.ger_threshold, **x.boot)


@section("rigidity", ["outcome", "ger", "ger_all_layers", CONSENSUS_COL])
def _rigidity(x: SectionInput) -> Tables:
    return rigidity_comparison(x.df, ger_threshold=x.cfg.ger_threshold)


@section("routing", [])
def _routing(x: SectionInput) -> Tables:
    return routing_curves(x.df)


def _breakdown(by: str, x: SectionInput) -> Tables:
    return breakdown(x.df, by)


for _by in ("answer_type", "question_type"):
    section(f"by_{_by}", [_by])(functools.partial(_breakdown, _by))


def _profiles(col: str, x: SectionInput) -> Tables:
    return layer_profiles(x.df, col, **x.boot)


# layer-wise consensus: sink-free per head (the default), GQA-aware over KV groups (the cross-model
# comparison), and the with-sink reference; each with instance-bootstrap intervals
for _col in (CONSENSUS_COL, "rho_nosink", CONSENSUS_GROUP_COL, "rho_group_nosink", "consensus_withsink"):
    section(f"{_col}_profiles", [_col])(functools.partial(_profiles, _col))


@section("consensus_trend", [CONSENSUS_COL])
def _consensus_trend(x: SectionInput) -> Tables:
    cols = [c for c in (CONSENSUS_COL, CONSENSUS_GROUP_COL, "consensus_withsink") if has_columns(x.df, [c])]
    return pd.concat([profile_trend(x.df, c, **x.boot) for c in cols], ignore_index=True)


@section("selection_comparison", ["hallucinated"])
def _selection_comparison(x: SectionInput) -> Tables:
    return selection_comparison(x.df, n_boot=x.cfg.n_boot, confidence=x.cfg.confidence, seed=x.cfg.seed)


# what the server costs: each press against its paged / head-uniform variants (kvroute.presses.constraints)
@section("serving_cost", ["hallucinated"], ["serving_pairs", "serving_by_ratio", "serving_detect"],
         applies=lambda x: None if has_constrained(x.df["press"].unique()) else "no press with a serving constraint")
def _serving_cost(x: SectionInput) -> Tables:
    return serving_cost(x.df, min_instances=x.cfg.league_min_instances, **x.boot)


# compress once, ask many: H, GER and α* by turn of a conversation, and each later turn against the first
@section("turns", ["hallucinated", "outcome", "turn", "conversation"], ["turn_pairs", "turn_curves", "turn_cliffs"],
         applies=lambda x: None if has_turns(x.df) else "no conversation of several turns (decoding.history unset)",
         every_turn=True)
def _turns(x: SectionInput) -> Tables:
    return (turn_pairs(x.df, min_instances=x.cfg.league_min_instances, **x.boot), turn_curves(x.df, **x.boot),
            turn_cliffs(x.df, **x.boot))


@section("redundancy", ["evidence_heads", "reachable"], ["redundancy", "redundancy_fit"])
def _redundancy(x: SectionInput) -> Tables:
    return redundancy_table(x.df)


# retrieval heads (metric 'retrieval'): does the answer's survival in them predict hallucination within ratio?
@section("retrieval", ["retrieval_hits", "answer_kept_heads", "ger", "hallucinated"])
def _retrieval(x: SectionInput) -> Tables:
    return retrieval_vs_ger(x.df, n_boot=x.cfg.n_boot, seed=x.cfg.seed)


# the probes that count: which candidate value is the answer (identity), and the gold's logit lens
@section("identity_probe", ["lens_candidates"])
def _identity_probe(x: SectionInput) -> Tables:
    c = x.cfg
    return identity_by_ratio(x.df, folds=c.probe_folds, n_boot=c.n_boot, confidence=c.confidence, seed=c.seed)


@section("lens_profiles", ["lens_gold_logprob"])
def _lens_profiles(x: SectionInput) -> Tables:
    return lens_profiles(x.df)


# a control that reads the (never compressed) question: the answer type
@section("probe", ["probe_features", "answer_type"])
def _probe(x: SectionInput) -> Tables:
    return probe_by_ratio(x.df, folds=x.cfg.probe_folds, seed=x.cfg.seed)
