"""Cliff: sigmoid midpoint, susceptibility, safe ratio, and α* against context length."""

import numpy as np
import pandas as pd
import pytest

from kvroute.analysis.cliff import cliff_tables, safe_ratio, susceptibility
from kvroute.analysis.common import attach_baseline
from kvroute.analysis.context import cliff_vs_length, length_bins
from kvroute.analysis.sigmoid import fit_sigmoid
from kvroute.analysis.synthetic import RATIO_GRID, SyntheticSpec, synthetic_records

GRID = np.array(RATIO_GRID)


def _records(h_of_instance_ratio, n=50, ratios=RATIO_GRID, **tags) -> pd.DataFrame:
    rows = [{"model": "m", "press": "p", "instance_id": f"i{i}", "ratio": r,
             "hallucinated": bool(h_of_instance_ratio(i, r)), **tags} for i in range(n) for r in ratios]
    return pd.DataFrame(rows)


@pytest.mark.statistical
def test_a_step_function_gives_its_step_as_alpha_star():
    df = _records(lambda i, r: r >= 0.85)
    curves, cliffs = cliff_tables(df, n_boot=200)
    c = cliffs.iloc[0]
    assert c.status == "ok"
    assert 0.8 < c.alpha_star <= 0.85  # anywhere between the last 0 and the first 1 fits exactly
    assert c.alpha_star_low >= 0.8 and c.alpha_star_high <= 0.85
    assert c.alpha_chi_max == pytest.approx(0.825) and c.chi_max == pytest.approx(1 / 0.05)
    # no instance changes below 0.85, yet 50 instances cannot show an excess ≤ 0.05 at 95%: 0 flips of 50
    # leave an exact upper bound above 0.05 (Clopper–Pearson's would be 0.058); 100 instances can
    assert c.safe_ratio == 0.0 and curves.excess_upper.iloc[1] > 0.05
    assert cliff_tables(_records(lambda i, r: r >= 0.85, n=100), n_boot=50)[1].iloc[0].safe_ratio == 0.8
    np.testing.assert_allclose(curves.h, (GRID >= 0.85).astype(float))


def test_the_fit_recovers_a_known_midpoint():
    x = GRID
    fit = fit_sigmoid(x, 0.05 + 0.8 / (1 + np.exp(-30 * (x - 0.87))))
    assert fit.ok and fit.alpha_star == pytest.approx(0.87, abs=1e-4)
    assert fit.lo == pytest.approx(0.05, abs=1e-3) and fit.hi == pytest.approx(0.85, abs=1e-3)


def test_no_cliff_and_unidentified_midpoints_are_reported_not_invented():
    flat = fit_sigmoid(GRID, np.full(len(GRID), 0.2))
    assert flat.status == "no_cliff" and flat.alpha_star is None
    falling = fit_sigmoid(GRID, 1 - (GRID >= 0.85))
    assert falling.status == "no_cliff"
    late = fit_sigmoid(GRID, 0.05 + 0.8 / (1 + np.exp(-40 * (GRID - 1.0))))  # midpoint past the grid
    assert late.status == "beyond_grid" and late.alpha_star is None
    few = fit_sigmoid([0, 0.5, 0.9], [0, 0, 1])
    assert few.status == "too_few_ratios"
    _, cliffs = cliff_tables(_records(lambda i, r: i < 5), n_boot=50)
    assert cliffs.iloc[0].status == "no_cliff" and pd.isna(cliffs.iloc[0].alpha_star)


@pytest.mark.statistical
def test_synthetic_midpoints_are_recovered_within_their_intervals():
    spec = SyntheticSpec(families=("base", "knowledge"), long_context_lengths=(), n_instances=60, seed=1)
    _, cliffs = cliff_tables(synthetic_records(spec), n_boot=300)
    pooled = cliffs[cliffs.family == "all"]
    assert len(pooled) == 4
    covered = 0
    for _, c in pooled.iterrows():
        truth = spec.alpha_star([m.name for m in spec.models].index(c.model), list(spec.presses).index(c.press))
        assert c.status.startswith("ok")
        assert abs(c.alpha_star - truth) < 0.03
        covered += c.alpha_star_low <= truth <= c.alpha_star_high
    assert covered >= 3


def test_susceptibility_between_adjacent_ratios():
    chi = susceptibility(np.array([0, 0.5, 0.75, 1.0]), np.array([0.0, 0.1, 0.6, 0.7]))
    np.testing.assert_allclose(chi, [np.nan, 0.2, 2.0, 0.4])


