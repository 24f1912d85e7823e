"""Everything at once: :func:`analyze` returns the headline numbers as JSON data (``summary.json``).

:func:`run_analysis` returns the same summary plus the tidy tables the report draws from. It runs
the sections registered in :mod:`kvroute.analysis.sections`, in order; each runs only when the records
carry the columns it needs, and a skipped section is named in ``summary["notes"]`` with the reason,
never filled with a made-up number.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from kvroute import __version__
from kvroute.analysis.common import ALL, PRESS_KEYS, AnalysisError, jsonable, with_defaults
from kvroute.analysis.curves import CONSENSUS_COL, CONSENSUS_GROUP_COL, TREND_MEANING
from kvroute.analysis.league import LEAGUE_RULE
from kvroute.analysis.load import drop_errors, rename_legacy_fields
from kvroute.analysis.sections import SECTIONS, SectionInput, first_turns
from kvroute.analysis.settings import AnalysisConfig

__all__ = ["Analysis", "AnalysisConfig", "analyze", "run_analysis"]

log = logging.getLogger(__name__)


@dataclass
class Analysis:
    """The JSON summary and the tables behind it (DataFrames keyed by name)."""

    summary: dict[str, Any]
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)


def analyze(df: pd.DataFrame, *, delta: float = 0.05, n_boot: int = 1000, seed: int = 0,
            **settings: Any) -> dict[str, Any]:
    """Every headline number of a run as JSON-serialisable data (becomes ``summary.json``).

    ``settings`` are further :class:`AnalysisConfig` fields (``confidence``, ``ger_threshold``, …).
    """
    return run_analysis(df, AnalysisConfig(delta=delta, n_boot=n_boot, seed=seed, **settings)).summary


def run_analysis(df: pd.DataFrame, config: AnalysisConfig | None = None) -> Analysis:
    """Run every analysis the records support; return the summary and the tables."""
    cfg = config or AnalysisConfig()
    # cells recorded with status "error" have no metrics: no estimator sees them, the summary counts them
    df, cell_errors = drop_errors(df)
    n_errors = sum(g["n"] for g in cell_errors)
    if df.empty:
        raise AnalysisError("there are no records to analyse; did the sweep finish any cell?"
                            + (f" ({n_errors} cells errored, first: {cell_errors[0]['press']}: "
                               f"{cell_errors[0]['error']})" if cell_errors else ""))
    df = with_defaults(rename_legacy_fields(df))  # stores from before the consensus rename still analyse
    tables: dict[str, pd.DataFrame] = {}
    notes: dict[str, str] = {}
    if cell_errors:
        notes["cell_errors"] = (f"{n_errors} cells errored and are left out of every estimate: "
                                + "; ".join(f"{g['n']} × {g['press']} ({g['model']}): {g['error']}"
                                            for g in cell_errors[:5])
                                + (f"; {len(cell_errors) - 5} more reasons" if len(cell_errors) > 5 else ""))

    first = first_turns(df)
    if len(first) < len(df):
        notes["later_turns"] = (f"{len(df) - len(first)} records of turns after the first are read by the turn "
                                "analysis only; every other estimate is on turn 1 of each conversation "
                                f"({len(first)} records)")
    one, every = SectionInput(first, cfg, tables), SectionInput(df, cfg, tables)
    for name, sec in SECTIONS.items():
        x = every if sec.every_turn else one
        reason = sec.skip_reason(x)
        if reason is not None:
            notes[name] = reason
            continue
        try:
            tables.update(sec.tables(x))
        except AnalysisError as e:
            notes[name] = f"skipped: {e}"
            log.warning("analysis section %s skipped: %s", name, e)

    summary = {
        "kvroute_version": __version__,
        "n_records": len(df), "n_instances": int(df["instance_id"].nunique()),
        "n_instances_evidence_none": (int(df.loc[df["evidence"] == "none", "instance_id"].nunique())
                                      if "evidence" in df.columns else 0),
        "models": sorted(df["model"].unique()), "presses": sorted(df["press"].unique()),
        "regimes": sorted(df["regime"].unique()), "families": sorted(df["family"].unique()),
        "ratios": sorted(float(r) for r in df["ratio"].unique()),
        "settings": {**asdict(cfg), "bootstrap_unit": "instance_id (cluster bootstrap, percentile intervals)",
                     "sigmoid": "H(α) = lo + (hi − lo) / (1 + exp(−k (α − α*))), least squares with 0 ≤ lo ≤ hi ≤ 1; "
                                "the point estimate and every bootstrap replicate pass the same edge rule (midpoint in "
                                "the grid's first or last gap = below/beyond the grid unless the bound pins lo = 0 or "
                                "hi = 1); an interval end that falls on a censored replicate is left open; the "
                                "reported interval is the hull of the sigmoid's and the monotone crossing's, 'cannot "
                                "decide' where they are disjoint, it spans more than 0.35 or the curve has fewer than "
                                "10 instances",
                     "caused_view": "cliffs_caused / caused_*: the same estimators on the instances answered "
                                    "'correct' with the full cache (H(0) = 0): the hallucination compression causes",
                     "safe_ratio_rule": f"largest α whose paired excess H(α) − H(0) an exact test on the discordant "
                                        f"pairs shows ≤ δ={cfg.delta:g} at {cfg.confidence:.0%} confidence, at it and "
                                        "every smaller ratio (a certification, not an order)",
                     "press_league": LEAGUE_RULE.format(n=cfg.league_min_instances, alpha=round(1 - cfg.confidence, 6)),
                     "globally_evicted": f"ger_all_layers ≥ {cfg.ger_threshold:g}",
                     "ger_link": "headline = within instance at matched ratios: per (model, press, regime, family), "
                                 "conditional logit of hallucinated on the cell's ger with the instance as stratum and "
                                 "one effect per ratio, compressed cells with defined GER, instances whose cells all "
                                 "agree left out, ridge 1e-3, separation checked in every bootstrap replicate (an end "
                                 "it reaches is open); odds ratio per +0.1 GER with its instance-clustered percentile "
                                 "interval; the Mantel–Haenszel P(H | evicted) − P(H | retained) over ratio strata "
                                 "compares different instances (confounded by difficulty). ger_pearson_r is pooled "
                                 "across ratios (one point per ratio): both curves rise with α, so it is confounded by "
                                 "α and kept only to compare with the paper's r = 0.79–0.93; "
                                 "p_h_given_evicted/retained are pooled over ratios too",
                     "failure": "outcome other than 'correct' (listed, distractor, abstained, partial or fabricated; "
                                "not an "
                                "F1 threshold); failures whose GER is undefined (ger_all_layers missing or "
                                "evidence 'none') are the class 'undefined', never 'retained'",
                     "consensus": f"{CONSENSUS_COL}: distinct argmax keys / query heads at the last prompt token, "
                                  "argmax after the first n_sink positions (attention sinks excluded); "
                                  f"{CONSENSUS_GROUP_COL}: the same over KV groups (head-averaged attention per "
                                  "group), the value comparable across models with different GQA group sizes; trend = "
                                  "last third of the layers minus the first third at the full cache, 'funnel' / "
                                  "'diversifying' only when the bootstrap interval excludes 0"},
        "headline": _headline(tables),
        # errored cells (status "error"), per (model, press, error); not in n_records nor any estimate
        "cell_errors": {"n": n_errors, "groups": cell_errors},
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


def _caused_headline(c: pd.DataFrame) -> dict[str, Any]:
    """The caused view's numbers for one headline row (families pooled)."""
    if c.empty:
        return {"caused_n_instances": 0}
    r = c.iloc[0]
    return {"caused_n_instances": int(r.get("n_instances") or 0), "caused_alpha_star": _opt(r.get("alpha_star")),
            "caused_alpha_star_ci": ([r.get("alpha_star_low"), r.get("alpha_star_high")]
                                     if r.get("alpha_star_identified") == "identified" else None),
            "caused_alpha_star_identified": r.get("alpha_star_identified"),
            "caused_alpha_star_interval": r.get("alpha_star_interval"), "caused_cliff_status": r.get("status"),
            "caused_alpha_half": _opt(r.get("alpha_half")),
            "caused_alpha_half_ci": ([r.get("alpha_half_low"), r.get("alpha_half_high")]
                                     if r.get("alpha_half_identified") == "identified" else None),
            "caused_alpha_half_interval": r.get("alpha_half_interval")}


