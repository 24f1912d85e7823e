"""GER–hallucination link: the within-ratio test (headline), r pooled across ratios, P(H | global eviction)."""

import numpy as np
import pandas as pd
import pytest

from kvroute.analysis.correlation import (
    conditional_hallucination,
    correlate,
    fit_stratified_logit,
    ger_hallucination_correlation,
    mh_risk_difference,
    within_ratio_link,
)
from kvroute.analysis.within_instance import within_instance_slopes


def test_perfectly_correlated_series_give_r_one():
    x = np.array([0.0, 0.1, 0.3, 0.6, 0.9])
    r = correlate(x, 2 * x + 0.1)
    assert r["pearson_r"] == pytest.approx(1.0) and r["spearman_r"] == pytest.approx(1.0)
    assert r["pearson_p"] < 0.01 and r["n_points"] == 5
    anti = correlate(x, -x)
    assert anti["pearson_r"] == pytest.approx(-1.0)
    mono = correlate(x, x**4)  # monotone but not linear: Spearman 1, Pearson below 1
    assert mono["spearman_r"] == pytest.approx(1.0) and mono["pearson_r"] < 0.99


def test_undefined_correlations_say_why():
    assert correlate([1, 2, 3], [0.5, 0.5, 0.5])["pearson_r"] is None
    assert "constant" in correlate([1, 2, 3], [0.5, 0.5, 0.5])["note"]
    assert "at least 3" in correlate([1, 2], [1, 2])["note"]


def test_ger_tracking_hallucination_across_ratios_gives_r_one():
    # per ratio, the hallucination rate equals the mean GER exactly
    rows = []
    for r, rate in zip([0.0, 0.5, 0.8, 0.9], [0.0, 0.25, 0.5, 1.0], strict=True):
        for i in range(4):
            rows.append({"model": "m", "press": "p", "instance_id": str(i), "ratio": r,
                         "hallucinated": i < rate * 4, "ger": rate})
    points, table = ger_hallucination_correlation(pd.DataFrame(rows))
    np.testing.assert_allclose(points.ger, points.h)
    assert table.iloc[0].pearson_r == pytest.approx(1.0) and table.iloc[0].n_points == 4


def test_conditional_hallucination_on_hand_built_cells():
    # 10 evicted cells (8 hallucinated), 20 retained cells (2 hallucinated), plus baseline cells ignored
    ev = [{"ger_all_layers": 1.0, "hallucinated": i < 8} for i in range(10)]
    kept = [{"ger_all_layers": 0.6, "hallucinated": i < 2} for i in range(20)]
    base = [{"ger_all_layers": 0.0, "hallucinated": True, "ratio": 0.0} for _ in range(5)]
    df = pd.DataFrame([{"model": "m", "press": "p", "instance_id": str(i), "ratio": 0.9, **c}
                       for i, c in enumerate(ev + kept)]
                      + [{"model": "m", "press": "p", "instance_id": "b", **c} for c in base])
    t = conditional_hallucination(df).iloc[0]
    assert (t.n_evicted, t.n_kept) == (10, 20)
    assert t.p_h_evicted == pytest.approx(0.8) and t.p_h_kept == pytest.approx(0.1)
    assert t.difference == pytest.approx(0.7) and t.risk_ratio == pytest.approx(8.0)
    assert t.fisher_p < 0.001
    # a lower threshold moves the 0.6 cells into "evicted"
    loose = conditional_hallucination(df, threshold=0.5).iloc[0]
    assert loose.n_evicted == 30 and loose.n_kept == 0 and loose.p_h_kept is None and loose.fisher_p is None
    by_ratio = conditional_hallucination(df, by_ratio=True)
    assert list(by_ratio.ratio) == [0.9]


# ---------------------------------------------------------------------------------------------
# the within-ratio test (the headline GER reading)

RATIOS = (0.0, 0.5, 0.7, 0.8, 0.9, 0.95)


def _records(beta: float, n: int = 120, seed: int = 0, ratios=RATIOS) -> pd.DataFrame:
    """H and GER both rise with α; within a ratio, logit P(H) = a(α) + beta · GER."""
    rng = np.random.default_rng(seed)
    rows = []
    prop = rng.normal(0, 0.2, n)  # an instance's answer is evicted more at every ratio
    for r in ratios:
        g = np.clip((r > 0) * (r**2 + prop + rng.normal(0, 0.2, n)), 0, 1)
        a = -2.5 + 4 * r
        h = rng.random(n) < 1 / (1 + np.exp(-(a + beta * g)))
        rows += [{"model": "m", "press": "p", "instance_id": f"i{i}", "ratio": r, "ger": g[i],
                  "ger_all_layers": 1.0 if g[i] >= 1 else 0.3 * g[i], "hallucinated": bool(h[i])} for i in range(n)]
    return pd.DataFrame(rows)


