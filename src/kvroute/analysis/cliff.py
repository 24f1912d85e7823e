"""The hallucination cliff: H(α) per ratio, susceptibility χ(α), the midpoint α*, and the safe ratio.

One *curve* is the cells of one (model, press, regime, family) group — ``family="all"`` pools
the families — with the ratio-0 baseline attached (see :func:`~kvroute.analysis.common.attach_baseline`).

* ``H(α)``: mean of ``hallucinated`` over the curve's cells at ratio α, with a 95% percentile
  bootstrap interval over instances.
* ``χ(α)``: ``(H(α_j) − H(α_{j−1})) / (α_j − α_{j−1})`` between adjacent tested ratios, reported
  at the upper ratio of the pair; its argmax is reported as the midpoint of that pair.
* ``α*``: midpoint of the fitted sigmoid (:mod:`kvroute.analysis.sigmoid`, ``0 ≤ lo ≤ hi ≤ 1``),
  with a percentile bootstrap interval from refitting each replicate (same instances across
  ratios). Every replicate obeys the point estimate's rule: it is ``ok``, ``no_cliff``,
  ``below_grid`` or ``beyond_grid`` exactly as :func:`~kvroute.analysis.sigmoid.fit_sigmoid`
  would decide; the shares of each are reported (``boot_ok``, ``boot_no_cliff``,
  ``boot_below_grid``, ``boot_beyond_grid``).
* the interval is censored, not clamped (:func:`censored_interval`): a replicate below the grid
  counts as −∞, one beyond it as +∞, and one without a cliff as −∞ for the lower and +∞ for the
  upper bound (it could lie anywhere). Where a percentile falls on such a replicate that end of
  the interval is *open* (None, with ``alpha_star_identified`` saying which side) — never the
  grid's edge passed off as a bound.
* **the reported interval** (``alpha_star_low``/``_high``, :func:`reported_interval`): the sigmoid's
  own interval (kept as ``alpha_star_fit_low``/``_high``) assumes the logistic shape, and on other
  shapes it narrows onto the wrong point — at 200 planted instances of a skewed α⁶ rise, a Gompertz or
  a two-step cliff it covered the true halfway point in well under 80% of sets
  (:mod:`kvroute.analysis.planted.cliff_shapes`). The table therefore reports the hull of the
  sigmoid's interval and the model-free crossing's below, and says **cannot decide**
  (``alpha_star_identified``) where they are disjoint (the curve is not sigmoid-shaped), where
  either is missing, or where the hull spans more than :data:`MAX_ALPHA_WIDTH` of α.
* ``α½`` (``alpha_half``): the model-free cross-check. A monotone (isotonic, pool-adjacent-
  violators, weighted by cell counts) fit ``m`` of H over the ratios; the linearly interpolated
  ratio where ``m`` crosses ``(m(α₀) + m(α_max)) / 2``, halfway between its baseline and its
  top. Its edge rule: ``no_cliff`` when ``m`` rises by less than ``min_amplitude``;
  ``beyond_grid`` when the crossing lies in the last gap (the top is a single point, so the
  curve may still be rising), ``below_grid`` when it lies in the first. Replicates obey the same
  rule and the interval is censored the same way. Its interval is then *rounded out to the
  tested ratios* (:func:`crossing_interval`, stated in ``alpha_half_rule`` and in the interval's
  wording): a model-free estimate knows H only at the tested ratios, so it locates the crossing
  to the gap between two of them and no finer. ``alpha_half_gap`` is the gap holding the point
  estimate.
* safe ratio: the largest tested α such that, for it *and every smaller ratio*, the paired
  excess H(α) − H(0) is shown ≤ δ by an exact test on the discordant pairs
  (:mod:`kvroute.analysis.excess`; size ≤ 1 − ``confidence`` at the margin, where a percentile
  bootstrap bound was not). ``excess_upper`` is that test's exact upper bound. A certification,
  not a ranking: presses are ranked by paired comparison (:mod:`kvroute.analysis.paired`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

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
from kvroute.analysis.excess import paired_excess
from kvroute.analysis.sigmoid import (
    BELOW_GRID,
    BEYOND_GRID,
    MIN_AMPLITUDE,
    NO_CLIFF,
    NO_DATA,
    OK,
    STATUS_NAMES,
    SigmoidFit,
    SigmoidGrid,
    fit_sigmoid,
    grid_for,
)


@dataclass(frozen=True)
class CurveResult:
    """Everything measured on one curve. Arrays are indexed by ``ratios``; ``reps`` is ``[n_boot, C]``."""

    ratios: np.ndarray
    h: np.ndarray
    reps: np.ndarray
    n_instances: int
    n_cells: np.ndarray
    fit: SigmoidFit
    alpha_reps: np.ndarray  # [n_boot] α* per replicate, NaN where that replicate's code is not OK
    alpha_codes: np.ndarray  # [n_boot] the replicate's status code (sigmoid.STATUS_NAMES)
    half: float | None  # the monotone cross-check α½ (None unless its status is ok)
    half_status: str
    half_reps: np.ndarray  # [n_boot]
    half_codes: np.ndarray  # [n_boot]
    monotone: np.ndarray  # [C] the monotone fit of H
    sums: np.ndarray  # [I, C] per-instance sums of the value (the paired tests read them)
    counts: np.ndarray  # [I, C] per-instance cell counts


def monotone_fit(y: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Weighted isotonic (non-decreasing) least-squares fit of each row of ``y`` ``[B, C]`` with weights ``w``.

    Uses the min–max formula ``m_j = max_{i ≤ j} min_{l ≥ j} mean_w(y[i..l])`` (the PAV solution),
    vectorised over rows. Rows with a NaN value or a zero weight give NaN.
    """
    y = np.atleast_2d(np.asarray(y, float))
    w = np.broadcast_to(np.asarray(w, float), y.shape)
    bad = ~np.isfinite(y).all(axis=1) | (w <= 0).any(axis=1)
    yw = np.where(np.isfinite(y), y, 0.0) * w
    cy = np.concatenate([np.zeros((len(y), 1)), np.cumsum(yw, axis=1)], axis=1)
    cw = np.concatenate([np.zeros((len(y), 1)), np.cumsum(w, axis=1)], axis=1)
    n = y.shape[1]
    out = np.full(y.shape, -np.inf)
    with np.errstate(invalid="ignore", divide="ignore"):
        for j in range(n):
            for i in range(j + 1):
                # min over l ≥ j of the block mean of y[i..l]
                means = (cy[:, j + 1:] - cy[:, [i]]) / (cw[:, j + 1:] - cw[:, [i]])
                out[:, j] = np.maximum(out[:, j], means.min(axis=1))
    out[bad] = np.nan
    return out


