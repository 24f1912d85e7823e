"""The hallucination cliff: H(α) per ratio, susceptibility χ(α), the midpoint α*, and the safe ratio.

One *curve* is the cells of one (model, press, regime, family) group — ``family="all"`` pools
the families — with the ratio-0 baseline attached (see :func:`~kvroute.analysis.common.attach_baseline`).

* ``H(α)``: mean of ``hallucinated`` over the curve's cells at ratio α, with a 95% percentile
  bootstrap interval over instances.
* ``χ(α)``: ``(H(α_j) − H(α_{j−1})) / (α_j − α_{j−1})`` between adjacent tested ratios, reported
  at the upper ratio of the pair; its argmax is reported as the midpoint of that pair.
* ``α*``: midpoint of the fitted sigmoid (:mod:`kvroute.analysis.sigmoid`), with a percentile
  bootstrap interval from refitting each replicate (same instances across ratios).
* safe ratio: the largest tested α such that, for it *and every smaller ratio*, the one-sided
  ``confidence`` upper bootstrap bound of the paired difference H(α) − H(0) is at most δ.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from kvroute.analysis.bootstrap import boot_means, instance_matrix, percentile_interval, resample_weights
from kvroute.analysis.common import (
    CURVE_KEYS,
    AnalysisError,
    as_key,
    attach_baseline,
    group_seed,
    pooled,
    require_columns,
)
from kvroute.analysis.sigmoid import MIN_AMPLITUDE, SigmoidFit, fit_sigmoid, grid_for, has_cliff


@dataclass(frozen=True)
class CurveResult:
    """Everything measured on one curve. Arrays are indexed by ``ratios``; ``reps`` is ``[n_boot, C]``."""

    ratios: np.ndarray
    h: np.ndarray
    reps: np.ndarray
    n_instances: int
    n_cells: np.ndarray
    fit: SigmoidFit
    alpha_reps: np.ndarray  # [n_boot] α* per replicate, NaN where that replicate shows no cliff


def susceptibility(ratios: np.ndarray, h: np.ndarray) -> np.ndarray:
    """χ between adjacent ratios, ``[C]``, NaN at the first ratio (ratios sorted ascending)."""
    ratios, h = np.asarray(ratios, float), np.asarray(h, float)
    chi = np.full(len(h), np.nan)
    if len(h) > 1:
        chi[1:] = np.diff(h) / np.diff(ratios)
    return chi


def safe_ratio(ratios: np.ndarray, reps: np.ndarray, *, delta: float = 0.05,
               confidence: float = 0.95) -> tuple[float | None, np.ndarray, str]:
    """The safe ratio from bootstrap replicates ``reps`` ``[n_boot, C]`` of H at ``ratios``.

    Returns ``(safe ratio or None, upper bound of H(α) − H(0) per ratio [C], explanation)``.
    """
    ratios = np.asarray(ratios, float)
    if not 0 < delta < 1:
        raise AnalysisError(f"delta must be in (0, 1), got {delta}")
    base = np.flatnonzero(ratios == 0)
    if base.size == 0:
        return None, np.full(len(ratios), np.nan), "no ratio-0 baseline cells, so no safe ratio"
    diff = reps - reps[:, [base[0]]]  # [n_boot, C] paired: same instances in both
    with np.errstate(all="ignore"):
        upper = np.nanquantile(diff, confidence, axis=0) if np.isfinite(diff).any() else np.full(len(ratios), np.nan)
    safe = 0.0
    for r, u in zip(ratios, upper, strict=True):
        if r == 0:
            continue
        if not (np.isfinite(u) and u <= delta):
            break
        safe = float(r)
    how = (f"largest α with the one-sided {confidence:.0%} upper bound of H(α) − H(0) ≤ {delta:g} "
           f"at it and every smaller ratio")
    return safe, upper, how


def analyse_curve(cells: pd.DataFrame, *, value_col: str = "hallucinated", n_boot: int = 1000,
                  seed_key: object = (), seed: int = 0, min_amplitude: float = MIN_AMPLITUDE) -> CurveResult:
    """H per ratio, its replicates, the sigmoid fit and α* replicates for the cells of one curve."""
    _, ratios, sums, counts = instance_matrix(cells, value_col)
    if len(ratios) == 0:
        raise AnalysisError(f"no non-null {value_col!r} values in this group")
    h = sums.sum(axis=0) / np.maximum(counts.sum(axis=0), 1)  # [C]
    w = resample_weights(len(sums), n_boot, group_seed(seed, ("cliff", seed_key)))
    reps = boot_means(sums, counts, w)  # [n_boot, C]
    fit = fit_sigmoid(ratios, h, min_amplitude=min_amplitude)
    alpha_reps = np.full(n_boot, np.nan)
    if fit.ok:
        best = grid_for(tuple(np.asarray(ratios, float).tolist())).best(reps)
        alpha_reps = np.where(has_cliff(reps, min_amplitude), best["mid"], np.nan)
    return CurveResult(np.asarray(ratios, float), h, reps, len(sums), counts.sum(axis=0).astype(int), fit, alpha_reps)


def cliff_tables(df: pd.DataFrame, *, keys: Sequence[str] = CURVE_KEYS, value_col: str = "hallucinated",
                 n_boot: int = 1000, confidence: float = 0.95, delta: float = 0.05, seed: int = 0,
                 min_amplitude: float = MIN_AMPLITUDE, pool_families: bool = True) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Cliff curves and fits for every group of ``keys``.

    Returns ``(curves, cliffs)``. ``curves`` has one row per (group, ratio): ``h``, ``h_low``,
    ``h_high``, ``chi``, ``excess_upper`` (upper bound of H(α) − H(0)), ``n_instances``, ``n_cells``.
    ``cliffs`` has one row per group: ``status``, ``reason``, ``alpha_star`` with
    ``alpha_star_low``/``_high`` and ``boot_valid`` (share of replicates that show a cliff), the
    fitted ``lo``, ``hi``, ``k``, ``rmse``, ``alpha_chi_max``/``chi_max`` and ``safe_ratio``.
    """
    keys = list(keys)
    data = attach_baseline(df)
    require_columns(data, [value_col, *keys], "the cliff analysis")
    if pool_families and "family" in keys:
        data = pooled(data)
    curve_rows, cliff_rows = [], []
    for key, cells in data.groupby(keys, sort=True):
        k = as_key(keys, key)
        try:
            res = analyse_curve(cells, value_col=value_col, n_boot=n_boot, seed_key=key, seed=seed,
                                min_amplitude=min_amplitude)
        except AnalysisError as e:
            cliff_rows.append({**k, "status": "no_data", "reason": str(e)})
            continue
        lo_ci, hi_ci = percentile_interval(res.reps, confidence)
        chi = susceptibility(res.ratios, res.h)
        safe, upper, safe_how = safe_ratio(res.ratios, res.reps, delta=delta, confidence=confidence)
        for j, r in enumerate(res.ratios):
            curve_rows.append({**k, "ratio": r, "h": res.h[j], "h_low": lo_ci[j], "h_high": hi_ci[j], "chi": chi[j],
                               "excess_upper": upper[j], "n_instances": res.n_instances, "n_cells": res.n_cells[j]})
        cliff_rows.append({**k, **_fit_row(res, confidence), **_chi_row(res.ratios, chi),
                           "safe_ratio": safe, "safe_rule": safe_how, "h0": _h_at(res, 0.0),
                           "n_instances": res.n_instances, "n_ratios": len(res.ratios)})
    return pd.DataFrame(curve_rows), pd.DataFrame(cliff_rows)


