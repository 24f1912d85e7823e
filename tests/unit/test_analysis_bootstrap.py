"""The instance bootstrap: coverage at its nominal rate, clustering by instance, reproducibility."""

import numpy as np
import pandas as pd
import pytest

from kvroute.analysis.bootstrap import (
    boot_means,
    bootstrap_ci,
    instance_matrix,
    percentile_interval,
    resample_weights,
)
from kvroute.analysis.common import AnalysisError


def _clustered(rng: np.random.Generator, n_inst: int = 50, cells: int = 4) -> pd.DataFrame:
    """Cells sharing a strong per-instance effect; the true mean is 0.5."""
    b = rng.normal(0.5, 0.3, n_inst)  # instance effect
    inst = np.repeat(np.arange(n_inst), cells)
    v = b[inst] + rng.normal(0, 0.05, n_inst * cells)
    return pd.DataFrame({"instance_id": inst, "cell": np.arange(n_inst * cells), "v": v})


@pytest.mark.statistical
def test_intervals_cover_the_truth_at_about_their_nominal_rate():
    rng = np.random.default_rng(2024)
    hits_instance = hits_cell = 0
    n_sim = 200
    for i in range(n_sim):
        df = _clustered(rng)
        r = bootstrap_ci(df, "v", n_boot=300, seed=i).iloc[0]
        hits_instance += r.ci_low <= 0.5 <= r.ci_high
        # resampling cells instead of instances ignores the clustering: intervals too narrow
        rc = bootstrap_ci(df, "v", cluster="cell", n_boot=300, seed=i).iloc[0]
        hits_cell += rc.ci_low <= 0.5 <= rc.ci_high
    assert 0.90 <= hits_instance / n_sim <= 0.99
    assert hits_cell / n_sim < 0.85


def test_bernoulli_rates_cover_too():
    rng = np.random.default_rng(7)
    hits = 0
    for i in range(200):
        df = pd.DataFrame({"instance_id": np.arange(80), "h": rng.random(80) < 0.3})
        r = bootstrap_ci(df, "h", n_boot=300, seed=i).iloc[0]
        hits += r.ci_low <= 0.3 <= r.ci_high
    assert 0.90 <= hits / 200 <= 0.99


def test_groups_are_reproducible_and_independent_of_other_groups():
    rng = np.random.default_rng(0)
    df = pd.concat([_clustered(rng).assign(g="a"), _clustered(rng).assign(g="b")])
    both = bootstrap_ci(df, "v", ["g"], n_boot=200, seed=3)
    only_a = bootstrap_ci(df[df.g == "a"], "v", ["g"], n_boot=200, seed=3)
    again = bootstrap_ci(df, "v", ["g"], n_boot=200, seed=3)
    pd.testing.assert_frame_equal(both, again)
    assert both.iloc[0].ci_low == only_a.iloc[0].ci_low
    assert both.iloc[0].n_instances == 50 and both.iloc[0].n_cells == 200
    assert bootstrap_ci(df, "v", ["g"], n_boot=200, seed=4).iloc[0].ci_low != both.iloc[0].ci_low


def test_instance_matrix_and_weighted_replicates():
    df = pd.DataFrame({"instance_id": ["a", "a", "b", "b", "b"], "ratio": [0.0, 0.5, 0.0, 0.5, 0.5],
                       "h": [0, 1, 1, 1, np.nan]})
    inst, cols, sums, counts = instance_matrix(df, "h")
    assert list(inst) == ["a", "b"] and list(cols) == [0.0, 0.5]
    np.testing.assert_array_equal(sums, [[0, 1], [1, 1]])
    np.testing.assert_array_equal(counts, [[1, 1], [1, 1]])  # the NaN cell counts for nothing
    w = np.array([[2, 0], [0, 2], [1, 1]])  # all a, all b, one of each
    np.testing.assert_allclose(boot_means(sums, counts, w), [[0, 1], [1, 1], [0.5, 1]])


def test_percentile_interval_and_errors():
    lo, hi = percentile_interval(np.arange(101.0), 0.9)
    assert (lo, hi) == (pytest.approx(5.0), pytest.approx(95.0))
    with pytest.raises(AnalysisError):
        percentile_interval(np.arange(3.0), 1.5)
    with pytest.raises(AnalysisError):
        resample_weights(0, 10, np.random.default_rng(0))
    with pytest.raises(AnalysisError, match="needs the record column"):
        bootstrap_ci(pd.DataFrame({"x": [1]}), "v")