def halfway_crossing(x: np.ndarray, y: np.ndarray, w: np.ndarray, *,
                     min_amplitude: float = MIN_AMPLITUDE) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The model-free cross-check for each row of ``y`` ``[B, C]`` over sorted ratios ``x``: ``(α½, codes, m)``.

    ``m`` is the weighted monotone fit, ``α½`` the interpolated ratio where it first reaches the
    halfway level between ``m`` at the first and at the last ratio (NaN where the code is not OK).
    """
    x = np.asarray(x, float)
    m = monotone_fit(y, w)  # [B, C]
    b = np.arange(len(m))
    codes = np.full(len(m), NO_DATA, dtype=int)
    value = np.full(len(m), np.nan)
    finite = np.isfinite(m).all(axis=1)
    rise = m[:, -1] - m[:, 0]
    codes[finite] = NO_CLIFF
    cliff = finite & (rise >= min_amplitude) & (rise > 0)
    if cliff.any():
        level = m[:, 0] + 0.5 * rise
        j = np.argmax(m >= level[:, None] - 1e-12, axis=1)  # first index at or above halfway (≥ 1 where rise > 0)
        j = np.clip(j, 1, len(x) - 1)
        m0, m1 = m[b, j - 1], m[b, j]
        with np.errstate(invalid="ignore", divide="ignore"):
            a = x[j - 1] + (level - m0) / (m1 - m0) * (x[j] - x[j - 1])
        c = np.where(j == len(x) - 1, BEYOND_GRID, np.where(j == 1, BELOW_GRID, OK))
        codes[cliff] = c[cliff]
        value[cliff] = np.where(c[cliff] == OK, a[cliff], np.nan)
    return value, codes, m


def censored_interval(values: np.ndarray, codes: np.ndarray, confidence: float) -> dict[str, object]:
    """Percentile interval of replicate ``values`` whose status ``codes`` may put them off the grid.

    Below-grid replicates count as −∞, beyond-grid ones as +∞, and those with no cliff (or no
    data) as −∞ for the lower and +∞ for the upper bound. A bound that falls on an infinite
    replicate is open (None). Returns ``low``, ``high``, ``state`` (``closed``, ``open_above``,
    ``open_below`` or ``open``) and the replicate shares ``ok``, ``no_cliff``, ``below_grid``,
    ``beyond_grid``.
    """
    values, codes = np.asarray(values, float), np.asarray(codes, int)
    n = len(codes)
    shares = {name: float((codes == c).mean()) if n else 0.0 for c, name in
              ((OK, "ok"), (NO_CLIFF, "no_cliff"), (BELOW_GRID, "below_grid"), (BEYOND_GRID, "beyond_grid"))}
    shares["no_cliff"] += float((codes == NO_DATA).mean()) if n else 0.0
    if n == 0 or shares["ok"] == 0:
        return {"low": None, "high": None, "state": "open", **shares}
    tail = (1.0 - confidence) / 2.0
    ok = codes == OK
    v_low = np.where(ok, values, np.where(codes == BEYOND_GRID, np.inf, -np.inf))
    v_high = np.where(ok, values, np.where(codes == BELOW_GRID, -np.inf, np.inf))
    low = float(np.quantile(v_low, tail, method="inverted_cdf"))
    high = float(np.quantile(v_high, 1.0 - tail, method="inverted_cdf"))
    lo_ok, hi_ok = np.isfinite(low), np.isfinite(high)
    state = "closed" if lo_ok and hi_ok else "open_above" if lo_ok else "open_below" if hi_ok else "open"
    return {"low": low if lo_ok else None, "high": high if hi_ok else None, "state": state, **shares}


#: how the monotone cross-check's interval is made, as stated in the cliff table (``alpha_half_rule``)
CROSSING_RULE = ("percentile interval of the bootstrap crossings, rounded out to the tested ratios that bracket it: "
                 "a model-free crossing is located only to a gap of the grid")


def crossing_gap(value: float | None, x: np.ndarray) -> tuple[float, float] | None:
    """The gap ``(x_{j−1}, x_j]`` of sorted ratios ``x`` that holds a crossing ``value`` (None for None/NaN)."""
    if value is None or not np.isfinite(value):
        return None
    x = np.asarray(x, float)
    j = int(np.searchsorted(x, value - 1e-9, side="left"))  # first tested ratio ≥ value
    j = min(max(j, 1), len(x) - 1)
    return float(x[j - 1]), float(x[j])


def crossing_interval(values: np.ndarray, codes: np.ndarray, x: np.ndarray, confidence: float) -> dict[str, object]:
    """:func:`censored_interval` of halfway-crossing replicates, each closed end rounded *out* to a tested ratio.

    The lower end becomes the largest tested ratio below it, the upper end the smallest one at or
    above it (a crossing lies in a half-open gap ``(x_{j−1}, x_j]``: ``x_j`` is the first ratio at
    or above halfway). Open ends stay open.

    Why not the plain percentile interval of the interpolated crossings: the monotone fit knows H
    only at the tested ratios. Where the crossing falls in a gap, the interpolated value is
    ``x_{j−1} + (x_j − x_{j−1}) (level − m_{j−1}) / (m_j − m_{j−1})`` — a convention (H linear
    between the two ratios), not something the data measure; and it hangs on the few failures
    near the gap's ends (at a true α* of 0.6 on the demo grid, on the ~2 of 48 instances that fail
    at 0.5). A bootstrap of such rare counts is degenerate (a set with 0 or 1 such failures
    resamples to nearly the same value), so the interval came out 0.013–0.025 wide inside a gap
    0.2 wide and covered its own target in only 81–83% of simulated sets. What the data *can*
    decide is which gap holds the crossing: that is what the rounded interval reports (it is one
    gap wide when every replicate crosses in the same gap, and grows by a gap each time the
    bootstrap moves the crossing across a tested ratio). It covers the interpolated target and the
    continuous curve's crossing alike, so the estimator and its target no longer depend on the
    interpolation convention. The point estimate stays the interpolated crossing, beside its gap.
    """
    iv = censored_interval(values, codes, confidence)
    x = np.asarray(x, float)
    low, high = cast("float | None", iv["low"]), cast("float | None", iv["high"])  # censored_interval's float | None
    if low is not None:
        below = x[x < low - 1e-9]
        iv["low"] = float(below.max()) if below.size else float(x[0])
    if high is not None:
        above = x[x >= high - 1e-9]
        iv["high"] = float(above.min()) if above.size else float(x[-1])
    iv["rule"] = CROSSING_RULE
    return iv


#: a reported α* interval wider than this (in α) decides nothing: the cliff table says "cannot decide"
MAX_ALPHA_WIDTH = 0.35
#: below this many instances on a curve α* is not decided (planted two-step cliff at 8 instances: the decided
#: sets covered the truth in 84%; at 24, 98.5%)
MIN_ALPHA_INSTANCES = 10


def reported_interval(sigmoid: dict[str, object] | None, crossing: dict[str, object] | None, *,
                      max_width: float = MAX_ALPHA_WIDTH, n_instances: int | None = None,
                      min_instances: int = MIN_ALPHA_INSTANCES) -> tuple[dict[str, object] | None, str]:
    """The α* interval the cliff table reports — what the sigmoid *and* the model-free crossing allow — and why not.

    ``sigmoid`` is :func:`censored_interval` of the α* replicates, ``crossing`` the rounded-out
    :func:`crossing_interval`. The sigmoid's own interval assumes the logistic shape; on curves of
    other shapes (a skewed or Gompertz rise, a high baseline) it covers the true halfway point far
    less than 95% of the time, while the crossing's holds (:mod:`kvroute.analysis.planted.cliff_shapes`).
    So the reported interval is their hull (an end open in either is open). It is None — *cannot
    decide* — where either is missing, where they are disjoint (the sigmoid's midpoint disagrees
    with the model-free crossing: the curve is not sigmoid-shaped) or where the hull is wider than
    ``max_width``, or the curve has fewer than ``min_instances`` instances (``n_instances``); the
    second value says which ("" when there is an interval).
    """
    if n_instances is not None and n_instances < min_instances:
        return None, f"only {n_instances} instances (fewer than {min_instances})"
    if sigmoid is None or crossing is None:
        return None, ("no model-free crossing to check the sigmoid against" if sigmoid is not None
                      else "no sigmoid midpoint")
    lows = [sigmoid["low"], crossing["low"]]
    highs = [sigmoid["high"], crossing["high"]]
    s_lo, c_lo, s_hi, c_hi = (cast("float | None", v) for v in (*lows, *highs))
    if (s_hi is not None and c_lo is not None and s_hi < c_lo) or (s_lo is not None and c_hi is not None
                                                                    and s_lo > c_hi):
        return None, (f"the sigmoid's interval [{_end(s_lo)}, {_end(s_hi)}] and the model-free crossing's "
                      f"[{_end(c_lo)}, {_end(c_hi)}] are disjoint: the curve is not sigmoid-shaped")
    low = None if None in lows else min(cast(float, v) for v in lows)
    high = None if None in highs else max(cast(float, v) for v in highs)
    if low is not None and high is not None and high - low > max_width:
        return None, f"the interval [{low:.3f}, {high:.3f}] spans more than {max_width:g} of α"
    state = "closed" if low is not None and high is not None else "open_above" if low is not None else (
        "open_below" if high is not None else "open")
    return {**sigmoid, "low": low, "high": high, "state": state}, ""


def _end(v: float | None) -> str:
    return "open" if v is None else f"{v:.3f}"


def interval_statement(point: float | None, status: str, iv: dict[str, object], x: np.ndarray,
                       confidence: float, *, closed_note: str = "") -> tuple[str, str]:
    """``(identified, text)``: whether a midpoint and its interval are identified, and the interval in words.

    ``identified`` is ``identified``, ``open_above``, ``open_below`` or ``not identified``;
    ``closed_note`` follows a closed interval (e.g. how it was made).
    """
    x = np.asarray(x, float)
    if point is None:
        return "not identified", f"not identified ({status})"
    beyond, below, none = (f"{iv[k]:.0%}" for k in ("beyond_grid", "below_grid", "no_cliff"))
    state = iv["state"]
    if state == "closed":
        return "identified", f"[{iv['low']:.3f}, {iv['high']:.3f}]{closed_note}"
    if state == "open_above":
        return "open_above", (f"[{iv['low']:.3f}, open): the upper end is not identified — {beyond} of replicates "
                              f"beyond the grid (α > {x[-1]:g}), {none} without a cliff")
    if state == "open_below":
        return "open_below", (f"(open, {iv['high']:.3f}]: the lower end is not identified — {below} of replicates "
                              f"below the grid (α < {x[0]:g}), {none} without a cliff")
    return "not identified", (f"not identified: the {confidence:.0%} interval is open at both ends ({below} of "
                              f"replicates below the grid, {beyond} beyond it, {none} without a cliff)")


def susceptibility(ratios: np.ndarray, h: np.ndarray) -> np.ndarray:
    """χ between adjacent ratios, ``[C]``, NaN at the first ratio (ratios sorted ascending)."""
    ratios, h = np.asarray(ratios, float), np.asarray(h, float)
    chi = np.full(len(h), np.nan)
    if len(h) > 1:
        chi[1:] = np.diff(h) / np.diff(ratios)
    return chi


def safe_ratio(ratios: np.ndarray, sums: np.ndarray, counts: np.ndarray, *, delta: float = 0.05,
               confidence: float = 0.95, bounds: bool = True) -> tuple[float | None, np.ndarray, str]:
    """The safe ratio from instance ``sums``/``counts`` ``[I, C]`` of H at ``ratios`` (see the module docstring).

    Each ratio's paired excess H(α) − H(0) over the instances with cells at both is tested by
    :func:`~kvroute.analysis.excess.paired_excess` (exact on the discordant pairs). Returns
    ``(safe ratio or None, upper bound of H(α) − H(0) per ratio [C], explanation)``; ``bounds=False``
    leaves the bounds NaN (the decision does not need them).
    """
    ratios = np.asarray(ratios, float)
    if not 0 < delta < 1:
        raise AnalysisError(f"delta must be in (0, 1), got {delta}")
    base = np.flatnonzero(ratios == 0)
    upper = np.full(len(ratios), np.nan)
    if base.size == 0:
        return None, upper, "no ratio-0 baseline cells, so no safe ratio"
    with np.errstate(invalid="ignore", divide="ignore"):
        h = np.where(counts > 0, sums / np.where(counts > 0, counts, 1.0), np.nan)  # [I, C]
    safe, blocked, rules = 0.0, False, set()
    for j, r in enumerate(ratios):
        if r == 0:
            continue
        shown, upper[j], rule = paired_excess(h[:, j], h[:, base[0]], delta, confidence, bound=bounds)
        rules.add(rule)
        blocked = blocked or not shown
        if not blocked:
            safe = float(r)
    how = (f"largest α with H(α) − H(0) shown ≤ {delta:g} at {confidence:.0%} confidence at it and every smaller "
           f"ratio ({'; '.join(sorted(rules)) or 'no compressed ratio'})")
    return safe, upper, how


def analyse_curve(cells: pd.DataFrame, *, value_col: str = "hallucinated", n_boot: int = 1000,
                  seed_key: object = (), seed: int = 0, min_amplitude: float = MIN_AMPLITUDE) -> CurveResult:
    """H per ratio, its replicates, the sigmoid fit, the monotone cross-check and their replicates for one curve."""
    _, ratios, sums, counts = instance_matrix(cells, value_col)
    if len(ratios) == 0:
        raise AnalysisError(f"no non-null {value_col!r} values in this group")
    w = resample_weights(len(sums), n_boot, group_seed(seed, ("cliff", seed_key)))
    return analyse_matrix(ratios, sums, counts, w, min_amplitude=min_amplitude,
                          rng=group_seed(seed, ("cliff-ties", seed_key)))


def analyse_matrix(ratios: np.ndarray, sums: np.ndarray, counts: np.ndarray, weights: np.ndarray, *,
                   min_amplitude: float = MIN_AMPLITUDE, rng: np.random.Generator | None = None,
                   grid: SigmoidGrid | None = None) -> CurveResult:
    """The cliff estimators on instance ``sums``/``counts`` ``[I, C]`` and bootstrap ``weights`` ``[n_boot, I]``.

    ``rng`` breaks ties between equally good midpoints in the replicates; ``grid`` (default: the
    cached grid for ``ratios``) fits them.
    """
    ratios = np.asarray(ratios, float)
    n_cells = counts.sum(axis=0)
    h = sums.sum(axis=0) / np.maximum(n_cells, 1)  # [C]
    reps = boot_means(sums, counts, weights)  # [n_boot, C]
    fit = fit_sigmoid(ratios, h, min_amplitude=min_amplitude)
    n_boot = len(weights)
    alpha_reps, alpha_codes = np.full(n_boot, np.nan), np.full(n_boot, NO_DATA, dtype=int)
    if fit.ok:
        g = grid or grid_for(tuple(ratios.tolist()))
        alpha_reps, alpha_codes = g.midpoints(reps, min_amplitude=min_amplitude, rng=rng)
    half, half_codes, mono = halfway_crossing(ratios, h[None, :], n_cells[None, :], min_amplitude=min_amplitude)
    half_status = STATUS_NAMES[int(half_codes[0])]
    half_reps, half_rep_codes = np.full(n_boot, np.nan), np.full(n_boot, NO_DATA, dtype=int)
    if half_codes[0] == OK:
        half_reps, half_rep_codes, _ = halfway_crossing(ratios, reps, weights @ counts, min_amplitude=min_amplitude)
    return CurveResult(ratios, h, reps, len(sums), n_cells.astype(int), fit, alpha_reps, alpha_codes,
                       float(half[0]) if half_codes[0] == OK else None, half_status, half_reps, half_rep_codes, mono[0],
                       sums, counts)


def cliff_tables(df: pd.DataFrame, *, keys: Sequence[str] = CURVE_KEYS, value_col: str = "hallucinated",
                 n_boot: int = 1000, confidence: float = 0.95, delta: float = 0.05, seed: int = 0,
                 min_amplitude: float = MIN_AMPLITUDE, pool_families: bool = True) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Cliff curves and fits for every group of ``keys``.

    Returns ``(curves, cliffs)``. ``curves`` has one row per (group, ratio): ``h``, ``h_low``,
    ``h_high``, ``chi``, ``excess_upper`` (upper bound of H(α) − H(0)), ``n_instances``, ``n_cells``.
    ``cliffs`` has one row per group: ``status``, ``reason``, ``alpha_star`` with
    ``alpha_star_low``/``_high`` (None where the interval is open), ``alpha_star_identified``
    (``identified``, ``open_above``, ``open_below`` or ``not identified``) and
    ``alpha_star_interval`` (the interval in words), the replicate shares ``boot_valid`` (an
    identified cliff), ``boot_no_cliff``, ``boot_below_grid``, ``boot_beyond_grid``; the fitted
    ``lo``, ``hi``, ``k``, ``rmse``; the monotone cross-check ``alpha_half`` with
    ``alpha_half_status``, ``alpha_half_low``/``_high`` (tested ratios: see :func:`crossing_interval`),
    ``alpha_half_identified``, ``alpha_half_interval``, ``alpha_half_gap`` (the tested ratios
    bracketing the point estimate), ``alpha_half_rule`` (how the interval is made) and
    ``half_boot_valid``/``_below_grid``/``_beyond_grid``;
    ``alpha_chi_max``/``chi_max`` and ``safe_ratio``.
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
        safe, upper, safe_how = safe_ratio(res.ratios, res.sums, res.counts, delta=delta, confidence=confidence)
        for j, r in enumerate(res.ratios):
            curve_rows.append({**k, "ratio": r, "h": res.h[j], "h_low": lo_ci[j], "h_high": hi_ci[j], "chi": chi[j],
                               "excess_upper": upper[j], "n_instances": res.n_instances, "n_cells": res.n_cells[j]})
        cliff_rows.append({**k, **_fit_row(res, confidence), **_chi_row(res.ratios, chi),
                           "safe_ratio": safe, "safe_rule": safe_how, "h0": _h_at(res, 0.0),
                           "n_instances": res.n_instances, "n_ratios": len(res.ratios)})
    return pd.DataFrame(curve_rows), pd.DataFrame(cliff_rows)


def alpha_star_interval(alpha_reps: np.ndarray, confidence: float,
                        codes: np.ndarray | None = None) -> tuple[float | None, float | None, float, str]:
    """``(low, high, share of replicates with an identified cliff, note)`` for α* replicates.

    ``codes`` are the replicates' status codes; without them a NaN replicate counts as "no
    cliff". The interval is :func:`censored_interval`'s: an end is None where it is open.
    """
    alpha_reps = np.asarray(alpha_reps, float)
    if codes is None:
        codes = np.where(np.isfinite(alpha_reps), OK, NO_CLIFF)
    iv = censored_interval(alpha_reps, codes, confidence)
    note = "" if iv["state"] == "closed" else (
        f"the {confidence:.0%} interval is open ({iv['state']}): {iv['below_grid']:.0%} of bootstrap replicates below "
        f"the grid, {iv['beyond_grid']:.0%} beyond it, {iv['no_cliff']:.0%} without a cliff")
    return iv["low"], iv["high"], iv["ok"], note  # type: ignore[return-value]


def _fit_row(res: CurveResult, confidence: float) -> dict[str, object]:
    f = res.fit
    row: dict[str, object] = {"status": f.status, "reason": f.reason, "alpha_star": f.alpha_star,
                              "alpha_star_low": None, "alpha_star_high": None, "alpha_star_fit_low": None,
                              "alpha_star_fit_high": None, "boot_valid": None,
                              "boot_no_cliff": None, "boot_below_grid": None, "boot_beyond_grid": None,
                              "lo": f.lo, "hi": f.hi, "k": f.k, "rmse": f.rmse}
    iv = censored_interval(res.alpha_reps, res.alpha_codes, confidence)
    hv = crossing_interval(res.half_reps, res.half_codes, res.ratios, confidence)
    ident, text = interval_statement(f.alpha_star, f.status, iv, res.ratios, confidence)
    if f.ok:
        row.update(alpha_star_fit_low=iv["low"], alpha_star_fit_high=iv["high"], boot_valid=iv["ok"],
                   boot_no_cliff=iv["no_cliff"], boot_below_grid=iv["below_grid"], boot_beyond_grid=iv["beyond_grid"])
        rep, why = reported_interval(iv, hv if res.half is not None else None, n_instances=res.n_instances)
        if rep is None:
            ident, text = "cannot decide", f"cannot decide: {why}"
        else:
            ident, text = interval_statement(f.alpha_star, f.status, rep, res.ratios, confidence,
                                             closed_note=" (what the sigmoid and the model-free crossing both allow)")
            row.update(alpha_star_low=rep["low"], alpha_star_high=rep["high"])
    row.update(alpha_star_identified=ident, alpha_star_interval=text)
    if f.ok and ident != "identified":
        row["reason"] = f"{f.reason}; {text}"
    h_ident, h_text = interval_statement(res.half, res.half_status, hv, res.ratios, confidence,
                                         closed_note=" (rounded out to the tested ratios)")
    gap = crossing_gap(res.half, res.ratios)
    row.update(alpha_half=res.half, alpha_half_status=res.half_status, alpha_half_low=hv["low"],
               alpha_half_high=hv["high"], alpha_half_identified=h_ident, alpha_half_interval=h_text,
               alpha_half_gap=list(gap) if gap is not None else None, alpha_half_rule=CROSSING_RULE,
               half_boot_valid=hv["ok"] if res.half is not None else None,
               half_boot_below_grid=hv["below_grid"] if res.half is not None else None,
               half_boot_beyond_grid=hv["beyond_grid"] if res.half is not None else None)
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
