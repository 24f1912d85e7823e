"""Retention / accessibility / utilization curves, breakdowns and layer profiles."""

import numpy as np
import pandas as pd
import pytest

from kvroute.analysis.curves import breakdown, layer_profiles, routing_curves


def _df() -> pd.DataFrame:
    return pd.DataFrame({
        "model": "m", "press": ["none", "none", "p", "p"], "instance_id": ["a", "b", "a", "b"],
        "ratio": [0.0, 0.0, 0.9, 0.9], "ger": [0.0, 0.0, 0.5, 1.0],
        "evidence_attention_mass": [0.4, 0.2, 0.1, 0.05], "evidence_attention_mass_full": [0.4, 0.2, 0.4, 0.2],
        "reachable": [True, True, True, False], "f1": [1.0, 1.0, 0.5, 0.0], "hallucinated": [False, False, False, True],
        "answer_type": ["Person", "Date/Time", "Person", "Date/Time"],
        "consensus": [[0.2, 0.8], [0.4, 0.6], [0.1, 0.5], [0.3, 0.7]],
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