def _opt(v: Any) -> Any:
    return None if v is None or (isinstance(v, float) and v != v) else v


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
        within = _pick(tables.get("ger_within_ratio"), fam)
        dec = _pick(tables.get("decomposition"), key)
        dec = dec[dec["ratio"] > 0] if not dec.empty else dec
        verdict = _pick(tables.get("length_verdicts"), key)
        probe = _pick(tables.get("probe"), key)
        safe = c.get("safe_ratio")
        ident = _pick(tables.get("identity_probe"), key)
        ident0 = ident[ident["ratio"] == 0] if not ident.empty else ident
        ident_safe = ident[ident["ratio"] == safe] if not ident.empty and safe is not None else pd.DataFrame()
        ident_max = ident[ident["ratio"] == ident["ratio"].max()] if not ident.empty else ident
        rows.append({
            **fam, **_caused_headline(_pick(tables.get("cliffs_caused"), fam)), "alpha_star": c.get("alpha_star"),
            # an interval only where both ends are identified; otherwise the statement says what is not
            "alpha_star_ci": ([c.get("alpha_star_low"), c.get("alpha_star_high")]
                              if c.get("alpha_star_identified") == "identified" else None),
            "alpha_star_identified": c.get("alpha_star_identified"),
            "alpha_star_interval": c.get("alpha_star_interval"),
            "alpha_star_boot_edges": {"below_grid": c.get("boot_below_grid"), "beyond_grid": c.get("boot_beyond_grid"),
                                      "no_cliff": c.get("boot_no_cliff")},
            "alpha_half": c.get("alpha_half"),
            "alpha_half_ci": ([c.get("alpha_half_low"), c.get("alpha_half_high")]
                              if c.get("alpha_half_identified") == "identified" else None),
            "alpha_half_identified": c.get("alpha_half_identified"),
            "alpha_half_interval": c.get("alpha_half_interval"),
            "cliff_status": c.get("status"), "cliff_note": c.get("reason"),
            "alpha_chi_max": c.get("alpha_chi_max"), "chi_max": c.get("chi_max"), "safe_ratio": safe,
            "h_baseline": c.get("h0"), "ger_pearson_r": _first(corr, "pearson_r"),
            "ger_pearson_p": _first(corr, "pearson_p"),
            "ger_spearman_r": _first(corr, "spearman_r"),
            "p_h_given_evicted": _first(cond, "p_h_evicted"), "p_h_given_retained": _first(cond, "p_h_kept"),
            **_ger_within_headline(within),
            "erasure_dominated_ratios": (dec.loc[dec["dominant"] == "erasure", "ratio"].tolist()
                                         if not dec.empty else []),
            "retained_dominated_ratios": (dec.loc[dec["dominant"] == "retained", "ratio"].tolist()
                                          if not dec.empty else []),
            "context_length_verdict": _first(verdict, "verdict"), "context_length_beta": _first(verdict, "beta"),
            "identity_accuracy_baseline": _first(ident0, "accuracy"),
            "identity_accuracy_baseline_ci": [_first(ident0, "accuracy_low"), _first(ident0, "accuracy_high")],
            "identity_chance": _first(ident0, "chance"),
            "identity_null_baseline": _first(ident0, "null_accuracy"),
            "identity_null_high_baseline": _first(ident0, "null_high"),
            "identity_n_instances_baseline": _first(ident0, "n_instances"),
            "identity_untrained_baseline": _first(ident0, "untrained"),
            "identity_accuracy_at_safe_ratio": _first(ident_safe, "accuracy"),
            "identity_max_ratio": _first(ident_max, "ratio"),
            "identity_accuracy_at_max_ratio": _first(ident_max, "accuracy"),
            "identity_accuracy_at_max_ratio_ci": [_first(ident_max, "accuracy_low"),
                                                  _first(ident_max, "accuracy_high")],
            "identity_chance_at_max_ratio": _first(ident_max, "chance"),
            "lens_logprob_baseline": _first(ident0, "lens_logprob_final"),
            "lens_logprob_at_max_ratio": _first(ident_max, "lens_logprob_final"),
            # control (reads the question, which the agnostic regime never compresses): not evidence of anything
            "control_type_probe_f1_baseline": (_first(probe[probe["ratio"] == 0], "macro_f1")
                                               if not probe.empty else None),
            "control_type_probe_f1_at_safe_ratio": (_first(probe[probe["ratio"] == safe], "macro_f1")
                                                    if not probe.empty and safe is not None else None),
            **_consensus_headline(tables.get("consensus_trend"), key),
        })
    return rows