@pytest.mark.statistical
def test_safe_ratio_on_a_hand_made_example():
    # 100 instances: H = 0, 0, 1%, 30%, then 0% again at 0.8 (the safe ratio must not jump past 0.7)
    ratios = (0.0, 0.25, 0.5, 0.7, 0.8)
    fails = {0.0: set(), 0.25: set(), 0.5: {0}, 0.7: set(range(30)), 0.8: set()}
    df = _records(lambda i, r: i in fails[r], n=100, ratios=ratios)
    curves, cliffs = cliff_tables(df, n_boot=500)
    assert cliffs.iloc[0].safe_ratio == 0.5
    upper = curves.set_index("ratio").excess_upper
    assert upper[0.5] <= 0.05 < upper[0.7]
    _, loose = cliff_tables(df, n_boot=500, delta=0.5)
    assert loose.iloc[0].safe_ratio == 0.8
    # with no ratio-0 cells there is no baseline to compare with
    safe, _, why = safe_ratio(np.array([0.5, 0.7]), np.zeros((10, 2)), np.ones((10, 2)))
    assert safe is None and "baseline" in why
    # the first compressed ratio already fails: only the baseline is safe
    df2 = _records(lambda i, r: r > 0 and i < 40, n=100, ratios=ratios)
    assert cliff_tables(df2, n_boot=200)[1].iloc[0].safe_ratio == 0.0


def test_baseline_cells_are_shared_by_every_press():
    base = pd.DataFrame({"model": "m", "instance_id": ["a", "b"], "press": "none", "ratio": 0.0, "hallucinated": False})
    comp = pd.DataFrame({"model": "m", "instance_id": ["a", "b", "a"], "press": ["p", "p", "q"], "ratio": 0.5,
                         "hallucinated": True})
    out = attach_baseline(pd.concat([base, comp]))
    assert set(out.press) == {"p", "q"}
    assert len(out[(out.press == "p") & (out.ratio == 0)]) == 2
    assert list(out[(out.press == "q") & (out.ratio == 0)].instance_id) == ["a"]  # only instances q has


@pytest.mark.parametrize(("law", "verdict"), [("budget", "fixed budget"), ("ratio", "fixed ratio")])
@pytest.mark.statistical
def test_context_length_verdict_follows_the_law_built_in(law, verdict):
    spec = SyntheticSpec(families=(), long_context_lengths=(256, 512, 1024), law=law, n_instances=60,
                         base_alpha_star=0.8, models=SyntheticSpec().models[:1], presses=("ea",), press_offsets=(0.0,))
    by_len, verdicts = cliff_vs_length(synthetic_records(spec), n_boot=300)
    assert list(by_len["T"]) == sorted(by_len["T"]) and len(by_len) == 3
    v = verdicts.iloc[0]
    assert v.verdict == verdict, v.reason
    assert v.steadier == law
    fitted = by_len.dropna(subset=["alpha_star"])
    np.testing.assert_allclose(fitted.budget_star, (1 - fitted.alpha_star) * fitted["T"])


def test_length_bins_group_nearby_lengths():
    t = pd.Series([500, 520, 1000, 1050, 2040, 260])
    bins = length_bins(t)
    assert bins.iloc[0] == bins.iloc[1] and bins.iloc[2] == bins.iloc[3] and bins.nunique() == 4
    # medians of {260, 500, 520} and {1000, 1050, 2040}
    assert list(length_bins(t, edges=[0, 700, 5000]).unique()) == [500, 1050]


def test_context_length_is_empty_without_the_family():
    df = _records(lambda i, r: r > 0.8, context_tokens=300, family="base")
    by_len, verdicts = cliff_vs_length(df, n_boot=50)
    assert by_len.empty and verdicts.empty


def test_flat_curves_have_no_steepest_rise_and_float_noise_in_ratios_is_ignored():
    df = _records(lambda i, r: False)
    df.loc[df.ratio == 0.7, "ratio"] = 0.7000000000000001  # as a CLI float may arrive
    curves, cliffs = cliff_tables(df, n_boot=50)
    assert len(curves) == len(GRID)
    assert cliffs.iloc[0].alpha_chi_max is None and cliffs.iloc[0].status == "no_cliff"


# --- bounded, identifiable cliffs (issue 14, item 1) ---------------------------------------------

