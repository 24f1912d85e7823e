"""GER–hallucination link: r across ratios and P(hallucination | global eviction)."""

import numpy as np
import pandas as pd
import pytest

from kvroute.analysis.correlation import conditional_hallucination, correlate, ger_hallucination_correlation


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
                       for i, c in enumerate(ev + kept)] + [{"model": "m", "press": "p", "instance_id": "b", **c} for c in base])
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