def test_stratified_logit_is_the_maximum_likelihood_fit():
    from sklearn.linear_model import LogisticRegression

    rng = np.random.default_rng(3)
    s = rng.integers(0, 4, 1500)
    x = rng.random(1500)
    y = (rng.random(1500) < 1 / (1 + np.exp(-(np.array([-2, -0.5, 0.5, 1.5])[s] + 1.2 * x)))).astype(float)
    b, a = fit_stratified_logit(y, x, s, ridge=1e-9)
    ref = LogisticRegression(C=1e12, fit_intercept=False, tol=1e-12, max_iter=10_000).fit(np.c_[np.eye(4)[s], x], y)
    np.testing.assert_allclose(np.r_[a[0], b[0]], ref.coef_[0], atol=1e-5)
    # weights = counts: fitting with weight 2 on a cell equals fitting with the cell duplicated
    w = rng.integers(0, 3, 1500)
    bw, _ = fit_stratified_logit(y, x, s, w[None, :].astype(float), ridge=1e-9)
    rep = np.repeat(np.arange(1500), w)
    bd, _ = fit_stratified_logit(y[rep], x[rep], s[rep], ridge=1e-9)
    assert bw[0] == pytest.approx(bd[0], abs=1e-6)


def test_mantel_haenszel_difference_by_hand():
    # stratum A: evicted 4 (3 H), retained 4 (1 H) → diff 0.5, weight 4·4/8 = 2
    # stratum B: evicted 2 (2 H), retained 8 (6 H) → diff 0.25, weight 2·8/10 = 1.6
    # stratum C: only retained cells → weight 0
    h = [1, 1, 1, 0, 1, 0, 0, 0] + [1, 1] + [1] * 6 + [0, 0] + [1, 0, 0]
    ev = [1] * 4 + [0] * 4 + [1, 1] + [0] * 8 + [0, 0, 0]
    s = ["A"] * 8 + ["B"] * 10 + ["C"] * 3
    rd = mh_risk_difference(np.array(h), np.array(ev, bool), np.array(s))[0]
    assert rd == pytest.approx((2 * 0.5 + 1.6 * 0.25) / 3.6)
    assert np.isnan(mh_risk_difference(np.array([1, 0]), np.array([False, False]), np.array(["A", "A"]))[0])


def test_confounded_null_has_a_high_pooled_r_but_no_within_ratio_effect():
    df = _records(beta=0.0, n=150, seed=1)
    _, corr = ger_hallucination_correlation(df)
    assert corr.iloc[0].pearson_r > 0.9  # the pooled reading "finds" the link
    cond = conditional_hallucination(df).iloc[0]
    assert cond.difference > 0.15 and cond.fisher_p < 0.01  # so does the pooled P(H | evicted) − P(H | retained)
    assert abs(cond.difference_within_ratio) < 0.12 and cond.n_strata_both >= 2
    w = within_ratio_link(df, n_boot=300).iloc[0]
    assert w.verdict == "undecided" and "cannot decide" in w.note
    assert w.slope_low < 0 < w.slope_high and w.risk_difference_low < 0 < w.risk_difference_high
    assert w.n_cells == 750 and w.n_instances_fit == w.n_strata_fit <= 150 and w.strata.startswith("instance")


@pytest.mark.statistical
def test_within_ratio_effect_is_recovered():
    df = _records(beta=3.0, n=250, seed=2)
    w = within_ratio_link(df, n_boot=300).iloc[0]
    assert w.verdict == "raises H" and w.slope_low < 3.0 < w.slope_high and w.slope_low > 0.5
    assert w.or_per_tenth == pytest.approx(np.exp(0.1 * w.slope))
    assert w.or_per_tenth_low < w.or_per_tenth < w.or_per_tenth_high
    assert w.risk_difference_low > 0 and w.boot_valid == 1.0 and w.boot_separated < 0.05


def test_baseline_and_uninformative_instances_are_left_out():
    df = _records(beta=2.0, n=80, seed=4)
    df.loc[df.instance_id == "i1", "hallucinated"] = False  # never hallucinates: no information on β
    df.loc[df.instance_id == "i0", "ger"] = np.nan  # undefined GER (no answer in the context)
    w = within_ratio_link(df, n_boot=50).iloc[0]
    assert w.n_undefined == 5 and w.n_cells == 5 * 79 and w.n_instances == 79
    kept = df[(df.ratio > 0) & df.ger.notna()]
    inst = pd.factorize(kept.instance_id)[0]
    b, _, sets = within_instance_slopes(kept.ger.to_numpy(), kept.hallucinated.to_numpy(float), kept.ratio.to_numpy(),
                                        inst, np.ones((1, inst.max() + 1)))
    assert w.slope == pytest.approx(b[0]) and w.n_instances_fit == len(sets.informative) < 79
    assert pd.factorize(kept.instance_id)[1].get_loc("i1") not in sets.informative