ADAKV_LIKE = np.array([0.69, 0.82, 0.80, 0.84, 0.94, 0.96, 0.97, 0.99, 1.00])  # the demo's "+adakv" curve


def test_a_curve_at_its_maximum_is_a_cliff_with_hi_at_most_one():
    fit = fit_sigmoid(GRID, ADAKV_LIKE)
    assert fit.ok, fit.reason  # it was "beyond_grid" with hi = 1.31
    assert 0 <= fit.lo <= fit.hi <= 1
    assert GRID[0] < fit.alpha_star < GRID[-1] - 0.01


def test_the_grid_fitter_stays_in_the_unit_triangle_and_is_the_constrained_optimum():
    from kvroute.analysis.sigmoid import SigmoidGrid, sigmoid

    rng = np.random.default_rng(0)
    y = np.clip(0.1 + 0.95 / (1 + np.exp(-30 * (GRID - 0.85))) + rng.normal(0, 0.08, (40, len(GRID))), 0, 1)
    y[0] = ADAKV_LIKE
    g = SigmoidGrid(GRID, mid_step=0.05, n_k=6)
    best = g.best(y)
    assert (best["lo"] >= -1e-12).all() and (best["hi"] <= 1 + 1e-12).all() and (best["lo"] <= best["hi"] + 1e-12).all()
    # brute force over a lattice of (lo, hi) with 0 ≤ lo ≤ hi ≤ 1, every grid shape
    lo, hi = np.meshgrid(np.linspace(0, 1, 101), np.linspace(0, 1, 101), indexing="ij")
    keep = lo <= hi
    lo, hi = lo[keep], hi[keep]  # [P]
    for row in range(0, 40, 8):
        brute = np.inf
        for mid, k in zip(g.mids, g.ks, strict=True):
            s = sigmoid(GRID, 0.0, 1.0, k, mid)  # [n]
            pred = lo[:, None] + (hi - lo)[:, None] * s[None, :]  # [P, n]
            brute = min(brute, float(((pred - y[row]) ** 2).sum(axis=1).min()))
        assert best["sse"][row] <= brute + 1e-9
        assert best["sse"][row] >= brute - 0.01  # the lattice is 0.01 fine


def _edge_records(n=60):
    # H = 0 up to 0.85, then 0.1, 0.5, 0.9 at 0.9, 0.95, 0.98: the midpoint sits next to 0.95, so a
    # good share of bootstrap replicates put it in the grid's last gap, where it is not identified
    return _records(lambda i, r: ((r >= 0.9 and i < 0.1 * n) or (r >= 0.95 and i < 0.5 * n)
                                  or (r >= 0.98 and i < 0.9 * n)),
                    n=n)


@pytest.mark.statistical
def test_replicates_obey_the_edge_rule_and_open_the_interval_instead_of_clamping():
    from kvroute.analysis.cliff import analyse_curve

    res = analyse_curve(_edge_records(), n_boot=400)
    finite = res.alpha_reps[np.isfinite(res.alpha_reps)]
    assert not np.any(finite >= GRID[-1] - 1e-3)  # no replicate piled on the grid's edge
    _, cliffs = cliff_tables(_edge_records(), n_boot=400)
    c = cliffs.iloc[0]
    for col in ("boot_below_grid", "boot_beyond_grid", "boot_no_cliff"):
        assert col in c.index
    assert c.boot_beyond_grid > 0.025
    assert c.alpha_star_high is None or pd.isna(c.alpha_star_high)
    assert c.alpha_star_identified in ("open_above", "not identified")
    assert "beyond" in c.alpha_star_interval or "not identified" in c.alpha_star_interval


@pytest.mark.statistical
def test_the_headline_states_an_unidentified_interval_instead_of_a_number():
    from kvroute.analysis.summary import AnalysisConfig, run_analysis

    df = _edge_records().assign(family="base", regime="agnostic")
    h = run_analysis(df, AnalysisConfig(n_boot=200)).summary["headline"][0]
    assert h["alpha_star_ci"] is None
    assert h["alpha_star_identified"] != "identified" and h["alpha_star_interval"]
    assert h["alpha_star_boot_edges"]["beyond_grid"] > 0
    # an identified cliff keeps its numeric interval, and the cross-check sits beside it
    ok = run_analysis(_records(lambda i, r: r >= (0.8 if i % 2 else 0.85), n=60).assign(family="base"),
                      AnalysisConfig(n_boot=200)).summary["headline"][0]
    assert (ok["alpha_star_identified"] == "identified"
            and ok["alpha_star_ci"][0] <= ok["alpha_star"] <= ok["alpha_star_ci"][1])
    assert ok["alpha_half"] is not None and ok["alpha_half_ci"] is not None


