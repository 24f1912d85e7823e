"""Percentile bootstrap over task instances (the resampling unit is ``instance_id``, not the cell).

Cells of one instance are not independent — the same instance is answered at every ratio, by
every press — so every interval here resamples *instances* with replacement and carries all of
an instance's cells along (a cluster bootstrap). Replicates are computed as weighted means with
multinomial instance counts, so a thousand replicates cost one matrix product.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import numpy as np
import pandas as pd

from kvroute.analysis.common import AnalysisError, as_key, group_seed, require_columns


def resample_weights(n: int, n_boot: int, rng: np.random.Generator) -> np.ndarray:
    """How often each of ``n`` instances is drawn in each replicate: int array ``[n_boot, n]``."""
    if n < 1:
        raise AnalysisError("cannot bootstrap an empty set of instances")
    if n_boot < 1:
        raise AnalysisError(f"n_boot must be at least 1, got {n_boot}")
    return rng.multinomial(n, np.full(n, 1.0 / n), size=n_boot)


def instance_matrix(df: pd.DataFrame, value_col: str, *, column: str = "ratio",
                    cluster: str = "instance_id") -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per-instance sums and counts of ``value_col`` for each value of ``column``.

    Returns ``(instances [I], columns [C], sums [I, C], counts [I, C])``; NaN values are left out
    (they add nothing to sums or counts). Column values come sorted.
    """
    require_columns(df, (value_col, column, cluster), "the bootstrap")
    v = df[[cluster, column]].copy()
    v["_x"] = pd.to_numeric(df[value_col], errors="coerce").astype(float)
    v = v[v["_x"].notna()]
    agg = v.groupby([cluster, column], sort=True)["_x"].agg(["sum", "count"])
    sums = agg["sum"].unstack(column, fill_value=0.0)
    counts = agg["count"].unstack(column, fill_value=0).reindex_like(sums).fillna(0)
    return (sums.index.to_numpy(), sums.columns.to_numpy(), sums.to_numpy(float), counts.to_numpy(float))


def boot_means(sums: np.ndarray, counts: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Replicate means ``[n_boot, C]`` from instance ``sums``/``counts`` ``[I, C]`` and ``weights`` ``[n_boot, I]``.

    A replicate that happens to draw no cell of some column gets NaN there.
    """
    num = weights @ sums  # [n_boot, C]
    den = weights @ counts  # [n_boot, C]
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, num / np.where(den > 0, den, 1.0), np.nan)


def percentile_interval(samples: np.ndarray, confidence: float = 0.95, axis: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Two-sided percentile interval of bootstrap ``samples`` along ``axis`` (NaN replicates ignored)."""
    _check_confidence(confidence)
    tail = (1.0 - confidence) / 2.0 * 100.0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN slices give NaN, on purpose
        lo = np.nanpercentile(samples, tail, axis=axis)
        hi = np.nanpercentile(samples, 100.0 - tail, axis=axis)
    return lo, hi


def bootstrap_ci(df: pd.DataFrame, value_col: str, by: Sequence[str] = (), *, cluster: str = "instance_id",
                 n_boot: int = 1000, confidence: float = 0.95, seed: int = 0) -> pd.DataFrame:
    """Mean of ``value_col`` per group of ``by`` with a percentile bootstrap interval over instances.

    Returns one row per group: the ``by`` columns, ``mean``, ``ci_low``, ``ci_high``,
    ``n_instances`` and ``n_cells``. Booleans count as 0/1. Each group draws from its own
    Generator derived from ``seed`` and the group key, so results are reproducible and do not
    depend on which other groups are present.
    """
    _check_confidence(confidence)
    by = list(by)
    require_columns(df, [value_col, cluster, *by], "bootstrap_ci")
    rows = []
    groups = df.groupby(by, sort=True, dropna=False) if by else [((), df)]
    for key, grp in groups:
        x = pd.to_numeric(grp[value_col], errors="coerce").astype(float)
        g = pd.DataFrame({"c": grp[cluster].to_numpy(), "x": x.to_numpy()}).dropna()
        row = as_key(by, key) if by else {}
        if g.empty:
            rows.append({**row, "mean": np.nan, "ci_low": np.nan, "ci_high": np.nan, "n_instances": 0, "n_cells": 0})
            continue
        per = g.groupby("c")["x"].agg(["sum", "count"])
        s, c = per["sum"].to_numpy(), per["count"].to_numpy(float)
        w = resample_weights(len(per), n_boot, group_seed(seed, (value_col, key)))
        reps = (w @ s) / (w @ c)
        lo, hi = percentile_interval(reps, confidence)
        rows.append({**row, "mean": s.sum() / c.sum(), "ci_low": float(lo), "ci_high": float(hi),
                     "n_instances": len(per), "n_cells": int(c.sum())})
    return pd.DataFrame(rows, columns=[*by, "mean", "ci_low", "ci_high", "n_instances", "n_cells"])


def _check_confidence(confidence: float) -> None:
    if not 0.5 <= confidence < 1.0:
        raise AnalysisError(f"confidence must be in [0.5, 1), got {confidence}")
