import numpy as np
import pandas as pd

from kvroute.analysis.compare import press_pairs, selection_comparison


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


def test_a_shifted_cliff_is_found_with_an_interval_that_excludes_zero():
    out = selection_comparison(_records(0.2), n_boot=300)
    row = out[out["press_a"] == "ea+adakv"].iloc[0]
    assert 0.1 < row["delta_alpha"] < 0.3
    assert row["delta_alpha_low"] > 0
    assert row["delta_h_top"] < 0


def test_no_shift_gives_an_interval_around_zero():
    out = selection_comparison(_records(0.0), n_boot=300)
    row = out.iloc[0]
    assert abs(row["delta_alpha"]) < 0.05
    assert row["delta_alpha_low"] <= 0 <= row["delta_alpha_high"]