def test_too_few_data_and_separation_are_said_plainly():
    few = _records(beta=2.0, n=4, seed=5)
    w = within_ratio_link(few, n_boot=50).iloc[0]
    assert w.verdict == "too few data" and "cannot decide" in w.note
    sep = _records(beta=0.0, n=60, seed=6)
    sep["hallucinated"] = sep.ger > 0.5  # H is a step function of GER inside every instance
    w = within_ratio_link(sep, n_boot=50).iloc[0]
    assert w.verdict == "raises H (separated)" and np.isfinite(w.slope)
    assert w.slope_high == np.inf and w.or_per_tenth_high == np.inf and w.boot_separated > 0.5  # open, not the ridge's
    assert "open" in w.note
    constant = _records(beta=2.0, n=30, seed=7).assign(hallucinated=False)
    w = within_ratio_link(constant, n_boot=50).iloc[0]
    assert w.verdict == "too few data" and w.slope is None and w.n_strata_fit == 0


def test_one_cell_per_instance_cannot_inform_a_within_instance_slope():
    # a fresh instance per cell: nothing to compare an instance with, however many cells
    one = _records(beta=2.0, n=100, seed=8, ratios=(0.9,))
    stacked = pd.concat([one.assign(ratio=r) for r in (0.5, 0.6, 0.7, 0.8, 0.9, 0.95)], ignore_index=True)
    fresh = stacked.assign(instance_id=stacked.instance_id + "-" + stacked.ratio.astype(str))
    w = within_ratio_link(fresh, n_boot=50).iloc[0]
    assert w.verdict == "too few data" and w.n_instances_fit == 0


def test_pooled_families_are_conditioned_on_by_the_instance():
    # two ratios per instance; family "hard" has high GER and high H, "easy" low and low, no effect inside
    rng = np.random.default_rng(9)
    rows = []
    for fam, g0, p in (("hard", 0.7, 0.7), ("easy", 0.2, 0.2)):
        for i in range(200):
            for r in (0.5, 0.8):
                rows.append({"model": "m", "press": "p", "family": fam, "instance_id": f"{fam}{i}", "ratio": r,
                             "ger": float(np.clip(g0 + rng.normal(0, 0.15), 0, 0.99)), "ger_all_layers": 0.0,
                             "hallucinated": bool(rng.random() < p)})
    df = pd.DataFrame(rows)
    t = within_ratio_link(df, n_boot=300).set_index("family")
    assert t.loc["all"].strata.startswith("instance") and t.loc["all"].slope_low < 0 < t.loc["all"].slope_high
    cond = conditional_hallucination(df.assign(ger_all_layers=(df.ger > 0.45).astype(float))).set_index("family")
    assert cond.loc["all"].n_strata_both == 4 and cond.loc["all"].difference > 0.3  # pooled over families: confounded


def test_undefined_eviction_is_never_counted_as_retained():
    df = _records(beta=2.0, n=60, seed=10)
    full = within_ratio_link(df, n_boot=100).iloc[0]
    # the evicted flag is unknown for some cells (ger_all_layers missing): they leave the risk difference
    gone = df.ger_all_layers.lt(1) & (df.instance_id.isin([f"i{i}" for i in range(59, 60)]) | (df.index % 7 == 0))
    holes = df.assign(ger_all_layers=df.ger_all_layers.mask(gone))
    w = within_ratio_link(holes, n_boot=100).iloc[0]
    kept = holes[(holes.ratio > 0) & holes.ger_all_layers.notna()]
    ref = mh_risk_difference(kept.hallucinated.to_numpy(float), kept.ger_all_layers.to_numpy() >= 1,
                             kept.ratio.to_numpy())
    assert w.risk_difference == pytest.approx(ref[0]) and w.risk_difference != pytest.approx(full.risk_difference)
    assert w.slope == pytest.approx(full.slope) and w.n_evicted == full.n_evicted  # the slope uses ger, untouched


def test_odds_ratio_interval_ends_say_which_way_separation_pushed_them():
    from kvroute.analysis.correlation import or_interval

    assert or_interval(1.2, 3.4) == "[1.20, 3.40]"
    assert or_interval(0.0, None) == "[open, open]"  # replicates separated both ways: nothing decided
    assert or_interval(1.5, float("inf")) == "[1.50, open]"
    assert or_interval(None, None) == "[∞, ∞]"  # every replicate separated towards more hallucination
    assert or_interval(0.0, 0.0) == "[0, 0]"
    assert or_interval(float("inf"), float("inf")) == "[∞, ∞]"
