"""Tickets are compared with the cliffs of the same model, regime and task family."""

import math

import pandas as pd

from kvroute.analysis.tickets import tickets_vs_cliffs


def _cliffs():
    rows = []
    for regime, a in (("agnostic", 0.8), ("aware", 0.5)):
        for family, d in (("all", 0.0), ("base", 0.1), ("niah", -0.2)):
            rows.append({"model": "m", "press": "snapkv", "regime": regime, "family": family, "alpha_star": a + d})
    rows.append({"model": "other", "press": "snapkv", "regime": "agnostic", "family": "all", "alpha_star": 0.3})
    return pd.DataFrame(rows)


def test_join_matches_regime_and_family():
    t = pd.DataFrame([{"model": "m", "regime": "agnostic", "family": "base", "fraction": 0.02},
                      {"model": "m", "regime": "agnostic", "family": "base", "fraction": 0.04},
                      {"model": "m", "regime": "aware", "family": "hops", "fraction": 0.1}])
    out = tickets_vs_cliffs(t, _cliffs())
    assert len(out) == 2  # one cliff per ticket group, never the other regime's or family's
    base = out[out["family"] == "base"].iloc[0]
    assert base["regime"] == "agnostic" and base["cliff_family"] == "base"
    assert math.isclose(base["alpha_star"], 0.9) and math.isclose(base["ticket_median"], 0.03)
    assert math.isclose(base["cliff_over_ticket"], (1 - 0.9) / 0.03)
    hops = out[out["family"] == "hops"].iloc[0]  # no hops curve: the pooled curve of the same regime
    assert hops["cliff_family"] == "all" and math.isclose(hops["alpha_star"], 0.5)


def test_old_tickets_without_regime_count_as_agnostic_and_unmatched_models_stay():
    t = pd.DataFrame([{"model": "m", "family": "base", "fraction": 0.05},
                      {"model": "absent", "family": "base", "fraction": 0.05}])
    out = tickets_vs_cliffs(t, _cliffs())
    m = out[out["model"] == "m"]
    assert len(m) == 1 and math.isclose(m.iloc[0]["alpha_star"], 0.9)
    a = out[out["model"] == "absent"]
    assert len(a) == 1 and a["alpha_star"].isna().all()
