"""Paired comparison of selection strategies: does route preservation move the cliff?

For one scorer under one (model, regime), two presses that differ only in their selection (e.g.
``expected_attention+routes`` against ``expected_attention+adakv``) ran on the same instances at
the same ratios. The bootstrap therefore resamples instances *jointly*: each replicate draws one
set of instances and recomputes both hallucination curves, both α* and their difference. ΔH at
each ratio is paired the same way.

Each replicate's α* comes from :meth:`~kvroute.analysis.sigmoid.SigmoidGrid.midpoints`, the rule
the cliff analysis applies to its point estimate and its replicates alike (bounded fit, tied
midpoints drawn across their tie, ``no_cliff`` / ``below_grid`` / ``beyond_grid`` by
:func:`~kvroute.analysis.sigmoid.edge_codes`). A replicate whose midpoint is not identified is
*not* clamped at the grid's edge: the difference is censored (:func:`delta_codes`) — +∞ when b
lies beyond the grid (or a below it) while the other is identified or off the opposite edge, −∞
symmetrically, and unknown when both sit off the same edge or either has no cliff — and the
interval is :func:`~kvroute.analysis.cliff.censored_interval`'s, with an end *open* (None) where
its percentile falls on such a replicate. ``delta_alpha_identified`` and ``delta_alpha_interval``
say so in words; ``boot_*_a`` / ``boot_*_b`` give each press's share of replicates at each edge.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from kvroute.analysis.bootstrap import boot_means, instance_matrix, percentile_interval, resample_weights
from kvroute.analysis.cliff import censored_interval
from kvroute.analysis.common import BASELINE_PRESS, attach_baseline, group_seed, has_columns
from kvroute.analysis.sigmoid import BELOW_GRID, BEYOND_GRID, MIN_AMPLITUDE, NO_CLIFF, OK, fit_sigmoid, grid_for

TARGET = "routes"
BASELINES = ("adakv", "per_head")


def _split(press: str) -> tuple[str, str]:
    scorer, _, selection = press.partition("+")
    return scorer, selection or "per_head"


def press_pairs(presses: Sequence[str], target: str = TARGET,
                baselines: Sequence[str] = BASELINES) -> list[tuple[str, str]]:
    """(baseline press, target press) pairs sharing a scorer, e.g. (``ea+adakv``, ``ea+routes``)."""
    by = {_split(p): p for p in presses if p != BASELINE_PRESS}
    pairs = []
    for (scorer, sel), p in sorted(by.items()):
        if sel.split("[")[0] != target:
            continue
        for b in baselines:
            match = [q for (s2, sel2), q in by.items() if s2 == scorer and sel2.split("[")[0] == b]
            pairs += [(q, p) for q in match]
    return pairs


def delta_codes(mid_a: np.ndarray, codes_a: np.ndarray, mid_b: np.ndarray,
                codes_b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Replicates of Δα* = α*(b) − α*(a) and their censoring codes, from each press's midpoints and codes.

    ``OK`` where both midpoints are identified; ``BEYOND_GRID`` (Δ = +∞) where b lies beyond the
    grid and a does not, or a below it and b does not; ``BELOW_GRID`` (Δ = −∞) symmetrically;
    ``NO_CLIFF`` (Δ unknown: −∞ for the lower and +∞ for the upper bound) where both lie off the
    same edge or either has no cliff (or no data).
    """
    ca, cb = np.asarray(codes_a, int), np.asarray(codes_b, int)
    # each side as −1 (below), 0 (identified), +1 (beyond); NaN where it could be anything
    side = {OK: 0.0, BELOW_GRID: -1.0, BEYOND_GRID: 1.0}
    sa = np.array([side.get(int(c), np.nan) for c in ca])
    sb = np.array([side.get(int(c), np.nan) for c in cb])
    diff = sb - sa  # sign of the censored difference
    codes = np.full(len(ca), NO_CLIFF, dtype=int)
    both_ok = (sa == 0) & (sb == 0)
    codes[both_ok] = OK
    codes[np.isfinite(diff) & (diff > 0)] = BEYOND_GRID
    codes[np.isfinite(diff) & (diff < 0)] = BELOW_GRID  # diff == 0 off the same edge stays unknown
    d = np.where(both_ok, np.asarray(mid_b, float) - np.asarray(mid_a, float), np.nan)
    return d, codes


def delta_statement(delta: float | None, status_a: str, status_b: str, iv: dict[str, object],
                    confidence: float) -> tuple[str, str]:
    """``(identified, text)`` for Δα* and its censored interval ``iv`` (see :func:`delta_codes`)."""
    if delta is None:
        return "not identified", f"not identified (fit a: {status_a}, fit b: {status_b})"
    up, down, unknown = (f"{iv[k]:.0%}" for k in ("beyond_grid", "below_grid", "no_cliff"))
    if iv["state"] == "closed":
        return "identified", f"[{iv['low']:+.3f}, {iv['high']:+.3f}]"
    why = (f"{up} of replicates with b beyond the grid or a below it, {down} with b below or a beyond, "
           f"{unknown} with no cliff or both off the same edge")
    if iv["state"] == "open_above":
        return "open_above", f"[{iv['low']:+.3f}, open): the upper end is not identified — {why}"
    if iv["state"] == "open_below":
        return "open_below", f"(open, {iv['high']:+.3f}]: the lower end is not identified — {why}"
    return "not identified", f"not identified: the {confidence:.0%} interval is open at both ends — {why}"


