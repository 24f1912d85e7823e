"""Failure decomposition (erasure vs retained) and the GER-matched rigidity comparison."""

import numpy as np
import pandas as pd
import pytest

from kvroute.analysis.decomposition import failure_decomposition, failure_mask, rigidity_comparison


def _cell(i, *, h, f1, ger_all, ger, cons, ratio=0.9):
    return {"model": "m", "press": "p", "instance_id": f"i{i}", "ratio": ratio, "hallucinated": h, "f1": f1,
            "ger_all_layers": ger_all, "ger": ger, "consensus": cons, "rho": [1 - c for c in cons]}


def _hand_built() -> pd.DataFrame:
    cells = []
    # 4 erasure failures: hallucinated, answer globally evicted
    cells += [_cell(i, h=True, f1=0.0, ger_all=1.0, ger=1.0, cons=[0.5, 0.5]) for i in range(4)]
    # 2 retained failures (hallucinated) and 1 retained failure by low F1 only, all in the GER bin [0.4, 0.6)
    cells += [_cell(i, h=True, f1=0.0, ger_all=0.3, ger=0.5, cons=[0.2, 0.2]) for i in range(4, 6)]
    cells += [_cell(6, h=False, f1=0.2, ger_all=0.0, ger=0.45, cons=[0.2, 0.2])]
    # 3 successes: two in the same GER bin, one in another bin that matching must ignore
    cells += [_cell(i, h=False, f1=1.0, ger_all=0.0, ger=0.5, cons=[0.6, 0.6]) for i in range(7, 9)]
    cells += [_cell(9, h=False, f1=1.0, ger_all=0.0, ger=0.05, cons=[1.0, 1.0])]
    return pd.DataFrame(cells)


def test_failure_shares_on_hand_built_records():
    df = _hand_built()
    assert failure_mask(df).sum() == 7
    d = failure_decomposition(df).iloc[0]
    assert (d.n_cells, d.n_failures, d.n_erasure, d.n_retained) == (10, 7, 4, 3)
    assert d.erasure_share == pytest.approx(4 / 7) and d.retained_share == pytest.approx(3 / 7)
    assert d.failure_rate == pytest.approx(0.7)
    assert d.erasure_rate + d.retained_rate == pytest.approx(d.failure_rate)
    assert d.dominant == "erasure"
    # with an F1 threshold of 0.1, the F1-0.2 cell no longer counts as a failure
    assert failure_decomposition(df, f1_threshold=0.1).iloc[0].n_failures == 6
    # with "globally evicted" meaning ger_all_layers >= 0.3, the two hallucinated retained failures become erasure
    assert failure_decomposition(df, ger_threshold=0.3).iloc[0].n_erasure == 6


def test_rigidity_compares_with_successes_at_matched_ger():
    r = rigidity_comparison(_hand_built()).iloc[0]
    assert r.n_retained_failures == 3 and r.n_matched_failures == 3 and r.n_matched_successes == 2
    assert r.consensus_fail == pytest.approx(0.2) and r.consensus_success == pytest.approx(0.6)
    assert r.consensus_delta == pytest.approx(-0.4)  # the unmatched success (consensus 1.0) is ignored
    np.testing.assert_allclose(r.consensus_delta_layers, [-0.4, -0.4])
    assert r.rho_delta == pytest.approx(0.4)


def test_no_failures_means_no_dominant_mode():
    df = _hand_built()
    ok = df[df.f1 == 1.0]
    assert failure_decomposition(ok).iloc[0].dominant == "none"
    assert failure_decomposition(ok).iloc[0].erasure_share is None