def test_censored_interval_opens_an_end_only_when_its_percentile_is_off_the_grid():
    from kvroute.analysis.cliff import censored_interval
    from kvroute.analysis.sigmoid import BELOW_GRID, BEYOND_GRID, NO_CLIFF, OK

    vals = np.linspace(0.8, 0.9, 100)
    codes = np.full(100, OK)
    iv = censored_interval(vals, codes, 0.95)
    assert iv["state"] == "closed" and 0.8 <= iv["low"] < iv["high"] <= 0.9
    codes[-10:] = BEYOND_GRID
    iv = censored_interval(vals, codes, 0.95)
    assert iv["state"] == "open_above" and iv["high"] is None and iv["beyond_grid"] == pytest.approx(0.1)
    codes[-10:] = OK
    codes[:2] = BELOW_GRID  # 2% < 2.5%: the lower end stays identified
    assert censored_interval(vals, codes, 0.95)["state"] == "closed"
    codes[:10] = NO_CLIFF  # no cliff could lie anywhere: both ends open
    iv = censored_interval(vals, codes, 0.95)
    assert iv["state"] == "open" and iv["no_cliff"] == pytest.approx(0.1)


def test_the_tied_midpoints_of_a_step_are_spread_over_the_gap_not_piled_on_its_lower_end():
    # every instance steps between 0.5 and 0.7: any midpoint in the gap fits; the replicates must say so
    from kvroute.analysis.cliff import analyse_curve

    res = analyse_curve(_records(lambda i, r: r >= 0.7 if i < 40 else False, n=50), n_boot=300)
    assert res.fit.ok and 0.55 < res.fit.alpha_star < 0.65
    ok = res.alpha_reps[np.isfinite(res.alpha_reps)]
    assert np.quantile(ok, 0.05) < 0.575 and np.quantile(ok, 0.95) > 0.625  # the old fitter: every replicate at 0.5475


# --- the model-free cross-check --------------------------------------------------------------------

def test_monotone_fit_is_weighted_pav():
    from kvroute.analysis.cliff import monotone_fit

    m = monotone_fit(np.array([[0.0, 0.4, 0.2, 0.9]]), np.array([1.0, 1.0, 3.0, 1.0]))
    np.testing.assert_allclose(m[0], [0.0, 0.25, 0.25, 0.9])  # (0.4·1 + 0.2·3) / 4
    assert np.isnan(monotone_fit(np.array([[0.0, np.nan, 1.0]]), np.ones(3))).all()


def test_halfway_crossing_and_its_edge_rule():
    from kvroute.analysis.cliff import halfway_crossing
    from kvroute.analysis.sigmoid import BEYOND_GRID, NO_CLIFF, OK

    x = np.array([0.0, 0.5, 0.8, 0.9, 0.95])
    y = np.array([[0.1, 0.1, 0.3, 0.9, 0.9],  # level 0.5: between 0.8 (0.3) and 0.9 (0.9) → 0.8 + 0.2/0.6·0.1
                  [0.1, 0.1, 0.1, 0.1, 0.9],  # the rise is all in the last gap: beyond the grid
                  [0.1, 0.12, 0.1, 0.15, 0.15]])  # rises by 0.05 < 0.1: no cliff
    a, codes, _ = halfway_crossing(x, y, np.ones(5))
    assert codes.tolist() == [OK, BEYOND_GRID, NO_CLIFF]
    assert a[0] == pytest.approx(0.8 + 0.1 / 3) and np.isnan(a[1:]).all()


def test_cliff_tables_carry_the_cross_check_beside_the_sigmoid():
    _, cliffs = cliff_tables(_records(lambda i, r: r >= 0.85), n_boot=100)
    c = cliffs.iloc[0]
    assert c.alpha_half == pytest.approx(0.825) and c.alpha_half_status == "ok"
    # every replicate crosses at 0.825, but the data only say "between 0.8 and 0.85": the interval is that gap
    assert c.alpha_half_low == pytest.approx(0.8) and c.alpha_half_high == pytest.approx(0.85)
    assert c.alpha_half_gap == [0.8, 0.85]
    assert c.alpha_half_identified == "identified"
    assert "rounded out to the tested ratios" in c.alpha_half_interval and "tested ratios" in c.alpha_half_rule


