"""Planted truth for the safe ratio: its size at the margin, exact test against the percentile bootstrap.

Each simulated set has ``n`` instances answered uncompressed (hallucinating with probability
``H(0)`` = :data:`H0`) and at every compressed ratio of :data:`RATIOS`; at each ratio an instance
turns to hallucination with unconditional probability ``p_up`` and back with ``p_down``, so the
true paired excess H(α) − H(0) is ``p_up − p_down`` at every ratio. Planted **exactly at the
margin** (excess = δ = 0.05), a certified positive safe ratio is a false certification: its share
is the test's size and must stay ≤ 0.05. A second plant with no excess and no churn shows the power.

Rows: per (n, churn), the share of sets with a positive safe ratio under the exact test the report
uses (:func:`kvroute.analysis.cliff.safe_ratio`) and under the former rule, a percentile-bootstrap
upper bound (the mutant).
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from kvroute.analysis.cliff import safe_ratio

RATIOS = np.array([0.0, 0.25, 0.5, 0.7, 0.8, 0.85, 0.9])
H0 = 0.69
DELTA = 0.05
N_BOOT = 400


def simulate(n_sets: int, n: int, p_up: float, p_down: float, rng: np.random.Generator,
             h0: float = H0) -> Iterator[np.ndarray]:
    """0/1 matrices ``[n, ratios]`` with the planted excess ``p_up − p_down`` at every compressed ratio."""
    for _ in range(n_sets):
        base = rng.random(n) < h0
        cols = [base]
        for _ in RATIOS[1:]:
            u = rng.random(n)
            up = ~base & (u < p_up / (1 - h0))
            down = base & (u < p_down / h0)
            cols.append(np.where(up, True, np.where(down, False, base)))
        yield np.stack(cols, 1).astype(float)


def bootstrap_safe_ratio(y: np.ndarray, rng: np.random.Generator, delta: float = DELTA,
                         n_boot: int = N_BOOT) -> float:
    """The mutant: the former rule, a one-sided 95% percentile-bootstrap bound of the paired excess."""
    w = rng.multinomial(len(y), np.full(len(y), 1 / len(y)), size=n_boot)
    reps = w @ y / len(y)
    upper = np.quantile(reps - reps[:, [0]], 0.95, axis=0)
    safe = 0.0
    for r, u in zip(RATIOS[1:], upper[1:], strict=True):
        if u > delta:
            break
        safe = float(r)
    return safe


#: sets per row are this many times the benchmark's ``n_sets``: a rate near 0.05 from 200 sets carries a Monte
#: Carlo error of ±0.015, the size of the margin being checked (the sets are cheap)
SET_FACTOR = 10


def coverage(n_sets: int = 200, seed: int = 0) -> list[dict]:
    """Rows per (n, churn) for the margin plant, and the power plant (see the module docstring)."""
    rows: list[dict] = []
    n_sets = n_sets * SET_FACTOR
    for n in (32, 64, 200):
        for churn in (0.0, 0.06):
            rng = np.random.default_rng([seed, n, int(churn * 100)])
            sets = list(simulate(n_sets, n, DELTA + churn, churn, rng))
            ones = np.ones_like(sets[0])
            exact = float(np.mean([(safe_ratio(RATIOS, y, ones, delta=DELTA, bounds=False)[0] or 0.0) > 0
                                   for y in sets]))
            mutant = float(np.mean([bootstrap_safe_ratio(y, rng) > 0 for y in sets]))
            rows.append({"estimator": "safe ratio (exact)", "parameter": "false certification at the margin",
                         "truth": DELTA, "n_sets": n_sets, "n_instances": n, "churn": churn, "mean_estimate": None,
                         "coverage": None, "rejection_rate": exact, "mutant_rejection_rate": mutant,
                         "note": "excess exactly δ at every ratio: the share certifying a positive safe ratio must "
                                 "be ≤ 0.05; the mutant is the percentile-bootstrap bound"})
        rng = np.random.default_rng([seed, n, 999])
        sets = list(simulate(n_sets, n, 0.0, 0.0, rng))
        ones = np.ones_like(sets[0])
        power = float(np.mean([safe_ratio(RATIOS, y, ones, delta=DELTA, bounds=False)[0] == RATIOS[-1]
                               for y in sets]))
        rows.append({"estimator": "safe ratio (exact)", "parameter": "certifies every ratio (power)", "truth": 0.0,
                     "n_sets": n_sets, "n_instances": n, "churn": 0.0, "mean_estimate": None, "coverage": None,
                     "rejection_rate": power, "note": "no excess, no churn: the share certifying the whole grid"})
    return rows