def alpha_star_interval(alpha_reps: np.ndarray, confidence: float) -> tuple[float | None, float | None, float, str]:
    """``(low, high, share of valid replicates, note)`` for α* replicates (NaN = no cliff in that replicate)."""
    valid = np.isfinite(alpha_reps)
    share = float(valid.mean()) if len(alpha_reps) else 0.0
    if share < 0.5:
        return None, None, share, f"only {share:.0%} of bootstrap replicates show a cliff; no interval"
    lo, hi = percentile_interval(alpha_reps[valid], confidence)
    return float(lo), float(hi), share, ""


def _fit_row(res: CurveResult, confidence: float) -> dict[str, object]:
    f = res.fit
    row: dict[str, object] = {"status": f.status, "reason": f.reason, "alpha_star": f.alpha_star,
                              "alpha_star_low": None, "alpha_star_high": None, "boot_valid": None,
                              "lo": f.lo, "hi": f.hi, "k": f.k, "rmse": f.rmse}
    if f.ok:
        lo, hi, share, note = alpha_star_interval(res.alpha_reps, confidence)
        row.update(alpha_star_low=lo, alpha_star_high=hi, boot_valid=share)
        if note:
            row["reason"] = f"{f.reason}; {note}"
    return row


def _chi_row(ratios: np.ndarray, chi: np.ndarray) -> dict[str, object]:
    if not np.isfinite(chi).any() or np.nanmax(chi) <= 0:  # a flat or falling curve has no steepest rise
        return {"alpha_chi_max": None, "chi_max": None, "chi_interval": None}
    j = int(np.nanargmax(chi))
    return {"alpha_chi_max": float((ratios[j - 1] + ratios[j]) / 2), "chi_max": float(chi[j]),
            "chi_interval": [float(ratios[j - 1]), float(ratios[j])]}


def _h_at(res: CurveResult, ratio: float) -> float | None:
    j = np.flatnonzero(res.ratios == ratio)
    return float(res.h[j[0]]) if j.size else None
