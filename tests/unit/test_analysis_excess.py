"""The safe ratio's certification test: exact size at the margin, planted margins, and the bootstrap mutant."""

import numpy as np
import pytest
from scipy.stats import multinomial

from kvroute.analysis.cliff import safe_ratio
from kvroute.analysis.excess import HOEFFDING_RULE, _trinomial, exact_p_value, exact_upper_bound, paired_excess

RATIOS = np.array([0.0, 0.25, 0.5, 0.7, 0.8, 0.85, 0.9])


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


def _planted_sets(n_sets: int, n: int, h0: float, p_up: float, p_down: float, seed: int):
    """Per set: instance × ratio hallucination flags; at every compressed ratio each instance flips up with
    ``p_up`` (if not hallucinating at 0) — the excess is p_up − p_down of the instances, churn p_down."""
    rng = np.random.default_rng(seed)
    for _ in range(n_sets):
        base = rng.random(n) < h0
        flags = [base]
        for _ in RATIOS[1:]:
            u = rng.random(n)
            # unconditional shares: +1 with p_up, −1 with p_down (only possible from a hallucinating baseline)
            up = ~base & (u < p_up / (1 - h0))
            down = base & (u < p_down / h0)
            flags.append(np.where(up, True, np.where(down, False, base)))
        yield np.stack(flags, 1).astype(float)


def _bootstrap_safe_ratio(sums: np.ndarray, delta: float, rng: np.random.Generator, n_boot: int = 400) -> float:
    """The mutant: the former rule, a percentile-bootstrap upper bound of the paired excess."""
    w = rng.multinomial(len(sums), np.full(len(sums), 1 / len(sums)), size=n_boot)
    reps = w @ sums / len(sums)
    upper = np.quantile(reps - reps[:, [0]], 0.95, axis=0)
    safe = 0.0
    for r, u in zip(RATIOS[1:], upper[1:], strict=True):
        if u > delta:
            break
        safe = float(r)
    return safe


@pytest.mark.parametrize(("n", "p_up", "p_down"), [(64, 0.05, 0.0), (32, 0.05, 0.0), (64, 0.11, 0.06)])
def test_planted_excess_exactly_at_the_margin_is_certified_at_most_five_percent_of_the_time(n, p_up, p_down):
    # the finding of the estimator review: true excess δ = 0.05 at every ratio, H(0) = 0.69; the percentile
    # bootstrap certified a positive safe ratio far more often than 5% (it reads "no flip seen" as certainty)
    sets = list(_planted_sets(200, n, 0.69, p_up, p_down, seed=1))
    ones = np.ones_like(sets[0])
    exact = np.mean([safe_ratio(RATIOS, s, ones, delta=0.05, bounds=False)[0] > 0 for s in sets])
    assert exact <= 0.075  # exact size ≤ 0.05 whatever the churn; 200 sets add ±0.015
    if p_down == 0:  # the mutation: the former rule fails the same assertion on the same sets
        rng = np.random.default_rng(0)
        mutant = np.mean([_bootstrap_safe_ratio(s, 0.05, rng) > 0 for s in sets])
        assert mutant > 0.1, mutant


def test_no_excess_and_no_churn_is_certified_at_every_ratio_with_enough_instances():
    s = next(_planted_sets(1, 100, 0.3, 0.0, 0.0, seed=2))
    safe, upper, _ = safe_ratio(RATIOS, s, np.ones_like(s), delta=0.05)
    assert safe == 0.9 and np.nanmax(upper) < 0.05
