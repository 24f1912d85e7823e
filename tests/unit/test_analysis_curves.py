"""Retention / accessibility / utilization curves, breakdowns and layer profiles."""

import numpy as np
import pandas as pd
import pytest

from kvroute.analysis.curves import breakdown, layer_profiles, profile_trend, routing_curves, trend_label
from kvroute.analysis.load import load_records, rename_legacy_fields


def _df() -> pd.DataFrame:
    return pd.DataFrame({
        "model": "m", "press": ["none", "none", "p", "p"], "instance_id": ["a", "b", "a", "b"],
        "ratio": [0.0, 0.0, 0.9, 0.9], "ger": [0.0, 0.0, 0.5, 1.0],
        "evidence_attention_mass": [0.4, 0.2, 0.1, 0.05], "evidence_attention_mass_full": [0.4, 0.2, 0.4, 0.2],
        "reachable": [True, True, True, False], "f1": [1.0, 1.0, 0.5, 0.0], "hallucinated": [False, False, False, True],
        "answer_type": ["Person", "Date/Time", "Person", "Date/Time"],
        "consensus_nosink": [[0.2, 0.8], [0.4, 0.6], [0.1, 0.5], [0.3, 0.7]],
        "consensus_withsink": [[0.1, 0.1], [0.1, 0.1], [0.1, 0.1], [0.1, 0.1]],
    })


def test_routing_curves_side_by_side():
    c = routing_curves(_df()).set_index("ratio")
    assert c.loc[0.9, "retention"] == pytest.approx(0.25)
    assert c.loc[0.9, "accessibility"] == pytest.approx(0.15 / 0.6)  # ratio of means
    assert c.loc[0.0, "accessibility"] == pytest.approx(1.0)
    assert c.loc[0.9, "reachability"] == pytest.approx(0.5)
    assert c.loc[0.9, "f1"] == pytest.approx(0.25) and c.loc[0.9, "hallucination"] == pytest.approx(0.5)
    assert "logprob_delta" not in c.columns  # columns the records lack are left out
    assert set(c.press) == {"p"}  # the baseline is attached to the press


def test_breakdown_by_answer_type():
    b = breakdown(_df(), "answer_type")
    row = b[(b.ratio == 0.9) & (b.answer_type == "Date/Time")].iloc[0]
    assert row.f1 == 0.0 and row.hallucinated == 1.0 and row.n_cells == 1


def test_layer_profiles_average_per_layer():
    p = layer_profiles(_df())
    full = p[p.ratio == 0.0].sort_values("layer")
    np.testing.assert_allclose(full.value, [0.3, 0.7])
    comp = p[p.ratio == 0.9].sort_values("layer")
    np.testing.assert_allclose(comp.value, [0.2, 0.6])


def test_layer_profiles_read_the_sink_free_consensus_by_default():
    p = layer_profiles(_df(), n_boot=0)
    np.testing.assert_allclose(p[p.ratio == 0.0].sort_values("layer").value, [0.3, 0.7])  # not the with-sink 0.1
    assert p.low.isna().all()  # no bootstrap asked for


def _profile_records(profile, n=30, seed=0, cells_per_instance=1, noise=0.1):
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        shift = rng.normal(0, noise)  # instance noise shared by the instance's cells and layers
        for c in range(cells_per_instance):
            rows.append({"model": "m", "press": "none", "instance_id": f"i{i}", "ratio": 0.0, "seed": c,
                         "consensus_nosink": (np.asarray(profile) + shift
                                              + rng.normal(0, 0.02, len(profile))).tolist()})
    return pd.DataFrame(rows)


def test_layer_profile_intervals_bracket_the_mean_and_resample_instances():
    df = _profile_records([0.2, 0.4, 0.6], n=30)
    p = layer_profiles(df, n_boot=400).sort_values("layer")
    assert (p.low < p.value).all() and (p.value < p.high).all()
    assert (p.n_instances == 30).all() and (p.n_cells == 30).all()
    # the same instances, each cell duplicated: the interval must not shrink (instances are the unit)
    dup = pd.concat([df, df.assign(seed=1)], ignore_index=True)
    q = layer_profiles(dup, n_boot=400).sort_values("layer")
    assert (q.n_instances == 30).all() and (q.n_cells == 60).all()
    np.testing.assert_allclose((q.high - q.low).to_numpy(), (p.high - p.low).to_numpy(), rtol=0.35)


@pytest.mark.parametrize(("profile", "label"), [([0.2, 0.3, 0.4, 0.5, 0.6, 0.7], "diversifying"),
                                                ([0.7, 0.6, 0.5, 0.4, 0.3, 0.2], "funnel"),
                                                ([0.45] * 6, "flat")])
def test_profile_trend_labels_where_the_heads_agree(profile, label):
    t = profile_trend(_profile_records(profile), n_boot=400).iloc[0]
    assert t.trend == label and t.measure == "consensus_nosink" and t.n_layers == 6
    assert t.early == pytest.approx(np.mean(profile[:2]), abs=0.05)
    assert t.late == pytest.approx(np.mean(profile[-2:]), abs=0.05)
    assert t.change_low <= t.change <= t.change_high


def test_trend_label_needs_the_interval_and_the_size():
    assert trend_label(0.1, 0.05, 0.15, 0.02) == "diversifying"
    assert trend_label(-0.1, -0.15, -0.05, 0.02) == "funnel"
    assert trend_label(0.1, -0.01, 0.2, 0.02) == "flat"  # the interval includes 0
    assert trend_label(0.01, 0.005, 0.015, 0.02) == "flat"  # significant but below the tolerance
    assert trend_label(float("nan"), 0, 0, 0.02) is None


def test_old_stores_map_the_with_sink_names_never_onto_the_sink_free_default(tmp_path):
    old = pd.DataFrame({"model": "m", "press": "none", "instance_id": ["a", "b"], "ratio": 0.0,
                        "consensus": [[0.1, 0.2], [0.3, 0.4]], "rho": [[0.9, 0.8], [0.7, 0.6]],
                        "consensus_nosink": [[0.5, 0.6], [0.7, 0.8]], "consensus_mean": [0.55, 0.75]})
    f = tmp_path / "records.jsonl"
    old.to_json(f, orient="records", lines=True)
    df = load_records(f)
    assert {"consensus_withsink", "rho_withsink", "consensus_nosink_mean"} <= set(df.columns)
    assert not {"consensus", "rho", "consensus_mean"} & set(df.columns)
    np.testing.assert_allclose(df.consensus_withsink.tolist(), [[0.1, 0.2], [0.3, 0.4]])  # decoded as vectors
    p = layer_profiles(df, n_boot=0)
    np.testing.assert_allclose(p.sort_values("layer").value, [0.6, 0.7])  # the sink-free vectors
    # a store resumed across the rename holds both names: the new one wins, the old fills its gaps
    mixed = pd.DataFrame({"consensus": [[0.1], [0.2]], "consensus_withsink": [None, [0.9]]})
    assert rename_legacy_fields(mixed).consensus_withsink.tolist() == [[0.1], [0.9]]