def compare_pair(df: pd.DataFrame, press_a: str, press_b: str, *, n_boot: int = 1000, confidence: float = 0.95,
                 seed: int = 0, min_amplitude: float = MIN_AMPLITUDE) -> dict[str, object] | None:
    """Δα* (b − a) and ΔH per ratio for one (model, regime)'s records ``df``, paired over instances."""
    a, b = df[df["press"] == press_a], df[df["press"] == press_b]
    common = sorted(set(a["instance_id"]) & set(b["instance_id"]))
    if len(common) < 2:
        return None
    a, b = a[a["instance_id"].isin(common)], b[b["instance_id"].isin(common)]
    ia, ra, sa, ca = instance_matrix(a, "hallucinated")
    ib, rb, sb, cb = instance_matrix(b, "hallucinated")
    if list(ia) != list(ib) or list(ra) != list(rb):
        return None
    w = resample_weights(len(ia), n_boot, group_seed(seed, ("compare", press_a, press_b)))
    reps_a, reps_b = boot_means(sa, ca, w), boot_means(sb, cb, w)  # [n_boot, C]
    h_a, h_b = sa.sum(0) / np.maximum(ca.sum(0), 1), sb.sum(0) / np.maximum(cb.sum(0), 1)
    fa = fit_sigmoid(ra, h_a, min_amplitude=min_amplitude)
    fb = fit_sigmoid(rb, h_b, min_amplitude=min_amplitude)
    grid = grid_for(tuple(np.asarray(ra, float).tolist()))
    rng = group_seed(seed, ("compare-ties", press_a, press_b))
    ma, codes_a = grid.midpoints(reps_a, min_amplitude=min_amplitude, rng=rng)
    mb, codes_b = grid.midpoints(reps_b, min_amplitude=min_amplitude, rng=rng)
    d, d_codes = delta_codes(ma, codes_a, mb, codes_b)
    iv = censored_interval(d, d_codes, confidence)
    dh = reps_b - reps_a
    dh_lo, dh_hi = percentile_interval(dh, confidence)
    top = np.asarray(ra) >= 0.7
    # alpha_star is set exactly when a fit is ok
    delta_alpha = fb.alpha_star - fa.alpha_star if fa.alpha_star is not None and fb.alpha_star is not None else None
    ident, text = delta_statement(delta_alpha, fa.status, fb.status, iv, confidence)
    if delta_alpha is None:
        iv = {**iv, "low": None, "high": None}
    edges = {f"boot_{name}_{side}": float(np.mean(c == code)) for side, c in (("a", codes_a), ("b", codes_b))
             for name, code in (("below_grid", BELOW_GRID), ("beyond_grid", BEYOND_GRID), ("no_cliff", NO_CLIFF))}
    return {
        "press_a": press_a, "press_b": press_b, "n_instances": len(ia),
        "alpha_a": fa.alpha_star, "alpha_b": fb.alpha_star, "status_a": fa.status, "status_b": fb.status,
        "delta_alpha": delta_alpha,
        "delta_alpha_low": iv["low"], "delta_alpha_high": iv["high"], "delta_alpha_identified": ident,
        "delta_alpha_interval": text, "boot_valid": iv["ok"], **edges,
        "delta_h_top": float(np.mean(h_b[top] - h_a[top])) if top.any() else None,
        "delta_h_top_low": float(np.nanpercentile(np.nanmean(dh[:, top], axis=1), 100 * (1 - confidence) / 2))
        if top.any() else None,
        "delta_h_top_high": float(np.nanpercentile(np.nanmean(dh[:, top], axis=1), 100 * (1 + confidence) / 2))
        if top.any() else None,
        "curve": [{"ratio": float(r), "h_a": float(x), "h_b": float(y), "delta_h": float(y - x),
                   "delta_low": float(lo_), "delta_high": float(hi_)}
                  for r, x, y, lo_, hi_ in zip(ra, h_a, h_b, dh_lo, dh_hi, strict=True)],
    }


def selection_comparison(df: pd.DataFrame, *, target: str = TARGET, baselines: Sequence[str] = BASELINES,
                         n_boot: int = 1000, confidence: float = 0.95, seed: int = 0) -> pd.DataFrame:
    """Every (baseline, target) press pair per (model, regime), families pooled. Empty when there is none."""
    if not has_columns(df, ["hallucinated"]):
        return pd.DataFrame()
    data = attach_baseline(df)
    rows = []
    for (model, regime), g in data.groupby(["model", "regime"], sort=True):
        for pa, pb in press_pairs(sorted(g["press"].unique()), target, baselines):
            r = compare_pair(g, pa, pb, n_boot=n_boot, confidence=confidence, seed=seed)
            if r is not None:
                rows.append({"model": model, "regime": regime, **r})
    return pd.DataFrame(rows)
