"""Planted truth for the cliff: simulated record sets with a known α*, and the coverage of its intervals.

Each simulated set is one curve of ``N_INSTANCES`` instances over the demo's ratio grid
(:data:`~kvroute.analysis.synthetic.RATIO_GRID`), drawn the way
:func:`~kvroute.analysis.synthetic.synthetic_records` draws hallucination: each instance is
"always" (probability ``lo``), "never" (``1 − hi``) or has a personal threshold
``α* + logit(u)/k`` and fails at every ratio above it (instance-correlated failures), and a share
``noise`` of cells is redrawn independently with probability H(α). So E[Ĥ(α)] =
``lo + (hi − lo) σ(k (α − α*))`` exactly.

Truths: α* ∈ {0.6, 0.75, 0.85, 0.93}, each with a curve that saturates (``hi = 1``) and one that
does not (``hi = 0.8``). Estimators, run exactly as the report runs them
(:func:`kvroute.analysis.cliff.analyse_matrix`, the instance-clustered bootstrap, the censored
interval of :func:`~kvroute.analysis.cliff.censored_interval`):

* ``sigmoid α*`` — the bounded sigmoid midpoint; truth α*.
* ``monotone α½`` — the monotone (isotonic) halfway crossing; its own truth is the same
  functional of the *true* H on the grid (linear interpolation between grid points makes it
  differ from α* by up to ~0.01 here), and a second row scores it against α* itself. Its
  interval is the report's, :func:`~kvroute.analysis.cliff.crossing_interval`: the bootstrap
  percentiles rounded out to the tested ratios (a model-free crossing is located to a gap of
  the grid; ``median_width`` is therefore a sum of gaps).

Two economies against the report, both documented in the rows' ``note``: ``n_boot`` replicates per
set (default 200, the report uses 1000) and a coarser (α*, k) grid for the replicates (α* in steps
of 0.005, 20 steepnesses; the report's grid has 0.0025 and 40). The point estimate is the report's.

Coverage counts the sets whose interval (an open end is unbounded) contains the truth, among the
sets that gave an interval; ``share_identified`` is the share of sets with a closed interval,
``share_open`` with one open end, ``share_not_identified`` with no identified point estimate or an
interval open at both ends. ``coverage_closed`` is the coverage among closed intervals only.
"""

from __future__ import annotations

import time

import numpy as np

from kvroute.analysis.bootstrap import resample_weights
from kvroute.analysis.cliff import analyse_matrix, censored_interval, crossing_interval, halfway_crossing
from kvroute.analysis.sigmoid import BELOW_GRID, BEYOND_GRID, SigmoidGrid
from kvroute.analysis.synthetic import RATIO_GRID

N_INSTANCES = 48
ALPHA_STARS: tuple[float, ...] = (0.6, 0.75, 0.85, 0.93)
CURVES: tuple[tuple[float, float], ...] = ((0.03, 1.0), (0.05, 0.8))  # (lo, hi): saturating, not saturating
K = 40.0
NOISE = 0.2
CONFIDENCE = 0.95


def true_h(ratios: np.ndarray, alpha_star: float, lo: float, hi: float, k: float = K) -> np.ndarray:
    """E[Ĥ(α)] of the simulated curves."""
    return lo + (hi - lo) / (1 + np.exp(-k * (np.asarray(ratios, float) - alpha_star)))


def simulate(rng: np.random.Generator, alpha_star: float, lo: float, hi: float, *, n: int = N_INSTANCES,
             ratios: tuple[float, ...] = RATIO_GRID, k: float = K, noise: float = NOISE) -> np.ndarray:
    """One record set as a 0/1 hallucination matrix ``[n instances, ratios]`` (synthetic.py's model)."""
    a = np.asarray(ratios, float)[None, :]
    kind = rng.random(n)[:, None]
    u = rng.uniform(1e-6, 1 - 1e-6, n)[:, None]
    thr = alpha_star + np.log(u / (1 - u)) / k
    hall = np.where(kind < lo, True, np.where(kind < hi, a >= thr, False))
    redraw = rng.random(hall.shape) < noise
    hall = np.where(redraw, rng.random(hall.shape) < true_h(a, alpha_star, lo, hi, k), hall)
    return hall.astype(float)


