"""Everything at once: :func:`analyze` returns the headline numbers as JSON data (``summary.json``).

:func:`run_analysis` returns the same summary plus the tidy tables the report draws from. Each
section runs only when the records carry the columns it needs; a skipped section is named in
``summary["notes"]`` with the reason, never filled with a made-up number.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from kvroute import __version__
from kvroute.analysis.cliff import cliff_tables
from kvroute.analysis.common import ALL, PRESS_KEYS, AnalysisError, has_columns, jsonable, with_defaults
from kvroute.analysis.compare import selection_comparison
from kvroute.analysis.context import LONG_CONTEXT, cliff_vs_length
from kvroute.analysis.correlation import conditional_hallucination, ger_hallucination_correlation
from kvroute.analysis.curves import breakdown, layer_profiles, routing_curves
from kvroute.analysis.decomposition import failure_decomposition, rigidity_comparison
from kvroute.analysis.probe import probe_by_ratio
from kvroute.analysis.redundancy import redundancy_table
from kvroute.errors import ConfigError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class AnalysisConfig:
    """The analysis's operational choices; validated on construction."""

    delta: float = 0.05  # safe ratio: allowed rise of H over the baseline
    n_boot: int = 1000  # bootstrap replicates (resampling instances)
    seed: int = 0
    confidence: float = 0.95
    f1_threshold: float = 0.5  # a cell with F1 below this (or hallucinated) is a failure
    ger_threshold: float = 1.0  # ger_all_layers at or above this = answer globally evicted
    min_amplitude: float = 0.1  # H must rise this much for a cliff to be fitted
    long_context_family: str = LONG_CONTEXT
    length_edges: tuple[float, ...] | None = None  # context-length bin edges (default: half octaves)
    probe_folds: int = 5

    def __post_init__(self) -> None:
        checks = [("delta", 0 < self.delta < 1, "in (0, 1)"), ("n_boot", self.n_boot >= 10, "at least 10"),
                  ("confidence", 0.5 <= self.confidence < 1, "in [0.5, 1)"),
                  ("f1_threshold", 0 <= self.f1_threshold <= 1, "in [0, 1]"),
                  ("ger_threshold", 0 < self.ger_threshold <= 1, "in (0, 1]"),
                  ("min_amplitude", 0 < self.min_amplitude < 1, "in (0, 1)"),
                  ("probe_folds", self.probe_folds >= 2, "at least 2")]
        for name, ok, allowed in checks:
            if not ok:
                raise ConfigError(f"analysis setting {name}={getattr(self, name)!r} is out of range; it must be {allowed}")


@dataclass
class Analysis:
    """The JSON summary and the tables behind it (DataFrames keyed by name)."""

    summary: dict[str, Any]
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)


def analyze(df: pd.DataFrame, *, delta: float = 0.05, n_boot: int = 1000, seed: int = 0, **settings: Any) -> dict[str, Any]:
    """Every headline number of a run as JSON-serialisable data (becomes ``summary.json``).

    ``settings`` are further :class:`AnalysisConfig` fields (``confidence``, ``f1_threshold``, …).
    """
    return run_analysis(df, AnalysisConfig(delta=delta, n_boot=n_boot, seed=seed, **settings)).summary


