"""Planted truth for the answer-identity probe: a readout of known accuracy, and what the interval covers.

Each item has two candidates over 30 layers of small noise; in the last four layers the gold's
lens value is raised with probability :data:`ACCURACY` (otherwise the distractor's is), so a readout
of those layers has true accuracy 0.65. The rows give, per number of instances, the share of sets
whose interval covers 0.65, the share of zero-width intervals and the median width — for the
report's interval (the whole procedure bootstrapped, :func:`kvroute.analysis.probe.identity_probe`)
and for the mutant, a bootstrap of the fixed out-of-fold credits (the former interval, which read
"0.50 [0.50, 0.50]" whenever every fold abstained). Below
:data:`~kvroute.analysis.probe.MIN_IDENTITY_INSTANCES` instances the finding says it cannot decide.

Each set reruns the whole procedure about 150 times, so the sets are capped at :data:`MAX_SETS`.
"""

from __future__ import annotations

import numpy as np

from kvroute.analysis.condlogit import pad
from kvroute.analysis.probe import (
    IDENTITY_BINS,
    IDENTITY_L2,
    MIN_IDENTITY_INSTANCES,
    _bootstrap_mean,
    _procedure,
    candidate_features,
    identity_probe,
)

ACCURACY = 0.65
SIZES: tuple[int, ...] = (19, 64)
MAX_SETS = 200  # as many as every other coverage row; the probe's rows are the slowest of the planted-truth run


def simulate(rng: np.random.Generator, n: int, accuracy: float = ACCURACY) -> list[np.ndarray]:
    """``n`` items ``[2, 30]``: the last four layers name the gold with probability ``accuracy``."""
    items = []
    for _ in range(n):
        m = rng.normal(size=(2, 30)) * 0.1
        m[0 if rng.random() < accuracy else 1, -4:] += abs(rng.normal()) + 0.5
        items.append(m)
    return items


def coverage(n_sets: int = 200, seed: int = 0) -> list[dict]:
    """Rows per number of instances: coverage of the planted accuracy, zero-width share, median width."""
    rows = []
    sets = min(n_sets, MAX_SETS)
    for n in SIZES:
        rng = np.random.default_rng([seed, n])
        cov, zero, width, m_cov, m_zero = [], [], [], [], []
        for k in range(sets):
            items = simulate(rng, n)
            r = identity_probe(items, seed=k)
            cov.append(r["accuracy_low"] <= ACCURACY <= r["accuracy_high"])
            zero.append(r["accuracy_high"] - r["accuracy_low"] < 1e-9)
            width.append(r["accuracy_high"] - r["accuracy_low"])
            # the mutant: the former interval, a bootstrap of this run's fixed out-of-fold credits
            X, M = pad([candidate_features(m, IDENTITY_BINS) for m in items])
            g = np.arange(n).astype(str)
            credit = _procedure(X, M, g, 5, IDENTITY_L2, True, 4, np.random.default_rng(k))[0]
            lo, hi = _bootstrap_mean(credit, g, 1000, 0.95, np.random.default_rng(k))
            m_cov.append(lo <= ACCURACY <= hi)
            m_zero.append(hi - lo < 1e-9)
        rows.append({"estimator": "identity probe (whole procedure)", "parameter": "accuracy", "truth": ACCURACY,
                     "n_sets": sets, "n_instances": n, "mean_estimate": None, "coverage": float(np.mean(cov)),
                     "share_zero_width": float(np.mean(zero)), "median_width": float(np.median(width)),
                     "mutant_coverage": float(np.mean(m_cov)), "mutant_share_zero_width": float(np.mean(m_zero)),
                     "note": ("the finding says 'cannot decide' below "
                              f"{MIN_IDENTITY_INSTANCES} instances" if n < MIN_IDENTITY_INSTANCES else
                              "the mutant bootstraps the fixed out-of-fold credits")})
    return rows
