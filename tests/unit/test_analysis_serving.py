"""The serving-cost estimator: names split into press and constraint, planted costs found, a zero cost not."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from kvroute.analysis.common import AnalysisError
from kvroute.analysis.planted import serving as ps
from kvroute.analysis.serving import serving_cost, serving_findings, split_press, variant_layout


def test_split_press_and_layout():
    assert split_press("snapkv[window_size=16]+paged[block=16]+uniform") == ("snapkv[window_size=16]",
                                                                            "paged[block=16]+uniform")
    assert split_press("expected_attention+adakv") == ("expected_attention+adakv", "")
    assert split_press("expected_attention+adakv+paged[block=64]") == ("expected_attention+adakv", "paged[block=64]")
    assert variant_layout("paged[block=16]+uniform") == (16, True)
    assert variant_layout("uniform") == (1, True)
    assert variant_layout("paged[agg=max,block=64]") == (64, False)
    assert variant_layout("paged") == (16, False)


def test_known_differences_per_ratio_and_over_the_grid():
    # 12 instances; the variant hallucinates at 0.9 where the press does not, on instances 0..5 only
    rows = []
    for i in range(12):
        for press in ("knorm", "knorm+paged[block=16]"):
            for r in (0.0, 0.5, 0.9):
                bad = press != "knorm" and r == 0.9 and i < 6
                rows.append({"model": "m", "regime": "agnostic", "press": press, "instance_id": f"i{i}", "ratio": r,
                             "hallucinated": bad, "ger": 0.5 if bad else 0.0})
    pairs, by_ratio, detect = serving_cost(pd.DataFrame(rows), n_boot=200)
    row = pairs.iloc[0]
    # areas over [0, 0.5, 0.9] (width 0.9): the variant's flag 1 at 0.9 only → (0.4 · 0.5) / 0.9 per bad instance
    assert row["difference"] == pytest.approx(0.5 * 0.4 * 0.5 / 0.9)
    at = by_ratio.set_index("ratio")
    assert at.loc[0.9, "dh"] == pytest.approx(0.5) and at.loc[0.5, "dh"] == 0.0
    assert at.loc[0.9, "dger"] == pytest.approx(0.25)
    assert 0.0 not in at.index  # ratio 0 is the shared uncompressed run
    # six of six non-zero differences positive: exact sign-flip p = 2/64, decided at 0.05
    assert row["p_value"] == pytest.approx(2 / 64) and row["decided"]
    assert "knorm at page size 16, per head (m, agnostic): the constraint costs +0.111" in row["finding"]
    # GER 0.5 at 0.9 on the same six instances: +0.056 in GER area, p = 2/64, decided on its own
    assert row["ger_difference"] == pytest.approx(0.5 * 0.4 * 0.25 / 0.9) and row["ger_decided"]
    assert "; GER: it evicts the evidence more: +0.056" in row["finding"]
    assert detect.iloc[0]["smallest_detected"] == 16
    assert len(serving_findings(pairs, detect)) == 2


def test_no_constrained_press_is_an_analysis_error():
    df = pd.DataFrame([{"model": "m", "regime": "a", "press": "knorm", "instance_id": "i", "ratio": r,
                        "hallucinated": False} for r in (0.0, 0.5)])
    with pytest.raises(AnalysisError, match="no press appears both unconstrained and with a serving constraint"):
        serving_cost(df)


def test_planted_costs_are_covered_and_a_zero_cost_is_not_detected():
    rows = {r["parameter"].split(" ")[0]: r for r in ps.coverage(n_sets=30, seed=1)}
    for r in rows.values():
        assert r["coverage"] >= 0.8, r
    assert rows["paged[block=16]"]["decided"] <= 0.15  # the zero-cost control: false detections
    assert rows["paged[block=16]+uniform"]["decided"] >= 0.9  # a cliff 0.15 earlier: found
    assert rows["paged[block=16]+uniform"]["mean_estimate"] > rows["paged[block=64]"]["mean_estimate"] > 0.02


def test_the_variant_of_the_other_sign_is_a_gain_not_a_cost():
    rng = np.random.default_rng(0)
    df = ps.simulate(48, 0.1, rng, costs={"uniform": -0.15})  # the variant's cliff comes later
    pairs, _, detect = serving_cost(df, n_boot=300)
    assert pairs.iloc[0]["difference"] < 0 and "the constraint gains" in pairs.iloc[0]["finding"]
    assert detect.iloc[0]["smallest_detected"] is None and "shows a decided cost" in detect.iloc[0]["finding"]
    few = serving_cost(df[df["instance_id"].isin(["i0", "i1", "i2"])], n_boot=100)[2]
    assert "cannot decide — fewer than 10 shared instances" in few.iloc[0]["finding"]


# --- the GER side: decided on its own, paired ------------------------------------------------------------------------

GER_SHIFTS = {"paged[block=16]": 0.0, "paged[block=64]": 0.05}
NO_COST = {"paged[block=16]": 0.0, "paged[block=64]": 0.0}


def _ger_runs(n_sets=20, **kw):
    rng = np.random.default_rng(3)
    return [serving_cost(ps.simulate(48, 0.1, rng, costs=NO_COST, ger_shifts=GER_SHIFTS, **kw), n_boot=300,
                         seed=k, per_ratio=False)[0].set_index("variant") for k in range(n_sets)]


def test_the_ger_cost_is_found_apart_from_the_answers():
    """A planted +0.05 GER shift with no change in H: GER decided, H not; the zero shift is not decided."""
    runs = _ger_runs()
    truth = ps.true_ger_difference(0.05)
    shifted = [r.loc["paged[block=64]"] for r in runs]
    control = [r.loc["paged[block=16]"] for r in runs]
    assert np.mean([r["ger_decided"] for r in shifted]) >= 0.9
    assert np.mean([r["ger_difference_low"] <= truth <= r["ger_difference_high"] for r in shifted]) >= 0.8
    assert np.mean([r["ger_decided"] for r in control]) <= 0.15
    assert np.mean([r["decided"] for r in shifted + control]) <= 0.1  # the answers did not change
    assert "it evicts the evidence more: +0.0" in shifted[0]["finding"]
    assert "cannot decide" in shifted[0]["finding"].split(";")[0]


def test_without_pairing_the_ger_cost_is_lost_among_instances(monkeypatch):
    """Mutation: compare the variant's instances with other instances (pairing broken) and the same planted
    shift, small beside the spread between instances, is no longer decided."""
    import kvroute.analysis.serving as sv

    real = sv.instance_areas

    def shuffled(cells, grid, value_col="hallucinated"):
        a = real(cells, grid, value_col)
        if value_col == "ger" and cells["press"].str.contains(r"\+").any():
            a = pd.Series(np.random.default_rng(0).permutation(a.to_numpy()), index=a.index)
        return a

    monkeypatch.setattr(sv, "instance_areas", shuffled)
    runs = _ger_runs(n_sets=10)
    assert np.mean([r.loc["paged[block=64]", "ger_decided"] for r in runs]) <= 0.3


def test_the_ger_finding_says_when_too_few_instances_have_a_ger():
    rng = np.random.default_rng(0)
    df = ps.simulate(48, 0.1, rng, costs=NO_COST, ger_shifts=GER_SHIFTS)
    df.loc[~df["instance_id"].isin([f"i{k}" for k in range(6)]), "ger"] = np.nan  # evidence "none" elsewhere
    row = serving_cost(df, n_boot=100, per_ratio=False)[0].set_index("variant").loc["paged[block=64]"]
    assert row["ger_n"] == 6 and "GER: cannot decide — only 6 shared instances with a defined GER" in row["finding"]