@pytest.mark.statistical
def test_a_crossing_in_a_wide_gap_gets_the_gap_not_a_degenerate_bootstrap_interval():
    # the rise falls in the 0.5–0.7 gap and rests on one instance failing at 0.5: every bootstrap replicate
    # interpolates a crossing close to the point estimate, yet the data cannot place it inside the gap
    from kvroute.analysis.cliff import analyse_curve, crossing_interval

    def fails(i, r):
        return (r >= 0.7 and i < 46) or (r >= 0.5 and i == 0) or (r == 0 and i == 47)

    res = analyse_curve(_records(fails, n=48), n_boot=400)
    assert res.half_status == "ok" and 0.5 < res.half < 0.7
    finite = res.half_reps[np.isfinite(res.half_reps)]
    assert np.quantile(finite, 0.975) - np.quantile(finite, 0.025) < 0.05  # the plain percentile interval: narrow
    iv = crossing_interval(res.half_reps, res.half_codes, res.ratios, 0.95)
    assert iv["state"] == "closed" and iv["low"] == 0.5 and iv["high"] == 0.7
    _, cliffs = cliff_tables(_records(fails, n=48), n_boot=400)
    c = cliffs.iloc[0]
    assert c.alpha_half_low == 0.5 and c.alpha_half_high == 0.7


def test_crossing_interval_rounds_out_to_the_bracketing_ratios_and_keeps_open_ends_open():
    from kvroute.analysis.cliff import crossing_gap, crossing_interval
    from kvroute.analysis.sigmoid import BEYOND_GRID, OK

    x = GRID
    vals = np.concatenate([np.full(50, 0.82), np.full(50, 0.87)])
    iv = crossing_interval(vals, np.full(100, OK), x, 0.95)
    assert (iv["low"], iv["high"]) == (0.8, 0.9)  # the bootstrap moved across 0.85: two gaps
    # a crossing exactly on a tested ratio x_j lies in (x_{j-1}, x_j]
    iv = crossing_interval(np.full(100, 0.85), np.full(100, OK), x, 0.95)
    assert (iv["low"], iv["high"]) == (0.8, 0.85)
    assert crossing_gap(0.85, x) == (0.8, 0.85) and crossing_gap(0.6, x) == (0.5, 0.7) and crossing_gap(None, x) is None
    codes = np.full(100, OK)
    codes[-10:] = BEYOND_GRID
    iv = crossing_interval(np.full(100, 0.82), codes, x, 0.95)
    assert iv["state"] == "open_above" and iv["low"] == 0.8 and iv["high"] is None


@pytest.mark.statistical
def test_the_caused_view_keeps_the_instances_right_uncompressed():
    from kvroute.analysis.common import caused_view

    rng = np.random.default_rng(4)
    rows = []
    for i in range(120):
        hard = i < 48  # 40% fail even with the full cache (and at every ratio)
        thr = rng.uniform(0.6, 0.9)  # the others fail from their own threshold on
        for r in RATIO_GRID:
            fail = hard or (r > 0 and r >= thr)
            rows.append({"model": "m", "press": "none" if r == 0 else "p", "instance_id": f"i{i}", "ratio": r,
                         "hallucinated": fail, "outcome": "distractor" if fail else "correct"})
    df = pd.DataFrame(rows)
    caused = caused_view(df)
    assert set(caused["instance_id"]) == {f"i{i}" for i in range(48, 120)}
    curves, cliffs = cliff_tables(caused, n_boot=100)
    all_curves, all_cliffs = cliff_tables(df, n_boot=100)
    h = curves.set_index("ratio")["h"]
    assert h[0.0] == 0 and h[0.98] == 1  # the whole amplitude: H(0) = 0 by construction
    assert all_curves.set_index("ratio")["h"][0.0] == pytest.approx(0.4)  # the hard instances lift the baseline
    # the halfway crossing of the caused curve sits at the median threshold, 0.75
    assert abs(cliffs.iloc[0].alpha_half - 0.75) < 0.06
    assert caused_view(df.drop(columns="outcome")).empty


