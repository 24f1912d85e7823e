"""Failure decomposition (erasure / retained / undefined GER) and the GER-matched rigidity comparison."""

import numpy as np
import pandas as pd
import pytest

from kvroute.analysis.decomposition import failure_decomposition, failure_mask, rigidity_comparison


def _cell(i, *, outcome, f1, ger_all, ger, cons, ratio=0.9, **extra):
    return {"model": "m", "press": "p", "instance_id": f"i{i}", "ratio": ratio, "outcome": outcome,
            "hallucinated": outcome in ("distractor", "fabricated"), "f1": f1,
            "ger_all_layers": ger_all, "ger": ger, "consensus_nosink": cons, "rho_nosink": [1 - c for c in cons],
            **extra}


def _hand_built() -> pd.DataFrame:
    cells = []
    # 4 erasure failures: hallucinated, answer globally evicted
    cells += [_cell(i, outcome="distractor", f1=0.0, ger_all=1.0, ger=1.0, cons=[0.5, 0.5]) for i in range(4)]
    # 2 retained failures (hallucinated) and 1 retained failure that is not a hallucination (a partial
    # answer), all in the GER bin [0.4, 0.6)
    cells += [_cell(i, outcome="fabricated", f1=0.0, ger_all=0.3, ger=0.5, cons=[0.2, 0.2]) for i in range(4, 6)]
    cells += [_cell(6, outcome="partial", f1=0.2, ger_all=0.0, ger=0.45, cons=[0.2, 0.2])]
    # 3 successes: two in the same GER bin, one in another bin that matching must ignore
    cells += [_cell(i, outcome="correct", f1=1.0, ger_all=0.0, ger=0.5, cons=[0.6, 0.6]) for i in range(7, 9)]
    cells += [_cell(9, outcome="correct", f1=1.0, ger_all=0.0, ger=0.05, cons=[1.0, 1.0])]
    return pd.DataFrame(cells)


def _with_undefined_and_sentences() -> pd.DataFrame:
    """The hand-built cells plus cells the old rules got wrong."""
    extra = [
        # correct sentence answers containing the gold: F1 0.31-0.40, not failures (low GER bin 0)
        _cell(10, outcome="correct", f1=0.33, ger_all=0.0, ger=0.1, cons=[0.9, 0.9]),
        _cell(11, outcome="correct", f1=0.38, ger_all=0.0, ger=0.1, cons=[0.9, 0.9]),
        # failures whose GER is undefined: an unanswerable item (NaN GER) and an answer that does not occur
        # in the context (evidence "none"; a stale GER value must not count)
        _cell(12, outcome="fabricated", f1=0.0, ger_all=np.nan, ger=np.nan, cons=[0.1, 0.1], evidence="located"),
        _cell(13, outcome="distractor", f1=0.0, ger_all=0.0, ger=0.0, cons=[0.1, 0.1], evidence="none"),
        # an abstention on an answerable item is a failure even though it is no hallucination
        _cell(14, outcome="abstained", f1=0.0, ger_all=0.2, ger=0.5, cons=[0.2, 0.2]),
        # a success whose GER is undefined must not join any GER bin
        _cell(15, outcome="correct", f1=1.0, ger_all=np.nan, ger=np.nan, cons=[0.0, 0.0]),
    ]
    df = pd.DataFrame([*_hand_built().to_dict("records"), *extra])
    df["evidence"] = df["evidence"].fillna("located")
    return df


def test_failure_shares_on_hand_built_records():
    df = _hand_built()
    assert failure_mask(df).sum() == 7
    d = failure_decomposition(df, n_boot=200).iloc[0]
    assert (d.n_cells, d.n_failures, d.n_erasure, d.n_retained, d.n_undefined) == (10, 7, 4, 3, 0)
    assert d.erasure_share == pytest.approx(4 / 7) and d.retained_share == pytest.approx(3 / 7)
    assert d.undefined_share == 0
    assert d.failure_rate == pytest.approx(0.7)
    assert d.erasure_rate + d.retained_rate + d.undefined_rate == pytest.approx(d.failure_rate)
    assert d.dominant == "erasure"
    # with "globally evicted" meaning ger_all_layers >= 0.3, the two hallucinated retained failures become erasure
    assert failure_decomposition(df, ger_threshold=0.3, n_boot=50).iloc[0].n_erasure == 6


def test_failure_is_the_outcome_not_an_f1_threshold():
    df = _with_undefined_and_sentences()
    fail = failure_mask(df)
    assert not fail[df.instance_id.isin(["i10", "i11"])].any()  # correct sentence answers with F1 < 0.5
    assert fail[df.instance_id == "i14"].all()  # an abstention on an answerable item
    assert fail[df.instance_id == "i6"].all()  # partial
    # cells without an outcome (errored) are not scored at all
    unscored = pd.concat([df, df.iloc[[0]].assign(instance_id="i99", outcome=None)], ignore_index=True)
    assert failure_decomposition(unscored, n_boot=50).iloc[0].n_cells == len(df)


