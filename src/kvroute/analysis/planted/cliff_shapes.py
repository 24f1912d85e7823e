"""Planted truth for the cliff on shapes the sigmoid does not have, few to many instances.

:mod:`kvroute.analysis.planted.cliff` plants the logistic curve the sigmoid estimator fits; a
review of the estimators found that on other shapes the sigmoid α*'s interval covers the true
halfway point far less often (a skewed α⁶ rise 0.87, a two-step cliff 0.68, a high baseline with a
small amplitude identified in 62% of sets). This module plants those shapes
(:data:`SHAPES`): a skewed rise, an early-steep Gompertz, a two-step cliff, a late logistic and a
high baseline 0.69 → 0.95, at :data:`SIZES` instances.

Simulation: instance i hallucinates at every ratio with probability H(0) (the baseline failures,
hard instances that fail uncompressed); otherwise it has a personal threshold t_i drawn from the
planted rise, ``P(t_i ≤ α) = (H(α) − H(0)) / (1 − H(0))``, and fails at every ratio from t_i on
(instance-correlated failures). A share :data:`CHURN` of cells is redrawn independently with
probability H(α) (answers that flip for no reason). So E[Ĥ(α)] = H(α) exactly.

The truth is the **halfway point** of the planted curve: the α where the continuous H crosses
``(H(0) + H(α_max)) / 2`` (the estimand of the model-free crossing, and the sigmoid's midpoint on a
sigmoid). Rows per (estimator, shape, n): coverage among sets with an interval (an open end is
unbounded), the share of sets where the estimator says it cannot decide, and the median width of
closed intervals. The estimators are the report's: ``sigmoid α*`` (the fit and its censored
interval alone), ``monotone α½`` (the rounded-out crossing), and ``reported α*`` — what the cliff
table prints: the sigmoid's midpoint with the interval that both estimators allow (their hull), or
"cannot decide" where they disagree (:func:`kvroute.analysis.cliff.reported_interval`).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from scipy.optimize import brentq

from kvroute.analysis.bootstrap import resample_weights
from kvroute.analysis.cliff import analyse_matrix, censored_interval, crossing_interval, reported_interval
from kvroute.analysis.sigmoid import SigmoidGrid
from kvroute.analysis.synthetic import RATIO_GRID

SIZES: tuple[int, ...] = (8, 24, 64, 200)
CHURN = 0.06
CONFIDENCE = 0.95
#: the widest interval a row may print and still count as informative (the grid's 0.5–0.85 span)
MAX_WIDTH = 0.35


def _logistic(mid: float, k: float, lo: float = 0.03, hi: float = 0.97) -> Callable[[np.ndarray], np.ndarray]:
    return lambda a: lo + (hi - lo) / (1 + np.exp(-k * (np.asarray(a, float) - mid)))


#: planted H(α) per shape (each non-decreasing on [0, 1])
SHAPES: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "logistic (control)": _logistic(0.8, 30.0),
    "skewed α⁶": lambda a: 0.03 + 0.94 * np.asarray(a, float) ** 6,
    "Gompertz, early-steep": lambda a: 0.03 + 0.94 * np.exp(-np.exp(-14 * (np.asarray(a, float) - 0.62))),
    "two-step": lambda a: 0.03 + 0.35 / (1 + np.exp(-120 * (np.asarray(a, float) - 0.6)))
    + 0.59 / (1 + np.exp(-120 * (np.asarray(a, float) - 0.9))),
    "high baseline 0.69 → 0.95": _logistic(0.9, 40.0, 0.69, 0.95),
}


def halfway_truth(h: Callable[[np.ndarray], np.ndarray], ratios: np.ndarray) -> float:
    """Where the continuous curve crosses halfway between its value at the first and the last tested ratio."""
    lo, hi = float(h(ratios[0])), float(h(ratios[-1]))
    level = (lo + hi) / 2
    return float(brentq(lambda a: float(h(np.array(a))) - level, ratios[0], ratios[-1]))


def simulate(rng: np.random.Generator, h: Callable[[np.ndarray], np.ndarray], n: int,
             ratios: np.ndarray, churn: float = CHURN) -> np.ndarray:
    """One 0/1 matrix ``[n, ratios]`` with E[Ĥ(α)] = h(α) (see the module docstring)."""
    fine = np.linspace(0, 1, 4001)
    base = float(h(np.array(0.0)))
    cdf = np.maximum.accumulate((h(fine) - base) / (1 - base))  # P(t ≤ α)
    always = rng.random(n) < base
    u = rng.random(n)
    t = np.where(u < cdf[-1], np.interp(u, cdf, fine), np.inf)  # inverse CDF; past the top: never fails
    flags = always[:, None] | (ratios[None, :] >= t[:, None])
    redraw = rng.random(flags.shape) < churn
    return np.where(redraw, rng.random(flags.shape) < h(ratios)[None, :], flags).astype(float)


def _row(name: str, n: int, truth: float, ivs: list[dict | None], ests: list[float | None]) -> dict[str, object]:
    got = [iv for iv in ivs if iv is not None and iv["state"] != "open"]

    def covers(iv: dict) -> bool:
        lo = -np.inf if iv["low"] is None else iv["low"]
        hi = np.inf if iv["high"] is None else iv["high"]
        return bool(lo <= truth <= hi)

    closed = [iv for iv in got if iv["state"] == "closed"]
    vals = [e for e in ests if e is not None]
    widths = [iv["high"] - iv["low"] for iv in closed]
    return {"coverage": float(np.mean([covers(iv) for iv in got])) if got else None,
            "cannot_decide": 1 - len(got) / len(ivs), "median_width": float(np.median(widths)) if widths else None,
            "share_too_wide": float(np.mean([w > MAX_WIDTH for w in widths])) if widths else None,
            "mean_estimate": float(np.mean(vals)) if vals else None, "n_instances": n, "truth": truth}


def coverage(n_sets: int = 200, seed: int = 0, *, n_boot: int = 200) -> list[dict]:
    """Rows per (estimator, shape, instances): coverage of the halfway truth, 'cannot decide' share, width."""
    ratios = np.asarray(RATIO_GRID, float)
    grid = SigmoidGrid(ratios, mid_step=0.005, n_k=20)
    rows: list[dict] = []
    for si, (shape, h) in enumerate(SHAPES.items()):
        truth = halfway_truth(h, ratios)
        for n in SIZES:
            rng = np.random.default_rng([seed, si, n])
            res_s: list[dict | None] = []
            res_m: list[dict | None] = []
            res_r: list[dict | None] = []
            est_s, est_m = [], []
            for _ in range(n_sets):
                y = simulate(rng, h, n, ratios)
                res = analyse_matrix(ratios, y, np.ones_like(y), resample_weights(n, n_boot, rng), rng=rng, grid=grid)
                sig = censored_interval(res.alpha_reps, res.alpha_codes, CONFIDENCE) if res.fit.ok else None
                mono = (crossing_interval(res.half_reps, res.half_codes, ratios, CONFIDENCE)
                        if res.half is not None else None)
                res_s.append(sig)
                res_m.append(mono)
                res_r.append(reported_interval(sig, mono, n_instances=n)[0])
                est_s.append(res.fit.alpha_star)
                est_m.append(res.half)
            common = {"parameter": "halfway point", "shape": shape, "n_sets": n_sets, "n_boot": n_boot,
                      "churn": CHURN}
            rows.append({"estimator": "sigmoid α* (alone)", **common, **_row(shape, n, truth, res_s, est_s),
                         "note": "the fit's own censored interval; 'cannot decide' = no identified midpoint"})
            rows.append({"estimator": "monotone α½", **common, **_row(shape, n, truth, res_m, est_m),
                         "note": "isotonic crossing, interval rounded out to the tested ratios"})
            rows.append({"estimator": "reported α*", **common, **_row(shape, n, truth, res_r, est_s),
                         "note": "what the cliff table prints: the hull of both intervals, 'cannot decide' "
                                 "where they are disjoint or either is missing"})
    return rows