def test_a_wide_elasticity_interval_is_no_fixed_ratio():
    # the review's case: β in [0.51, 1.35] contains 1 and excludes 0, yet also allows a budget growing half as
    # fast as T; the equivalence margin makes it inconclusive (the mutation — "contains 1" — would call it fixed)
    from kvroute.analysis import context

    fitted = [{"T": t, "alpha_star": 0.8} for t in (256, 512, 1024)]
    rng = np.random.default_rng(0)
    # replicates whose β spreads over about [0.5, 1.35]: α* per length drawn so the kept budget scales as T^β
    betas = rng.uniform(0.5, 1.35, 400)
    t = np.array([256, 512, 1024], float)
    reps = 1 - 0.2 * (t[None, :] / 512) ** (betas[:, None] - 1)
    v = context._verdict(fitted, {int(x): reps[:, j] for j, x in enumerate(t)}, 0.95, 3)
    assert v["beta_low"] < 0.6 and v["beta_high"] > 1.25
    assert v["verdict"] == "inconclusive" and "fixed ratio" in v["reason"]
    tight = 1 - 0.2 * (t[None, :] / 512) ** (rng.uniform(0.9, 1.1, 400)[:, None] - 1)
    assert context._verdict(fitted, {int(x): tight[:, j] for j, x in enumerate(t)}, 0.95, 3)["verdict"] == "fixed ratio"


def test_the_grid_fitter_does_not_depend_on_its_chunking_and_ties_span_every_tied_shape():
    """best() fits rows a chunk at a time into reused buffers and reads a tied range off the ascending midpoints: the
    numbers (and the bootstrap's tie draws) must be those of one row at a time, up to the matrix product's rounding
    (BLAS sums a 1-row product in another order), and the tied range every shape whose SSE ties the best (recomputed
    here per shape with the closed-form edges, independent of best()'s bookkeeping)."""
    from kvroute.analysis.sigmoid import _TIE_ABS, _TIE_REL, SigmoidGrid

    rng = np.random.default_rng(3)
    y = np.clip(0.05 + 0.9 / (1 + np.exp(-40 * (GRID - 0.8))) + rng.normal(0, 0.1, (37, len(GRID))), 0, 1)
    y[1] = (GRID > 0.75).astype(float)  # a step: a tie across the whole gap
    y[2] = np.nan  # a row with NaN gets NaN
    y[3] = 1.0 - (GRID > 0.75)  # falling: no increasing shape is feasible inside the triangle but the flat edges
    g = SigmoidGrid(GRID, mid_step=0.01, n_k=8)
    one = g.best(y, chunk=1, rng=np.random.default_rng(7))
    for chunk in (5, 32, 1000):
        other = g.best(y, chunk=chunk, rng=np.random.default_rng(7))
        for key in one:
            np.testing.assert_allclose(one[key], other[key], rtol=1e-12, atol=1e-12, err_msg=f"{key} at chunk {chunk}")
    assert np.isnan(one["mid"][2]) and np.isnan(one["sse"][2])
    # every shape's constrained SSE: the interior optimum where it is in the triangle, else the better edge
    s = np.stack([1 / (1 + np.exp(np.clip(-k * (GRID - m), -500, 500))) for m, k in zip(g.mids, g.ks, strict=True)])
    for row in (0, 1, 3, 10, 36):
        yy = y[row]
        sse = []
        for sh in s:
            A = np.stack([np.ones_like(sh), sh], 1)
            (lo, amp), *_ = np.linalg.lstsq(A, yy, rcond=None)
            if amp > 0 and lo >= 0 and lo + amp <= 1:
                sse.append(float(((lo + amp * sh - yy) ** 2).sum()))
                continue
            a0 = np.clip(sh @ yy / (sh @ sh), 0, 1)  # lo = 0
            l1 = np.clip((1 - sh) @ (yy - sh) / ((1 - sh) @ (1 - sh)), 0, 1)  # hi = 1
            sse.append(min(float(((a0 * sh - yy) ** 2).sum()), float(((l1 + (1 - l1) * sh - yy) ** 2).sum())))
        sse = np.array(sse)
        smin = sse.min()
        assert one["sse"][row] == pytest.approx(max(smin, 0.0), abs=1e-9)
        tied = sse <= smin + _TIE_ABS + _TIE_REL * abs(smin) + 1e-9  # (the recomputation's own rounding)
        assert one["mid_low"][row] == pytest.approx(g.mids[tied].min(), abs=1e-12), row
        assert one["mid_high"][row] == pytest.approx(g.mids[tied].max(), abs=1e-12), row
        assert one["mid_low"][row] <= one["mid"][row] <= one["mid_high"][row]
    assert one["mid_high"][1] - one["mid_low"][1] > 0.03  # the step's gap is tied across
