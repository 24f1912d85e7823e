"""Restoration maps across failures (kvroute.analysis.restore_map) on hand-built maps with known answers: the
averaged map and its instance bootstrap, the Jaccard agreement of minimal sets against the permutation null,
the minimal sets' sizes, and the finding sentence."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from kvroute.analysis.restore_map import averaged_map, jaccard, minimal_sizes, restore_map_finding, set_agreement
from kvroute.restore_map import RestoreMap


def _map(effect, minimal, *, failure=True, every="correct"):
    eff = torch.as_tensor(effect, dtype=torch.float32)
    return RestoreMap("i", "p", 0.9, "answer", eff, eff >= 1.0, None, {"outcome": "fabricated"},
                      {"outcome": "correct" if failure else "fabricated"}, {}, {"outcome": every}, {}, [], minimal,
                      None)


def test_the_averaged_map_is_the_mean_with_a_bootstrap_interval_that_holds_it():
    maps = [_map([[0.0, 1.0], [0.2, 0.0]], [(0, 1)]), _map([[0.0, 0.5], [0.4, 0.0]], [(0, 1)]),
            _map([[0.0, 0.9], [0.0, 0.0]], [(0, 1)])]
    avg = averaged_map(maps, n_boot=500, seed=0).set_index(["layer", "kv_head"])
    assert avg.loc[(0, 1), "effect"] == pytest.approx(0.8)
    assert avg.loc[(1, 0), "effect"] == pytest.approx(0.2)
    assert avg.loc[(0, 1), "low"] >= 0.5 and avg.loc[(0, 1), "high"] <= 1.0
    assert avg.loc[(0, 0), "low"] == avg.loc[(0, 0), "high"] == 0.0  # the same in every map: no spread
    assert avg.loc[(0, 1), "repair_share"] == pytest.approx(1 / 3) and (avg["n"] == 3).all()


def test_identical_sets_agree_beyond_the_null_and_random_sets_do_not():
    assert jaccard([(0, 1), (2, 0)], [(2, 0)]) == 0.5
    same = set_agreement([[(3, 1), (4, 0)]] * 8, 48, n_perm=500, seed=0)
    assert same["jaccard"] == 1.0 and same["p"] < 0.01 and same["null"] < 0.1
    rng = np.random.default_rng(1)
    drawn = [[(int(k) // 2, int(k) % 2) for k in rng.choice(48, 2, replace=False)] for _ in range(8)]
    rand = set_agreement(drawn, 48, n_perm=500, seed=0)
    assert rand["p"] > 0.05
    assert math.isnan(set_agreement([[(0, 0)]], 48)["jaccard"])


def test_minimal_sizes_count_failures_with_and_without_a_set():
    maps = [_map([[0.0]], [(0, 0)]), _map([[0.0]], [(0, 0), (1, 0), (2, 0)]), _map([[0.0]], None, every="wrong"),
            _map([[0.0]], [], failure=False)]
    s = minimal_sizes(maps)
    assert s == {"failures": 3, "with_set": 2, "without_set": 1, "median": 2.0, "min": 1, "max": 3}


def test_the_finding_is_written_from_the_numbers():
    maps = [_map([[0.0, 1.0], [0.2, 0.0]], [(0, 1)]), _map([[0.0, 0.8], [0.4, 0.0]], [(0, 1)])]
    avg = averaged_map(maps, n_boot=200, seed=0)
    text = restore_map_finding("snapkv", 0.9, avg, minimal_sizes(maps),
                               {"sets": 2, "jaccard": 1.0, "null": 0.02, "null_q95": 0.1, "p": 0.001})
    assert text.startswith("snapkv at α = 0.9, 2 failures: restoring the answer in slot 0.1 alone recovers 0.90")
    assert "median 1 slots, range 1–1" in text and "agree across instances more than chance" in text


def test_one_map_has_no_interval_and_the_finding_says_so():
    avg = averaged_map([_map([[0.0, 0.6]], None, every="wrong")], n_boot=50)
    assert avg["low"].isna().all() and avg["high"].isna().all()
    text = restore_map_finding("knorm", 0.5, avg, minimal_sizes([_map([[0.0, 0.6]], None, every="wrong")]),
                               {"jaccard": math.nan})
    assert "1 failure: restoring the answer in slot 0.1 alone recovers 0.60 of" in text
    assert "one failure gives no interval" in text and "None of the 1 failures is repaired" in text


def test_the_report_parts_group_by_press_and_ratio_and_draw_the_map():
    import pandas as pd

    from kvroute.report.restore_map import restore_map_figure, restore_map_groups, restore_map_html

    maps = [_map([[0.0, 1.0], [0.2, 0.0]], [(0, 1)]), _map([[0.0, 0.5], [0.4, 0.0]], [(0, 1)]),
            _map([[0.0, 0.0], [0.0, 0.0]], None, failure=False)]  # not a failure: left out
    groups = restore_map_groups(maps, pd.DataFrame({"press": ["none"]}), n_boot=100, seed=0)
    assert len(groups) == 1 and len(groups[0]["maps"]) == 2 and groups[0]["retrieval"] is None
    parts = restore_map_html(groups)
    assert "slot 0.1 alone recovers 0.75" in parts["findings"] and "<table" in parts["table"]
    fig = restore_map_figure(groups)
    assert fig is not None and len(fig.axes) >= 2
    assert restore_map_figure([]) is None and restore_map_html([]) == {"findings": "", "table": ""}