def test_undefined_ger_is_its_own_class_never_retained():
    d = failure_decomposition(_with_undefined_and_sentences(), n_boot=200).iloc[0]
    assert (d.n_cells, d.n_failures) == (16, 10)
    assert (d.n_erasure, d.n_retained, d.n_undefined) == (4, 4, 2)
    assert d.undefined_share == pytest.approx(0.2) and d.retained_share == pytest.approx(0.4)
    assert d.erasure_share + d.retained_share + d.undefined_share == pytest.approx(1)
    assert d.undefined_rate == pytest.approx(2 / 16)
    assert d.dominant == "tie"


def test_only_undefined_failures_are_reported_as_such():
    df = _with_undefined_and_sentences()
    d = failure_decomposition(df[df.instance_id.isin(["i7", "i12", "i13"])], n_boot=50).iloc[0]
    assert (d.n_failures, d.n_undefined, d.dominant) == (2, 2, "undefined")


def test_share_intervals_are_instance_clustered_and_cover_the_point():
    df = _with_undefined_and_sentences()
    d = failure_decomposition(df, n_boot=500, seed=3).iloc[0]
    for c in ("erasure", "retained", "undefined"):
        lo, hi = d[f"{c}_share_low"], d[f"{c}_share_high"]
        assert 0 <= lo <= d[f"{c}_share"] <= hi <= 1
        assert hi > lo
    assert d.undefined_share_low == 0  # two of ten failures: a replicate can draw neither
    again = failure_decomposition(df, n_boot=500, seed=3).iloc[0]
    assert again.erasure_share_low == d.erasure_share_low  # reproducible
    # an instance answered twice (two seeds, identical cells) is one cluster: the interval stays as
    # wide as the one for one cell per instance, while treating cells as independent would narrow it
    twice = pd.concat([df.assign(seed=0), df.assign(seed=1)], ignore_index=True)
    t = failure_decomposition(twice, n_boot=500, seed=3).iloc[0]
    assert t.erasure_share == pytest.approx(d.erasure_share)
    assert t.erasure_share_high - t.erasure_share_low == pytest.approx(d.erasure_share_high - d.erasure_share_low,
                                                                        abs=0.08)
    none = failure_decomposition(df[df.outcome == "correct"], n_boot=50).iloc[0]
    assert none.erasure_share is None and none.erasure_share_low is None


def test_rigidity_compares_with_successes_at_matched_ger():
    r = rigidity_comparison(_hand_built()).iloc[0]
    assert r.n_retained_failures == 3 and r.n_matched_failures == 3 and r.n_matched_successes == 2
    assert r.consensus_nosink_fail == pytest.approx(0.2) and r.consensus_nosink_success == pytest.approx(0.6)
    assert r.consensus_nosink_delta == pytest.approx(-0.4)  # the unmatched success (consensus 1.0) is ignored
    np.testing.assert_allclose(r.consensus_nosink_delta_layers, [-0.4, -0.4])
    assert r.rho_nosink_delta == pytest.approx(0.4)


def test_rigidity_leaves_out_undefined_ger_and_counts_correct_sentences_as_successes():
    r = rigidity_comparison(_with_undefined_and_sentences()).iloc[0]
    # retained failures: the 3 hand-built ones and the abstention; the undefined ones are not retained
    assert r.n_retained_failures == 4 and r.n_matched_failures == 4
    # successes in the failures' bin [0.4, 0.6): only the two hand-built ones — not the NaN-GER success
    # (consensus 0.0), which a GER of 0 would have put in bin 0 with the correct sentences
    assert r.n_matched_successes == 2
    assert r.consensus_nosink_fail == pytest.approx(0.2) and r.consensus_nosink_success == pytest.approx(0.6)


def test_no_failures_means_no_dominant_mode():
    df = _hand_built()
    ok = df[df.f1 == 1.0]
    assert failure_decomposition(ok, n_boot=50).iloc[0].dominant == "none"
    assert failure_decomposition(ok, n_boot=50).iloc[0].erasure_share is None


@pytest.mark.statistical
def test_summary_reports_the_outcome_rule_and_the_undefined_class():
    from kvroute.analysis.summary import AnalysisConfig, run_analysis
    from kvroute.analysis.synthetic import SyntheticSpec, synthetic_records

    with pytest.raises(TypeError):
        AnalysisConfig(f1_threshold=0.5)  # failure is the outcome; no F1 threshold is left to set
    recs = synthetic_records(SyntheticSpec(n_instances=30, families=("coreference",), long_context_lengths=()))
    assert recs.loc[recs.unanswerable, "ger_all_layers"].isna().all()  # synthetic unanswerable items: GER undefined
    a = run_analysis(recs, AnalysisConfig(n_boot=20))
    assert "outcome other than 'correct'" in a.summary["settings"]["failure"]
    assert "f1_threshold" not in a.summary["settings"]
    d = a.tables["decomposition"]
    top = d[d.ratio == d.ratio.max()]
    assert (top.n_undefined > 0).all()
    assert (top.n_erasure + top.n_retained + top.n_undefined == top.n_failures).all()
    for c in ("erasure", "retained", "undefined"):
        assert ((top[f"{c}_share_low"] <= top[f"{c}_share"]).all()
                and (top[f"{c}_share"] <= top[f"{c}_share_high"]).all())
