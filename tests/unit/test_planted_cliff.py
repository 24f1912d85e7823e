"""Planted truth for the cliff: the estimators recover known midpoints and their intervals cover them.

A small version of ``coverage(200)`` (see kvroute.analysis.planted.cliff); asserted loosely.
"""

import numpy as np
import pytest

from kvroute.analysis.planted.cliff import ALPHA_STARS, CURVES, coverage, simulate, true_h
from kvroute.analysis.synthetic import RATIO_GRID

pytestmark = pytest.mark.statistical  # planted-truth coverage over many simulated sets: `make test-fast` leaves it out

REQUIRED = {"estimator", "parameter", "truth", "n_sets", "mean_estimate", "coverage", "note"}


@pytest.fixture(scope="module")
def rows() -> list[dict]:
    return coverage(n_sets=30, seed=1)


def test_the_simulation_has_the_planted_curve_in_expectation():
    rng = np.random.default_rng(0)
    y = np.mean([simulate(rng, 0.85, 0.03, 1.0).mean(axis=0) for _ in range(300)], axis=0)
    np.testing.assert_allclose(y, true_h(np.array(RATIO_GRID), 0.85, 0.03, 1.0), atol=0.02)


def test_rows_follow_the_planted_convention(rows):
    assert len(rows) == 3 * len(ALPHA_STARS) * len(CURVES)
    for r in rows:
        assert REQUIRED <= set(r), r
        assert r["n_sets"] == 30 and isinstance(r["note"], str) and r["note"]


def test_sigmoid_midpoints_are_recovered_and_covered(rows):
    for r in rows:
        if r["estimator"] != "sigmoid α*":
            continue
        assert r["share_detected"] >= 0.9, r  # saturating curves included: detected as cliffs, not "beyond_grid"
        assert abs(r["mean_estimate"] - r["truth"]) < 0.05, r
        assert r["coverage"] >= 0.8, r
        if r["truth"] < 0.9:
            assert r["share_identified"] >= 0.8, r


def test_saturating_curves_are_cliffs(rows):
    sat = [r for r in rows if r["estimator"] == "sigmoid α*" and r["hi"] == 1.0]
    assert len(sat) == len(ALPHA_STARS)
    assert all(r["share_detected"] == 1.0 for r in sat)


def test_the_monotone_crossing_recovers_its_target(rows):
    for r in rows:
        if r["estimator"] != "monotone α½" or r["parameter"] != "alpha_half":
            continue
        assert r["truth"] is not None and abs(r["truth"] - r["alpha_star"]) < 0.015
        assert abs(r["mean_estimate"] - r["truth"]) < 0.05, r
        assert r["coverage"] >= 0.85, r  # the plain percentile interval: ~0.81 at α* = 0.6


def test_the_monotone_interval_covers_alpha_star_too(rows):
    # rounded out to the tested ratios, the model-free interval does not hang on the interpolation convention
    # (the plain percentile interval of the interpolated crossing covered α* = 0.93 in ~0.7 of sets)
    for r in rows:
        if r["estimator"] == "monotone α½" and r["parameter"] == "alpha_star":
            assert r["coverage"] >= 0.85, r
            assert r["median_width"] >= 0.03 - 1e-9, r  # at least one gap of the grid (the narrowest is 0.03)