def _consensus_headline(trend: pd.DataFrame | None, key: dict[str, Any]) -> dict[str, Any]:
    """The full-cache depth trend of the sink-free consensus, per head and per KV group (see :func:`profile_trend`)."""
    out: dict[str, Any] = {}
    for prefix, col in (("consensus", CONSENSUS_COL), ("consensus_group", CONSENSUS_GROUP_COL)):
        t = _pick(trend, {**key, "measure": col})
        t = t[t["ratio"] == 0] if not t.empty else t
        label = _first(t, "trend")
        out.update({f"{prefix}_trend": label, f"{prefix}_trend_meaning": TREND_MEANING.get(label) if label else None,
                    f"{prefix}_early": _first(t, "early"), f"{prefix}_late": _first(t, "late"),
                    f"{prefix}_change_ci": [_first(t, "change_low"), _first(t, "change_high")]})
    out["consensus_measure"] = (f"{CONSENSUS_COL} (per query head, sinks excluded); {CONSENSUS_GROUP_COL} is the one "
                                "to compare across models with different GQA group sizes")
    return out


def _ger_within_headline(w: pd.DataFrame) -> dict[str, Any]:
    """The within-ratio GER–hallucination link for one headline row (see :func:`within_ratio_link`)."""
    return {"ger_within_verdict": _first(w, "verdict"), "ger_within_note": _first(w, "note"),
            "ger_or_per_tenth": _first(w, "or_per_tenth"),
            "ger_or_per_tenth_ci": [_first(w, "or_per_tenth_low"), _first(w, "or_per_tenth_high")],
            "ger_slope": _first(w, "slope"), "ger_slope_ci": [_first(w, "slope_low"), _first(w, "slope_high")],
            "ger_risk_difference": _first(w, "risk_difference"),
            "ger_risk_difference_ci": [_first(w, "risk_difference_low"), _first(w, "risk_difference_high")],
            "ger_within_n_cells": _first(w, "n_cells_fit"), "ger_within_n_instances": _first(w, "n_instances_fit"),
            "ger_within_n_strata": _first(w, "n_strata_fit")}
