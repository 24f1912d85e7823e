"""The answer-type probe (a control that reads the question): macro-F1 under stratified cross-validation."""

import numpy as np
import pandas as pd
import pytest

from kvroute.analysis.common import AnalysisError
from kvroute.analysis.probe import linear_probe_macro_f1, probe_by_ratio


def _blobs(sep: float, n: int = 120, k: int = 3, seed: int = 0):
    rng = np.random.default_rng(seed)
    y = np.repeat(np.arange(k), n // k)
    centers = rng.normal(0, 1, (k, 5)) * sep
    return centers[y] + rng.normal(0, 1, (len(y), 5)), y


def test_separable_classes_give_macro_f1_near_one_and_noise_near_chance():
    X, y = _blobs(sep=10)
    mean, std = linear_probe_macro_f1(X, y)
    assert mean > 0.97 and std < 0.05
    X, y = _blobs(sep=0)
    assert linear_probe_macro_f1(X, y)[0] < 0.55  # chance is 1/3
    assert linear_probe_macro_f1(X, y, seed=1) != linear_probe_macro_f1(X, y, seed=2)


def test_clear_errors_for_unusable_data():
    X, y = _blobs(sep=1)
    with pytest.raises(AnalysisError, match="at least 2 classes"):
        linear_probe_macro_f1(X, np.zeros(len(y)))
    y2 = y.copy()
    y2[:3] = 99  # a class with 3 members cannot fill 5 folds
    with pytest.raises(AnalysisError, match="too few samples per class"):
        linear_probe_macro_f1(X, y2)
    with pytest.raises(AnalysisError, match="2-D"):
        linear_probe_macro_f1(X[:, 0], y)
    with pytest.raises(AnalysisError, match="labels"):
        linear_probe_macro_f1(X, y[:-1])


def test_probe_by_ratio_runs_per_group_and_notes_failures():
    X, y = _blobs(sep=10, n=60)
    rows = [{"model": "m", "press": "p", "instance_id": str(i), "ratio": r, "probe_features": X[i].tolist(),
             "answer_type": f"t{y[i]}", "exact": 1.0} for i in range(60) for r in (0.0, 0.5)]
    rows += [{"model": "m", "press": "p", "instance_id": "z", "ratio": 0.9, "probe_features": [0.0] * 5,
              "answer_type": "t0", "exact": 0.0}]
    out = probe_by_ratio(pd.DataFrame(rows)).set_index("ratio")
    assert out.loc[0.0, "macro_f1"] > 0.95 and out.loc[0.0, "accuracy"] == 1.0
    assert np.isnan(out.loc[0.9, "macro_f1"]) and "2 classes" in out.loc[0.9, "note"]
    assert probe_by_ratio(pd.DataFrame(rows).drop(columns="probe_features")).empty


def test_probe_by_ratio_leaves_out_rare_classes_and_says_so():
    X, y = _blobs(sep=10, n=60)
    labels = [f"t{v}" for v in y]
    labels[0] = "rare"
    df = pd.DataFrame({"model": "m", "press": "p", "instance_id": [str(i) for i in range(60)], "ratio": 0.0,
                       "probe_features": [x.tolist() for x in X], "answer_type": labels})
    row = probe_by_ratio(df).iloc[0]
    assert row.n_classes == 3 and row.macro_f1 > 0.95 and "rare (1)" in row.note


@pytest.mark.statistical
def test_the_type_probe_is_a_control_blind_to_evidence_loss_that_the_identity_probe_sees():
    """The issue's case: with every evidence token evicted the question still gives the type away (type
    probe ≈ 1), but nothing says which value is the answer (identity at chance)."""
    from kvroute.analysis.probe import identity_by_ratio

    rng = np.random.default_rng(7)
    n, L = 60, 10
    X, y = _blobs(sep=10, n=n)  # the question's wording: decodable type at every ratio
    rows = []
    for ratio, margin in ((0.0, 2.0), (0.95, 0.0)):  # α = 0.95: the gold's lens margin is gone
        for i in range(n):
            cands = rng.normal(-9, 2, (1, L)) + rng.normal(0, 1, (3, L))
            cands[0, L // 2:] += margin
            rows.append({"model": "m", "press": "anti_oracle", "regime": "agnostic", "ratio": ratio,
                         "instance_id": str(i), "probe_features": X[i].tolist(), "answer_type": f"t{y[i]}",
                         "lens_candidates": cands.tolist(), "unanswerable": False})
    df = pd.DataFrame(rows)
    control = probe_by_ratio(df).set_index("ratio")
    ident = identity_by_ratio(df, n_boot=300).set_index("ratio")
    assert control.loc[0.95, "macro_f1"] > 0.95  # the control cannot see it
    assert ident.loc[0.0, "accuracy_low"] > ident.loc[0.0, "chance"] + 0.2
    assert ident.loc[0.95, "accuracy_low"] <= ident.loc[0.95, "chance"] <= ident.loc[0.95, "accuracy_high"]


@pytest.mark.statistical
def test_the_shared_baseline_gets_one_identity_reading_for_every_press():
    from kvroute.analysis.probe import identity_by_ratio

    rng = np.random.default_rng(3)
    rows = []
    for i in range(40):  # a weak gold signal in the last layer: which folds an item lands in matters
        cands = rng.normal(size=(2, 6))
        cands[0, -1] += 0.6
        base = {"model": "m", "regime": "agnostic", "instance_id": f"i{i}", "unanswerable": False,
                "lens_candidates": cands.tolist(), "exact": 0.0}
        rows.append({**base, "press": "none", "ratio": 0.0})
        for press in ("a", "b", "c"):
            rows.append({**base, "press": press, "ratio": 0.5,
                         "lens_candidates": (cands + rng.normal(scale=0.1, size=cands.shape)).tolist()})
    out = identity_by_ratio(pd.DataFrame(rows), n_boot=50)
    base = out[out["ratio"] == 0]
    assert sorted(base["press"]) == ["a", "b", "c"]
    # the same cells, so the same folds and the same reading (folds are not seeded by the press)
    assert base["accuracy"].nunique() == 1 and base["accuracy_low"].nunique() == 1
