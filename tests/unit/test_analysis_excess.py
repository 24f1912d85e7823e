"""The safe ratio's certification test: exact size at the margin, planted margins, and the bootstrap mutant."""

import numpy as np
import pytest
from scipy.stats import multinomial

from kvroute.analysis.cliff import safe_ratio
from kvroute.analysis.excess import HOEFFDING_RULE, _trinomial, exact_p_value, exact_upper_bound, paired_excess
from kvroute.analysis.planted import excess

RATIOS = excess.RATIOS


def test_the_size_at_the_margin_is_at_most_five_percent_for_every_nuisance_share():
    # exhaustive: every (b, c) outcome of 24 pairs, its exact probability at p₊ − p₋ = δ
    n, delta = 24, 0.05
    bb, cc, _ = _trinomial(n)
    reject = np.array([exact_p_value(n, int(b), int(c), delta) <= 0.05 for b, c in zip(bb, cc, strict=True)])
    for pm in (0.0, 0.02, 0.06, 0.15, 0.3, 0.47):
        pr = multinomial.pmf(np.stack([bb, cc, n - bb - cc], 1), n, [pm + delta, pm, 1 - 2 * pm - delta])
        assert pr[reject].sum() <= 0.05, pm


def test_known_bounds():
    # no discordant pair of 64: the bound is near the one-sample exact bound 1 − 0.05^(1/64) = 0.046
    assert exact_upper_bound(64, 0, 0) == pytest.approx(0.046, abs=0.002)
    assert exact_upper_bound(64, 2, 0) > exact_upper_bound(64, 1, 0) > exact_upper_bound(64, 0, 0)
    # churn widens the bound: 4 up and 4 down is excess 0, yet less certain than 0 and 0
    assert exact_upper_bound(64, 4, 4) > exact_upper_bound(64, 0, 0)
    assert exact_p_value(64, 0, 0, 0.05) <= 0.05 < exact_p_value(50, 0, 0, 0.05)
    shown, upper, rule = paired_excess(np.array([0.5, 0.0] * 30), np.zeros(60), 0.05)
    assert rule == HOEFFDING_RULE and not shown and upper > 0.25


@pytest.mark.parametrize(("n", "p_up", "p_down"), [(64, 0.05, 0.0), (32, 0.05, 0.0), (64, 0.11, 0.06)])
def test_planted_excess_exactly_at_the_margin_is_certified_at_most_five_percent_of_the_time(n, p_up, p_down):
    # the finding of the estimator review: true excess δ = 0.05 at every ratio, H(0) = 0.69; the percentile
    # bootstrap certified a positive safe ratio far more often than 5% (it reads "no flip seen" as certainty)
    rng = np.random.default_rng(1)
    sets = list(excess.simulate(200, n, p_up, p_down, rng))
    ones = np.ones_like(sets[0])
    exact = np.mean([safe_ratio(RATIOS, s, ones, delta=0.05, bounds=False)[0] > 0 for s in sets])
    assert exact <= 0.075  # exact size ≤ 0.05 whatever the churn; 200 sets add ±0.015
    if p_down == 0:  # the mutation: the former rule fails the same assertion on the same sets
        mutant = np.mean([excess.bootstrap_safe_ratio(s, rng) > 0 for s in sets])
        assert mutant > 0.1, mutant


def test_no_excess_and_no_churn_is_certified_at_every_ratio_with_enough_instances():
    s = next(excess.simulate(1, 100, 0.0, 0.0, np.random.default_rng(2), h0=0.3))
    safe, upper, _ = safe_ratio(RATIOS, s, np.ones_like(s), delta=0.05)
    assert safe == 0.9 and np.nanmax(upper) < 0.05
