"""Planted truth for head consensus: exact recovery on hand-built attention (sinks, GQA groups of
1, 3 and 7), and the layer-profile intervals and trend label on record sets with a known profile."""

import numpy as np
import pytest

from kvroute.analysis.curves import layer_profiles, profile_trend
from kvroute.analysis.planted import consensus as pc
from kvroute.metrics.consensus import consensus_and_rho, group_consensus_and_rho


def _keys(*layers):
    return np.asarray(layers, int) + pc.N_SINK  # non-sink key indices


def test_hand_built_tensor_recovers_the_planted_counts_exactly():
    # 3 layers, 6 groups: 1, 3 and 6 distinct keys; group 0 of layer 1 and groups 0-2 of layer 2 sink-dominated
    keys = _keys([5] * 6, [5, 5, 9, 9, 12, 12], [1, 2, 3, 4, 5, 6])
    sinks = np.full(keys.shape, -1)
    sinks[1, 0] = 0
    sinks[2, :3] = [1, 1, 2]
    for G in pc.GROUP_SIZES:
        attn, truth = pc.planted_attention(keys, sinks, G, np.random.default_rng(3))
        assert attn.shape == (3, 6 * G, pc.KEYS)
        assert group_consensus_and_rho(attn, G, pc.N_SINK) == ([1 / 6, 0.5, 1.0], [1.0, pytest.approx(1 / 3), 1 / 6])
        # with sinks: layer 1's group 0 picks column 0 (keys {0, 9, 13, 16}); layer 2's groups 0-2 pick
        # columns 1, 1, 2 (keys {1, 2, 8, 9, 10})
        assert group_consensus_and_rho(attn, G)[0] == [1 / 6, 4 / 6, 5 / 6]
        cn, rn = consensus_and_rho(attn, pc.N_SINK)
        if G == 1:  # one query head per group: the per-head value is the group-aware one
            assert cn == [1 / 6, 0.5, 1.0]
        else:  # every head's own argmax is its decoy: all distinct, the group profile is invisible per head
            assert cn == [1.0, 1.0, 1.0] and rn == [pytest.approx(1 / (6 * G))] * 3
        assert cn == truth["consensus_nosink"] and rn == truth["rho_nosink"]
        assert consensus_and_rho(attn)[0] == truth["consensus_withsink"]
        assert attn.sum(-1).allclose(attn.new_ones(()))  # rows are attention distributions


@pytest.mark.statistical
def test_random_planted_tensors_are_recovered_exactly_and_the_group_value_ignores_group_size():
    rows = {(r["estimator"], r["scenario"]): r for r in pc.coverage(n_sets=15, seed=2)}
    for G in pc.GROUP_SIZES:
        assert rows["metric consensus/rho (all variants)", f"G={G}"]["recovered"] == 1.0, G
    assert rows["metric consensus_group_nosink", "across G"]["recovered"] == 1.0
    assert rows["metric consensus_withsink", "sinks"]["recovered"] > 0.9  # the planted sinks do change it
    for shape in pc.SHAPES:
        for col in ("consensus_nosink", "consensus_group_nosink"):
            prof, trend = rows[f"layer_profiles({col})", shape], rows[f"profile_trend({col})", shape]
            assert prof["mean_estimate"] < 0.03, (shape, col)  # mean |bias| over layers
            assert prof["mean_layer_coverage"] >= 0.8 and prof["coverage"] >= 0.6, (shape, col)
            assert trend["recovered"] >= 0.8 and trend["coverage"] >= 0.7, (shape, col)


def test_true_profile_is_the_simulation_mean():
    df = pc.simulate_records(np.random.default_rng(5), n_instances=4000)
    for shape in pc.SHAPES:
        got = np.mean(df.loc[df.model == shape, "consensus_nosink"].tolist(), axis=0)
        np.testing.assert_allclose(got, pc.true_consensus(shape, pc.HEADS), atol=0.01)
        got = np.mean(df.loc[df.model == shape, "consensus_group_nosink"].tolist(), axis=0)
        np.testing.assert_allclose(got, pc.true_consensus(shape, pc.KV_GROUPS), atol=0.01)


def test_curve_estimators_read_the_sink_free_vector_not_the_inverted_with_sink_one():
    df = pc.simulate_records(np.random.default_rng(6))
    t = profile_trend(df, n_boot=200).set_index("model")
    assert t.loc["diversifying", "trend"] == "diversifying" and t.loc["funnel", "trend"] == "funnel"
    withsink = profile_trend(df, "consensus_withsink", n_boot=200).set_index("model")
    assert withsink.loc["diversifying", "trend"] == "funnel"  # what the old with-sink headline would say
    p = layer_profiles(df, n_boot=200)
    div = p[p.model == "diversifying"].sort_values("layer")
    assert div.value.iloc[-1] > div.value.iloc[0] + 0.3
