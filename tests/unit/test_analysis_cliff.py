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
    rows = [{"model": "m", "press": "p", "instance_id": f"i{i}", "ratio": r, "hallucinated": bool(h_of_instance_ratio(i, r)),
             **tags} for i in range(n) for r in ratios]
    return pd.DataFrame(rows)


def test_a_step_function_gives_its_step_as_alpha_star():
    df = _records(lambda i, r: r >= 0.85)
    curves, cliffs = cliff_tables(df, n_boot=200)
    c = cliffs.iloc[0]
    assert c.status == "ok"
    assert 0.8 < c.alpha_star <= 0.85  # anywhere between the last 0 and the first 1 fits exactly
    assert c.alpha_star_low >= 0.8 and c.alpha_star_high <= 0.85
    assert c.alpha_chi_max == pytest.approx(0.825) and c.chi_max == pytest.approx(1 / 0.05)
    assert c.safe_ratio == 0.8
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
    safe, _, why = safe_ratio(np.array([0.5, 0.7]), np.zeros((10, 2)))
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
    assert list(length_bins(t, edges=[0, 700, 5000]).unique()) == [500, 1050]  # medians of {260, 500, 520} and {1000, 1050, 2040}


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