def run_analysis(df: pd.DataFrame, config: AnalysisConfig | None = None) -> Analysis:
    """Run every analysis the records support; return the summary and the tables."""
    cfg = config or AnalysisConfig()
    if df.empty:
        raise AnalysisError("there are no records to analyse; did the sweep finish any cell?")
    df = with_defaults(df)
    tables: dict[str, pd.DataFrame] = {}
    notes: dict[str, str] = {}

    def section(name: str, needs: list[str], fn: Callable[[], dict[str, pd.DataFrame]]) -> None:
        missing = [c for c in needs if not has_columns(df, [c])]
        if missing:
            notes[name] = f"skipped: the records have no {', '.join(missing)}"
            return
        try:
            tables.update(fn())
        except AnalysisError as e:
            notes[name] = f"skipped: {e}"
            log.warning("analysis section %s skipped: %s", name, e)

    boot: dict[str, Any] = dict(n_boot=cfg.n_boot, confidence=cfg.confidence, seed=cfg.seed)
    section("cliff", ["hallucinated"], lambda: dict(zip(
        ("cliff_curves", "cliffs"),
        cliff_tables(df, delta=cfg.delta, min_amplitude=cfg.min_amplitude, **boot), strict=True)))
    if (df["family"] == cfg.long_context_family).any():
        section("context_length", ["hallucinated", "context_tokens"], lambda: dict(zip(
            ("length_cliffs", "length_verdicts"),
            cliff_vs_length(df, family=cfg.long_context_family, edges=cfg.length_edges,
                            min_amplitude=cfg.min_amplitude, **boot), strict=True)))
    else:
        notes["context_length"] = f"skipped: no {cfg.long_context_family!r} family cells in these records"
    section("ger_correlation", ["ger", "hallucinated"],
            lambda: dict(zip(("ger_points", "ger_correlation"), ger_hallucination_correlation(df), strict=True)))
    section("conditional", ["ger_all_layers", "hallucinated"], lambda: {
        "conditional": conditional_hallucination(df, threshold=cfg.ger_threshold),
        "conditional_by_ratio": conditional_hallucination(df, threshold=cfg.ger_threshold, keys=PRESS_KEYS,
                                                          by_ratio=True)})
    section("decomposition", ["ger_all_layers"], lambda: {
        "decomposition": failure_decomposition(df, f1_threshold=cfg.f1_threshold, ger_threshold=cfg.ger_threshold)})
    section("rigidity", ["ger", "ger_all_layers", "consensus"], lambda: {
        "rigidity": rigidity_comparison(df, f1_threshold=cfg.f1_threshold, ger_threshold=cfg.ger_threshold)})
    section("routing", [], lambda: {"routing": routing_curves(df)})
    for by in ("answer_type", "question_type"):
        section(f"by_{by}", [by], functools.partial(lambda b: {f"by_{b}": breakdown(df, b)}, by))
    for col in ("consensus", "rho", "consensus_nosink"):
        section(f"{col}_profiles", [col], functools.partial(lambda c: {f"{c}_profiles": layer_profiles(df, c)}, col))
    section("selection_comparison", ["hallucinated"], lambda: {
        "selection_comparison": selection_comparison(df, n_boot=cfg.n_boot, confidence=cfg.confidence,
                                                     seed=cfg.seed)})
    section("redundancy", ["evidence_heads", "reachable"], lambda: dict(zip(
        ("redundancy", "redundancy_fit"), redundancy_table(df), strict=True)))
    section("probe", ["probe_features", "answer_type"],
            lambda: {"probe": probe_by_ratio(df, folds=cfg.probe_folds, seed=cfg.seed)})

    summary = {
        "kvroute_version": __version__,
        "n_records": len(df), "n_instances": int(df["instance_id"].nunique()),
        "n_instances_evidence_none": (int(df.loc[df["evidence"] == "none", "instance_id"].nunique())
                                      if "evidence" in df.columns else 0),
        "models": sorted(df["model"].unique()), "presses": sorted(df["press"].unique()),
        "regimes": sorted(df["regime"].unique()), "families": sorted(df["family"].unique()),
        "ratios": sorted(float(r) for r in df["ratio"].unique()),
        "settings": {**asdict(cfg), "bootstrap_unit": "instance_id (cluster bootstrap, percentile intervals)",
                     "sigmoid": "H(α) = lo + (hi − lo) / (1 + exp(−k (α − α*))), least squares",
                     "safe_ratio_rule": f"largest α with the one-sided {cfg.confidence:.0%} bootstrap upper bound of "
                                        f"H(α) − H(0) ≤ δ={cfg.delta:g} at it and every smaller ratio",
                     "globally_evicted": f"ger_all_layers ≥ {cfg.ger_threshold:g}",
                     "failure": f"hallucinated or f1 < {cfg.f1_threshold:g}"},
        "headline": _headline(tables),
        "notes": notes,
    }
    for name, t in tables.items():
        summary[name] = jsonable(t)
    return Analysis(jsonable(summary), tables)


def _pick(t: pd.DataFrame | None, key: dict[str, Any]) -> pd.DataFrame:
    if t is None or t.empty:
        return pd.DataFrame()
    m = np.ones(len(t), bool)
    for k, v in key.items():
        if k in t.columns:
            m &= (t[k] == v).to_numpy()
    return t[m]


def _first(t: pd.DataFrame, col: str) -> Any:
    return t[col].iloc[0] if not t.empty and col in t.columns else None


def _headline(tables: dict[str, pd.DataFrame]) -> list[dict[str, Any]]:
    """One row per (model, press, regime): the numbers a reader looks for first, families pooled."""
    cliffs = tables.get("cliffs")
    if cliffs is None or cliffs.empty:
        return []
    rows = []
    # families pooled ("all"); with a single family in the records, that family
    family = ALL if (cliffs["family"] == ALL).any() else cliffs["family"].iloc[0]
    for _, c in cliffs[cliffs["family"] == family].iterrows():
        key = {k: c[k] for k in PRESS_KEYS}
        fam = {**key, "family": c["family"]}
        corr = _pick(tables.get("ger_correlation"), fam)
        cond = _pick(tables.get("conditional"), fam)
        dec = _pick(tables.get("decomposition"), key)
        dec = dec[dec["ratio"] > 0] if not dec.empty else dec
        verdict = _pick(tables.get("length_verdicts"), key)
        probe = _pick(tables.get("probe"), key)
        safe = c.get("safe_ratio")
        rows.append({
            **fam, "alpha_star": c.get("alpha_star"), "alpha_star_ci": [c.get("alpha_star_low"), c.get("alpha_star_high")],
            "cliff_status": c.get("status"), "cliff_note": c.get("reason"),
            "alpha_chi_max": c.get("alpha_chi_max"), "chi_max": c.get("chi_max"), "safe_ratio": safe,
            "h_baseline": c.get("h0"), "ger_pearson_r": _first(corr, "pearson_r"), "ger_pearson_p": _first(corr, "pearson_p"),
            "ger_spearman_r": _first(corr, "spearman_r"),
            "p_h_given_evicted": _first(cond, "p_h_evicted"), "p_h_given_retained": _first(cond, "p_h_kept"),
            "erasure_dominated_ratios": dec.loc[dec["dominant"] == "erasure", "ratio"].tolist() if not dec.empty else [],
            "retained_dominated_ratios": dec.loc[dec["dominant"] == "retained", "ratio"].tolist() if not dec.empty else [],
            "context_length_verdict": _first(verdict, "verdict"), "context_length_beta": _first(verdict, "beta"),
            "probe_f1_baseline": _first(probe[probe["ratio"] == 0], "macro_f1") if not probe.empty else None,
            "probe_f1_at_safe_ratio": (_first(probe[probe["ratio"] == safe], "macro_f1")
                                       if not probe.empty and safe is not None else None),
        })
    return rows
