"""The paired league: Holm, per-instance areas, and planted leagues of shapes no estimator fits."""

import numpy as np
import pandas as pd
import pytest

from kvroute.analysis.paired import compare_pair, holm, instance_areas, paired_comparisons, sign_flip_p
from kvroute.analysis.planted.league import decision_size, league_rates, simulate, true_area


def test_holm_on_known_p_values():
    np.testing.assert_allclose(holm(np.array([0.01, 0.04, 0.03, 0.5])), [0.04, 0.09, 0.09, 0.5])


def test_instance_areas_are_normalised_trapezoids():
    cells = pd.DataFrame({"instance_id": ["a"] * 3 + ["b"] * 3, "ratio": [0, 0.5, 1.0] * 2,
                          "hallucinated": [0, 0, 1, 1, 1, 1]})
    area = instance_areas(cells, [0, 0.5, 1.0])
    assert area["a"] == pytest.approx(0.25) and area["b"] == pytest.approx(1.0)
    assert list(instance_areas(cells.iloc[:5], [0, 0.5, 1.0]).index) == ["a"]  # b misses a ratio: left out


def test_identical_presses_are_a_tie_with_p_one():
    a = pd.Series([0.1, 0.5, 0.9], index=["x", "y", "z"])
    r = compare_pair(a, a, n_boot=100, confidence=0.95, rng=np.random.default_rng(0))
    assert r["difference"] == 0 and r["p_value"] == 1.0


@pytest.mark.statistical
def test_the_reviewed_pair_is_ordered_right_by_the_paired_rule_and_wrong_by_the_safe_ratio():
    # the estimator review's case: flat to 0.85 then a cliff, against a press rising from 0.5, with answer churn;
    # ranking by safe ratio (then α*) put the worse press first in about a third of the sets
    r = league_rates(("late_cliff", "early_riser"), 64, 0.12, 40, seed=5, with_safe_rule=True)
    assert r["truth"] == "a" and r["reversal"] <= 0.05 and r["correct_order"] >= 0.9
    assert r["safe_rule_reversal"] >= 0.1, r  # the former rule fails the same assertion


@pytest.mark.parametrize(("pair", "n", "churn"), [(("skewed", "gompertz"), 32, 0.12),
                                                  (("high_baseline", "high_baseline_early"), 200, 0.06),
                                                  (("two_step", "early_riser"), 64, 0.0)])
@pytest.mark.statistical
def test_planted_orders_are_never_reversed(pair, n, churn):
    r = league_rates(pair, n, churn, 40, seed=1)
    assert r["reversal"] <= 0.05, r


@pytest.mark.statistical
def test_a_planted_tie_is_called_at_most_at_the_test_level():
    r = league_rates(("skewed", "skewed"), 64, 0.12, 100, seed=2)
    assert r["truth"] == "tie" and r["reversal"] <= 0.07, r  # 5% level; 100 sets add ±0.02


def test_sign_flip_p_is_exact_on_a_hand_enumerated_case():
    # d = (1, 1, 1): of the 8 sign assignments only +++ and --- reach |sum| = 3
    assert sign_flip_p(np.array([1.0, 1.0, 1.0, 0.0]), n_draws=10, rng=np.random.default_rng(0)) == 0.25
    # d = (2, 1): |sum| ≥ 3 in 2 of 4 (++, --), the others give |±1|
    assert sign_flip_p(np.array([2.0, 1.0]), n_draws=10, rng=np.random.default_rng(0)) == 0.5
    assert sign_flip_p(np.zeros(5), n_draws=10, rng=np.random.default_rng(0)) == 1.0


def test_a_decisive_difference_survives_holm_whatever_the_bootstrap_size(monkeypatch):
    """48 instances, 40 of them worse by 1: p far below 1e-3. With few bootstrap replicates the test still draws
    enough assignments to pass Holm over 16 comparisons; mutation (draws = replicates) cannot."""
    import kvroute.analysis.paired as paired_mod

    d = np.r_[np.ones(40), np.zeros(8)]
    p = sign_flip_p(d, n_draws=200, rng=np.random.default_rng(0))
    assert p == pytest.approx(1 / (paired_mod.MIN_FLIP_DRAWS + 1)) and holm(np.r_[p, np.ones(15)])[0] <= 0.05
    monkeypatch.setattr(paired_mod, "MIN_FLIP_DRAWS", 0)
    coarse = sign_flip_p(d, n_draws=200, rng=np.random.default_rng(0))
    assert coarse == pytest.approx(1 / 201) and holm(np.r_[coarse, np.ones(15)])[0] > 0.05


def test_the_sign_flip_holds_its_size_where_the_bootstrap_p_does_not():
    # symmetric paired differences, mostly zero (answers that agree), 10 instances: the null is true; the mutant
    # decides by the percentile-bootstrap p (the former rule)
    r = decision_size(10, 1500, seed=1)
    assert r["rejection_rate"] <= 0.05 < 0.07 <= r["mutant_rejection_rate"], r


def _unpaired(df: pd.DataFrame, rng: np.random.Generator) -> bool:
    """The mutation: the same difference of mean areas, but each press's instances resampled on their own (no
    pairing); True when its interval excludes 0."""
    grid = sorted(df["ratio"].unique())
    a, b = (instance_areas(df[df["press"].isin([p, "none"])].assign(press=p), grid)
            for p in sorted(df.loc[df["press"] != "none", "press"].unique()))
    ra = np.array([rng.choice(a.to_numpy(), len(a)).mean() for _ in range(400)])
    rb = np.array([rng.choice(b.to_numpy(), len(b)).mean() for _ in range(400)])
    lo, hi = np.quantile(ra - rb, [0.025, 0.975])
    return bool(lo > 0 or hi < 0)


@pytest.mark.statistical
def test_pairing_is_what_gives_the_league_its_power():
    # hard instances fail on both presses and at every ratio: pairing cancels them, resampling presses apart
    # does not, and two presses 0.06 apart in area are then rarely told apart at 64 instances
    pair = ("high_baseline", "high_baseline_early")
    assert true_area(pair[1]) - true_area(pair[0]) == pytest.approx(0.0619, abs=1e-3)
    rng = np.random.default_rng(3)
    sets = [simulate(pair, 64, 0.06, rng) for _ in range(30)]
    paired = np.mean([bool(paired_comparisons(d, n_boot=400).iloc[0]["decided"]) for d in sets])
    unpaired = np.mean([_unpaired(d, rng) for d in sets])
    assert paired >= 0.8 > unpaired + 0.3, (paired, unpaired)