def _summarise(est: list[float | None], ivs: list[dict | None], truth: float) -> dict[str, object]:
    n = len(est)
    got = [iv for iv in ivs if iv is not None]
    closed = [iv for iv in got if iv["state"] == "closed"]
    opened = [iv for iv in got if iv["state"] in ("open_above", "open_below")]

    def covers(iv: dict) -> bool:
        lo = -np.inf if iv["low"] is None else iv["low"]
        hi = np.inf if iv["high"] is None else iv["high"]
        return bool(lo <= truth <= hi)

    usable = closed + opened
    vals = [e for e in est if e is not None]
    return {
        "mean_estimate": float(np.mean(vals)) if vals else None,
        "coverage": float(np.mean([covers(iv) for iv in usable])) if usable else None,
        "coverage_closed": float(np.mean([covers(iv) for iv in closed])) if closed else None,
        "share_identified": len(closed) / n, "share_open": len(opened) / n,
        "share_not_identified": 1 - (len(closed) + len(opened)) / n,
        "share_at_edge": float(np.mean([iv["below_grid"] + iv["beyond_grid"] for iv in got])) if got else None,
        "median_width": (float(np.median([iv["high"] - iv["low"] for iv in closed])) if closed else None),
    }


def coverage(n_sets: int = 200, seed: int = 0, *, n_boot: int = 200) -> list[dict]:
    """Rows per (estimator, α*, curve): the share of 95% intervals covering the truth, over ``n_sets`` sets."""
    ratios = np.asarray(RATIO_GRID, float)
    grid = SigmoidGrid(ratios, mid_step=0.005, n_k=20)
    rows: list[dict] = []
    for ai, astar in enumerate(ALPHA_STARS):
        for ci, (lo, hi) in enumerate(CURVES):
            t0 = time.perf_counter()
            rng = np.random.default_rng([seed, ai, ci])
            h_true = true_h(ratios, astar, lo, hi)
            half_truth_arr, half_code, _ = halfway_crossing(ratios, h_true[None, :], np.ones(len(ratios)))
            half_truth = float(half_truth_arr[0]) if np.isfinite(half_truth_arr[0]) else None
            sig_est, sig_iv, mono_est, mono_iv, sat = [], [], [], [], 0
            for _ in range(n_sets):
                y = simulate(rng, astar, lo, hi)
                counts = np.ones_like(y)
                w = resample_weights(len(y), n_boot, rng)
                res = analyse_matrix(ratios, y, counts, w, rng=rng, grid=grid)
                sig_est.append(res.fit.alpha_star)
                sig_iv.append(censored_interval(res.alpha_reps, res.alpha_codes, CONFIDENCE) if res.fit.ok else None)
                mono_est.append(res.half)
                mono_iv.append(crossing_interval(res.half_reps, res.half_codes, ratios, CONFIDENCE)
                               if res.half is not None else None)
                sat += bool(res.fit.ok)
            secs = time.perf_counter() - t0
            curve = f"lo={lo:g}, hi={hi:g} ({'saturates at 1' if hi == 1 else 'does not saturate'})"
            common = {"n_sets": n_sets, "alpha_star": astar, "lo": lo, "hi": hi, "n_instances": N_INSTANCES,
                      "n_boot": n_boot, "seconds": round(secs, 1)}
            s = _summarise(sig_est, sig_iv, astar)
            rows.append({"estimator": "sigmoid α*", "parameter": "alpha_star", "truth": astar, **common, **s,
                         "share_detected": sat / n_sets,
                         "note": f"bounded sigmoid midpoint, censored bootstrap interval; {curve}; "
                                 f"k={K:g}, noise={NOISE:g}; replicates on a 0.005 × 20-k grid"})
            if half_truth is not None:
                s = _summarise(mono_est, mono_iv, half_truth)
                rows.append({"estimator": "monotone α½", "parameter": "alpha_half", "truth": half_truth, **common, **s,
                             "share_detected": float(np.mean([e is not None for e in mono_est])),
                             "note": "isotonic halfway crossing vs. the same crossing of the true H on the grid, "
                                     f"interval rounded out to the tested ratios; {curve}"})
            else:
                rows.append({"estimator": "monotone α½", "parameter": "alpha_half", "truth": None, **common,
                             "mean_estimate": None, "coverage": None,
                             "note": ("the true curve's crossing is "
                                      + ("beyond" if half_code[0] == BEYOND_GRID
                                         else "below" if half_code[0] == BELOW_GRID else "not on")
                                      + f" the grid: not identifiable; {curve}")})
            s = _summarise(mono_est, mono_iv, astar)
            rows.append({"estimator": "monotone α½", "parameter": "alpha_star", "truth": astar, **common, **s,
                         "share_detected": float(np.mean([e is not None for e in mono_est])),
                         "note": f"the model-free crossing scored against the sigmoid's α*; {curve}"})
    return rows
