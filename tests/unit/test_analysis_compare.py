import numpy as np
import pandas as pd
import pytest

from kvroute.analysis.compare import press_pairs, selection_comparison
from kvroute.analysis.sigmoid import BELOW_GRID, BEYOND_GRID, NO_CLIFF, OK
from kvroute.analysis.synthetic import RATIO_GRID


def test_pairs_share_the_scorer():
    presses = ["none", "ea+adakv", "ea+routes", "ea", "snapkv+adakv", "snapkv"]
    assert press_pairs(presses) == [("ea+adakv", "ea+routes"), ("ea", "ea+routes")]


def _records(shift: float, n: int = 40, seed: int = 0) -> pd.DataFrame:
    """Two presses whose hallucination steps up at 0.6 (adakv) and 0.6 + shift (routes)."""
    rng = np.random.default_rng(seed)
    ratios = [0.0, 0.2, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9]
    rows = []
    for i in range(n):
        jitter = rng.uniform(-0.05, 0.05)
        for press, step in (("ea+adakv", 0.6), ("ea+routes", 0.6 + shift)):
            for r in ratios:
                rows.append({"model": "m", "instance_id": f"i{i}", "press": press if r > 0 else "none", "ratio": r,
                             "regime": "agnostic", "family": "base", "hallucinated": r >= step + jitter})
    return pd.DataFrame(rows).drop_duplicates(subset=["instance_id", "press", "ratio"])


@pytest.mark.statistical
def test_a_shifted_cliff_is_found_with_an_interval_that_excludes_zero():
    out = selection_comparison(_records(0.2), n_boot=300)
    row = out[out["press_a"] == "ea+adakv"].iloc[0]
    assert 0.1 < row["delta_alpha"] < 0.3
    assert row["delta_alpha_low"] > 0
    assert row["delta_h_top"] < 0


@pytest.mark.statistical
def test_no_shift_gives_an_interval_around_zero():
    out = selection_comparison(_records(0.0), n_boot=300)
    row = out.iloc[0]
    assert abs(row["delta_alpha"]) < 0.05
    assert row["delta_alpha_low"] <= 0 <= row["delta_alpha_high"]


# --- the edge rule: replicates off the grid are censored, not clamped at its edge (issue 14) ------

def _edge_pair(n: int = 60) -> pd.DataFrame:
    """adakv steps at 0.7; routes only starts failing at the top: H = 0.1, 0.5, 0.9 at 0.9, 0.95, 0.98, so its
    midpoint sits next to 0.95 and many replicates put it in the grid's last gap, where it is not identified."""
    def routes(i: int, r: float) -> bool:
        return (r >= 0.9 and i < 0.1 * n) or (r >= 0.95 and i < 0.5 * n) or (r >= 0.98 and i < 0.9 * n)

    rows = []
    for i in range(n):
        for press, fails in (("ea+adakv", lambda i, r: r >= 0.7), ("ea+routes", routes)):
            for r in RATIO_GRID:
                rows.append({"model": "m", "instance_id": f"i{i}", "press": press if r > 0 else "none", "ratio": r,
                             "regime": "agnostic", "family": "base", "hallucinated": bool(fails(i, r))})
    return pd.DataFrame(rows).drop_duplicates(subset=["instance_id", "press", "ratio"])


def test_replicates_beyond_the_grid_open_the_interval_instead_of_clamping_at_the_edge():
    row = selection_comparison(_edge_pair(), n_boot=400).iloc[0]
    assert row["status_b"] == "ok" and row["delta_alpha"] is not None  # the point estimate is identified
    # the old code clamped those replicates at the edge and reported a closed [x, ~0.98 − 0.7] interval
    assert row["delta_alpha_high"] is None
    assert row["boot_beyond_grid_b"] > 0.025  # ... because not every replicate's midpoint is identified
    assert row["delta_alpha_identified"] in ("open_above", "not identified")
    assert "not identified" in row["delta_alpha_interval"]
    if row["delta_alpha_identified"] == "open_above":
        assert row["delta_alpha_low"] > 0


def test_a_difference_is_censored_by_the_side_each_press_is_off():
    from kvroute.analysis.compare import delta_codes

    ca = np.array([OK, OK, OK, BELOW_GRID, BEYOND_GRID, BEYOND_GRID, BELOW_GRID, NO_CLIFF, OK])
    cb = np.array([OK, BEYOND_GRID, BELOW_GRID, OK, OK, BEYOND_GRID, BEYOND_GRID, OK, NO_CLIFF])
    ma = np.where(ca == OK, 0.6, np.nan)
    mb = np.where(cb == OK, 0.7, np.nan)
    d, codes = delta_codes(ma, ca, mb, cb)
    assert codes.tolist() == [OK, BEYOND_GRID, BELOW_GRID, BEYOND_GRID, BELOW_GRID, NO_CLIFF, BEYOND_GRID,
                              NO_CLIFF, NO_CLIFF]
    assert d[0] == pytest.approx(0.1) and np.isnan(d[1:]).all()


def test_tied_midpoints_in_a_gap_are_spread_not_piled_on_its_lower_end():
    # both presses step inside the 0.5–0.7 gap: every midpoint in it fits, so Δα* replicates must spread
    rows = []
    for i in range(50):
        for press in ("ea+adakv", "ea+routes"):
            for r in RATIO_GRID:
                rows.append({"model": "m", "instance_id": f"i{i}", "press": press if r > 0 else "none", "ratio": r,
                             "regime": "agnostic", "family": "base", "hallucinated": bool(r >= 0.7 and i < 40)})
    row = selection_comparison(pd.DataFrame(rows).drop_duplicates(subset=["instance_id", "press", "ratio"]),
                               n_boot=300).iloc[0]
    # the old fitter put every replicate of both on the same grid point: a zero-width interval
    assert row["delta_alpha_low"] < -0.03 and row["delta_alpha_high"] > 0.03
    assert row["delta_alpha_identified"] == "identified"
