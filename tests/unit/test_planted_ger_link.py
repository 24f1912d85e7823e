"""Planted truth for the GER–hallucination link: a known within-ratio effect is recovered, a null is not rejected."""

import numpy as np
import pytest

from kvroute.analysis.correlation import mh_risk_difference, within_ratio_link
from kvroute.analysis.planted import ger_link


@pytest.fixture(scope="module")
def rows():
    return {(r["estimator"], r["scenario"]): r for r in ger_link.coverage(n_sets=40, seed=1)}


def test_within_ratio_slope_recovers_the_effect_and_keeps_the_null(rows):
    eff, null = rows["within_ratio_slope", "effect"], rows["within_ratio_slope", "null"]
    assert eff["truth"] == ger_link.BETA and null["truth"] == 0.0
    assert abs(eff["mean_estimate"] - ger_link.BETA) < 0.4 and abs(null["mean_estimate"]) < 0.4
    assert eff["coverage"] >= 0.8 and null["coverage"] >= 0.8
    assert eff["rejection_rate"] >= 0.7  # power against the planted slope
    assert null["rejection_rate"] <= 0.2  # false positives under the null
    assert eff["mean_strata_fit"] == len(ger_link.RATIOS) - 1  # every compressed ratio informs the fit


def test_within_ratio_risk_difference_covers_its_truth(rows):
    eff, null = rows["within_ratio_risk_difference", "effect"], rows["within_ratio_risk_difference", "null"]
    assert eff["truth"] > 0.05 and null["truth"] == 0.0
    assert abs(eff["mean_estimate"] - eff["truth"]) < 0.04 and abs(null["mean_estimate"]) < 0.04
    assert eff["coverage"] >= 0.8 and null["coverage"] >= 0.8 and null["rejection_rate"] <= 0.2


def test_pooled_readings_are_fooled_by_the_null(rows):
    r = rows["pooled_pearson_r", "null"]
    assert r["mean_estimate"] > 0.8 and r["rejection_rate"] > 0.8  # r > 0.79 without any within-ratio effect
    pooled = rows["pooled_conditional_difference", "null"]
    assert pooled["mean_estimate"] > 0.1 and pooled["rejection_rate"] > 0.5


def test_true_risk_difference_matches_a_large_simulation():
    df = ger_link.simulate(ger_link.BETA, np.random.default_rng(7), n_instances=40_000)
    df = df[df.ratio > 0]
    mc = mh_risk_difference(df.hallucinated.to_numpy(float), df.ger_all_layers.to_numpy() >= 1, df.ratio.to_numpy())[0]
    assert mc == pytest.approx(ger_link.true_risk_difference(ger_link.BETA), abs=0.01)
    assert ger_link.true_risk_difference(0.0) == pytest.approx(0.0, abs=1e-9)


def test_the_planted_slope_is_the_population_slope():
    # with many instances and no bootstrap noise, the estimate sits on the planted β (the marginal model is exact)
    df = ger_link.simulate(ger_link.BETA, np.random.default_rng(8), n_instances=20_000)
    w = within_ratio_link(df, n_boot=10).iloc[0]
    assert w.slope == pytest.approx(ger_link.BETA, abs=0.12)
