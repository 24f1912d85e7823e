"""Paired comparison of selection strategies: does route preservation move the cliff?

For one scorer under one (model, regime), two presses that differ only in their selection (e.g.
``expected_attention+routes`` against ``expected_attention+adakv``) ran on the same instances at
the same ratios. The bootstrap therefore resamples instances *jointly*: each replicate draws one
set of instances and recomputes both hallucination curves, both α* (grid fit, as in
:mod:`kvroute.analysis.cliff`) and their difference. The interval of Δα* = α*(b) − α*(a) is the
percentile interval over replicates in which both curves show a cliff; ΔH at each ratio is paired
the same way.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from kvroute.analysis.bootstrap import boot_means, instance_matrix, percentile_interval, resample_weights
from kvroute.analysis.common import BASELINE_PRESS, attach_baseline, group_seed, has_columns
from kvroute.analysis.sigmoid import MIN_AMPLITUDE, fit_sigmoid, grid_for, has_cliff

TARGET = "routes"
BASELINES = ("adakv", "per_head")


def _split(press: str) -> tuple[str, str]:
    scorer, _, selection = press.partition("+")
    return scorer, selection or "per_head"


def press_pairs(presses: Sequence[str], target: str = TARGET, baselines: Sequence[str] = BASELINES) -> list[tuple[str, str]]:
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
    ma = np.where(has_cliff(reps_a, min_amplitude), grid.best(reps_a)["mid"], np.nan)
    mb = np.where(has_cliff(reps_b, min_amplitude), grid.best(reps_b)["mid"], np.nan)
    d = mb - ma
    valid = np.isfinite(d)
    lo = hi = None
    if valid.mean() >= 0.5:
        lo, hi = (float(x) for x in percentile_interval(d[valid], confidence))
    dh = reps_b - reps_a
    dh_lo, dh_hi = percentile_interval(dh, confidence)
    top = np.asarray(ra) >= 0.7
    # alpha_star is set exactly when a fit is ok
    delta_alpha = fb.alpha_star - fa.alpha_star if fa.alpha_star is not None and fb.alpha_star is not None else None
    return {
        "press_a": press_a, "press_b": press_b, "n_instances": len(ia),
        "alpha_a": fa.alpha_star, "alpha_b": fb.alpha_star, "status_a": fa.status, "status_b": fb.status,
        "delta_alpha": delta_alpha,
        "delta_alpha_low": lo, "delta_alpha_high": hi, "boot_valid": float(valid.mean()),
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
