"""Retention, accessibility and utilization side by side per ratio; breakdowns; layer-wise profiles.

Per (model, press, regime, ratio), pooled over families:

* retention = 1 − mean GER (``retention``), and 1 − mean ``ger_evidence`` (``retention_evidence``);
* accessibility = mean ``evidence_attention_mass`` / mean ``evidence_attention_mass_full`` (a ratio
  of means, steadier than a mean of per-cell ratios when the full mass is small),
  ``reachable`` share, ``routed_reachable`` share;
* utilization = mean ``f1``, mean ``exact``, mean ``gold_logprob_delta``, hallucination rate.

Columns the records lack are simply left out.

Layer-wise profiles (:func:`layer_profiles`) carry instance-bootstrap intervals; :func:`profile_trend`
states where the heads agree (early against late layers). Both read the sink-free per-head
consensus by default (``consensus_nosink``); ``consensus_group_nosink`` (KV groups) is the one to
compare across models with different GQA group sizes.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import numpy as np
import pandas as pd

from kvroute.analysis.common import (
    PRESS_KEYS,
    as_key,
    attach_baseline,
    group_seed,
    has_columns,
    require_columns,
    stack_vectors,
)

_MEANS = {"ger": "ger", "ger_evidence": "ger_evidence", "reachable": "reachability",
          "routed_reachable": "routed_reachability",
          "f1": "f1", "exact": "exact", "gold_logprob_delta": "logprob_delta", "hallucinated": "hallucination",
          "evidence_attention_mass": "_mass", "evidence_attention_mass_full": "_mass_full"}


def _numeric(s: pd.Series) -> pd.Series:
    return pd.to_numeric(s.astype(float) if s.dtype == bool else s, errors="coerce")


def routing_curves(df: pd.DataFrame, *, keys: Sequence[str] = PRESS_KEYS) -> pd.DataFrame:
    """One row per (group, ratio) with the retention / accessibility / utilization means that exist."""
    keys = list(keys)
    data = attach_baseline(df)
    present = {c: name for c, name in _MEANS.items() if has_columns(data, [c])}
    num = pd.DataFrame({name: _numeric(data[c]) for c, name in present.items()}, index=data.index)
    num[[*keys, "ratio"]] = data[[*keys, "ratio"]]
    out = num.groupby([*keys, "ratio"], sort=True).mean(numeric_only=True)
    out["n_cells"] = num.groupby([*keys, "ratio"], sort=True).size()
    out = out.reset_index()
    if "ger" in out:
        out["retention"] = 1 - out["ger"]
    if "ger_evidence" in out:
        out["retention_evidence"] = 1 - out["ger_evidence"]
    if "_mass" in out and "_mass_full" in out:
        with np.errstate(all="ignore"):
            out["accessibility"] = out["_mass"] / out["_mass_full"].where(out["_mass_full"] > 0)
    return out.drop(columns=[c for c in ("_mass", "_mass_full") if c in out])


def breakdown(df: pd.DataFrame, by: str, *, keys: Sequence[str] = ("model", "press"),
              values: Sequence[str] = ("f1", "hallucinated")) -> pd.DataFrame:
    """Means of ``values`` per (keys, ratio, ``by``), e.g. ``by="answer_type"`` or ``"question_type"``."""
    data = attach_baseline(df)
    require_columns(data, [by, *keys], f"the breakdown by {by}")
    vals = [v for v in values if has_columns(data, [v])]
    num = pd.DataFrame({v: _numeric(data[v]) for v in vals}, index=data.index)
    num[[*keys, "ratio", by]] = data[[*keys, "ratio", by]]
    grouped = num.groupby([*keys, "ratio", by], sort=True)
    out = grouped.mean(numeric_only=True)
    out["n_cells"] = grouped.size()
    return out.reset_index()


#: the consensus vector every headline and figure reads by default: per query head, sinks excluded
CONSENSUS_COL = "consensus_nosink"
#: the GQA-aware one (KV groups, sinks excluded): the fair comparison across models with different group sizes
CONSENSUS_GROUP_COL = "consensus_group_nosink"
#: trend labels of :func:`profile_trend`
TREND_LABELS: tuple[str, ...] = ("diversifying", "funnel", "flat")
TREND_MEANING = {"diversifying": "heads agree early and diversify late",
                 "funnel": "heads converge late (funnel)",
                 "flat": "no change beyond the tolerance at the confidence level"}


def _instance_sums(g: pd.DataFrame, col: str) -> tuple[np.ndarray, np.ndarray]:
    """Per instance of one group: the per-layer sums and counts of finite values, ``[n_instances, L]`` each."""
    v = stack_vectors(g[col])  # [cells, L]
    ok = np.isfinite(v)
    codes, _ = pd.factorize(g["instance_id"].to_numpy())
    n = codes.max() + 1 if codes.size else 0
    sums, counts = np.zeros((n, v.shape[1])), np.zeros((n, v.shape[1]))
    np.add.at(sums, codes, np.where(ok, v, 0.0))
    np.add.at(counts, codes, ok.astype(float))
    return sums, counts


def _group_means(g: pd.DataFrame, col: str, n_boot: int,
                 rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, int]:
    """The mean per-layer vector over the group's cells, ``n_boot`` instance-bootstrap replicates of it
    (``[n_boot, L]``: instances resampled with replacement, each with all its cells), and the instance count."""
    sums, counts = _instance_sums(g, col)
    with np.errstate(all="ignore"):
        mean = sums.sum(0) / counts.sum(0)
        if n_boot <= 0 or len(sums) < 2:
            return mean, np.zeros((0, sums.shape[1])), len(sums)
        idx = rng.integers(0, len(sums), (n_boot, len(sums)))
        reps = sums[idx].sum(1) / counts[idx].sum(1)  # [n_boot, L]
    return mean, reps, len(sums)


def _percentiles(reps: np.ndarray, confidence: float) -> tuple[np.ndarray, np.ndarray]:
    if reps.shape[0] == 0:
        nan = np.full(reps.shape[1:], np.nan)
        return nan, nan
    q = 100 * (1 - confidence) / 2
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nanpercentile(reps, q, axis=0), np.nanpercentile(reps, 100 - q, axis=0)


def layer_profiles(df: pd.DataFrame, col: str = CONSENSUS_COL, *, keys: Sequence[str] = PRESS_KEYS,
                   n_boot: int = 1000, confidence: float = 0.95, seed: int = 0) -> pd.DataFrame:
    """Mean per-layer vector of ``col`` per (group, ratio), tidy: one row per (group, ratio, layer).

    Columns: the keys, ``ratio``, ``layer`` (0-based), ``value`` (mean over cells), ``low``/``high``
    (percentile interval at ``confidence`` from ``n_boot`` bootstrap replicates resampling instances,
    each with all its cells; NaN with ``n_boot=0`` or a single instance), ``n_cells``, ``n_instances``.
    The default column is the sink-free per-head consensus.
    """
    keys = list(keys)
    data = attach_baseline(df)
    require_columns(data, [col], f"the layer-wise {col} profile")
    rows = []
    for key, g in data[data[col].notna()].groupby([*keys, "ratio"], sort=True):
        mean, reps, n_inst = _group_means(g, col, n_boot, group_seed(seed, (col, key)))
        if mean.size == 0:
            continue
        low, high = _percentiles(reps, confidence)
        k = as_key([*keys, "ratio"], key)
        rows += [{**k, "layer": layer, "value": float(m), "low": float(lo), "high": float(hi), "n_cells": len(g),
                  "n_instances": n_inst} for layer, (m, lo, hi) in enumerate(zip(mean, low, high, strict=True))]
    return pd.DataFrame(rows, columns=[*keys, "ratio", "layer", "value", "low", "high", "n_cells", "n_instances"])


def _early_late(v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Means over the first and the last third of the layers (at least one layer each), along the last axis."""
    k = max(1, v.shape[-1] // 3)
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nanmean(v[..., :k], axis=-1), np.nanmean(v[..., -k:], axis=-1)


def trend_label(change: float, low: float, high: float, min_change: float) -> str | None:
    """``diversifying`` when the late-minus-early change is above 0 at confidence (its interval's low
    end > 0) and at least ``min_change``; ``funnel`` when it is below 0 likewise; else ``flat``."""
    if not np.isfinite(change):
        return None
    if np.isfinite(low) and low > 0 and change >= min_change:
        return "diversifying"
    if np.isfinite(high) and high < 0 and change <= -min_change:
        return "funnel"
    return "flat"


def profile_trend(df: pd.DataFrame, col: str = CONSENSUS_COL, *, keys: Sequence[str] = PRESS_KEYS,
                  n_boot: int = 1000, confidence: float = 0.95, seed: int = 0,
                  min_change: float = 0.02) -> pd.DataFrame:
    """Where the heads agree, per (group, ratio): early (first third of the layers) against late (last third).

    Columns: the keys, ``ratio``, ``measure`` (= ``col``), ``n_layers``, ``early``, ``late``,
    ``change`` (late − early; positive = heads diversify with depth), ``change_low``/``change_high``
    (the instance bootstrap's percentile interval, the same resamples as :func:`layer_profiles`),
    ``trend`` (:func:`trend_label`), ``n_instances``. Low consensus = heads agree.
    """
    keys = list(keys)
    data = attach_baseline(df)
    require_columns(data, [col], f"the {col} depth trend")
    rows = []
    for key, g in data[data[col].notna()].groupby([*keys, "ratio"], sort=True):
        mean, reps, n_inst = _group_means(g, col, n_boot, group_seed(seed, (col, key)))
        if mean.size == 0:
            continue
        early, late = _early_late(mean)
        e_r, l_r = _early_late(reps)
        lo, hi = _percentiles((l_r - e_r)[:, None], confidence)
        change = float(late - early)
        rows.append({**as_key([*keys, "ratio"], key), "measure": col, "n_layers": int(mean.size),
                     "early": float(early), "late": float(late), "change": change,
                     "change_low": float(lo[0]), "change_high": float(hi[0]),
                     "trend": trend_label(change, float(lo[0]), float(hi[0]), min_change) if mean.size > 1 else None,
                     "n_instances": n_inst})
    return pd.DataFrame(rows, columns=[*keys, "ratio", "measure", "n_layers", "early", "late", "change", "change_low",
                                       "change_high", "trend", "n_instances"])
