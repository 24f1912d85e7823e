"""The answer-identity probe recovers planted truth: a gold signal is found, no signal reads as chance."""

from dataclasses import dataclass

import numpy as np
import pandas as pd
import pytest

from kvroute.analysis.common import AnalysisError
from kvroute.analysis.probe import (
    candidate_features,
    fit_conditional_logit,
    identity_by_ratio,
    identity_probe,
    identity_verdict,
    lens_profiles,
)


def _planted(n: int = 60, L: int = 12, signal: float = 0.0, layers: slice = slice(6, None), seed: int = 0):
    """Per instance ``[n_c, L]`` lens log-probs: a large shared (question) effect, noise, and +signal on the gold."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        n_c = int(rng.integers(2, 5))
        shared = rng.normal(-8, 3, L)  # what the question alone predicts: the same for every candidate
        x = shared + rng.normal(0, 1, (n_c, L))
        x[0, layers] += signal  # the gold is entry 0
        out.append(x)
    return out


@pytest.mark.statistical
def test_a_planted_gold_signal_is_found_well_above_chance():
    r = identity_probe(_planted(signal=1.5))
    assert r["chance"] == pytest.approx(np.mean([1 / m.shape[0] for m in _planted(signal=1.5)]))
    assert 0.3 < r["chance"] < 0.45
    assert r["accuracy"] > 0.8 and r["accuracy_low"] > r["chance"] + 0.2
    assert r["accuracy_low"] <= r["accuracy"] <= r["accuracy_high"]
    assert r["p_value"] < 1e-6
    assert r["untrained"] > r["chance"] + 0.2  # the signal reaches the last layer
    assert r["n"] == 60 and r["n_instances"] == 60 and r["folds"] == 5 and r["null_folds"] == 0


@pytest.mark.statistical
def test_no_signal_reads_as_chance_and_the_interval_covers_it():
    r = identity_probe(_planted(signal=0.0, seed=2))
    assert r["accuracy_low"] <= r["chance"] <= r["accuracy_high"]
    assert abs(r["accuracy"] - r["chance"]) < 0.15
    assert r["untrained_low"] <= r["chance"] <= r["untrained_high"]
    assert r["p_value"] > 0.01


@pytest.mark.statistical
def test_intervals_cover_chance_under_the_null_in_most_data_sets():
    runs = [identity_probe(_planted(n=40, signal=0.0, seed=s), n_boot=400, seed=s) for s in range(40)]
    covered = [r["accuracy_low"] <= r["chance"] <= r["accuracy_high"] for r in runs]
    false_alarm = [r["accuracy_low"] > r["chance"] for r in runs]
    assert np.mean(covered) >= 0.85 and np.mean(false_alarm) <= 0.1


@pytest.mark.statistical
def test_signal_only_in_early_layers_is_invisible_to_the_untrained_readout_but_not_to_the_probe():
    r = identity_probe(_planted(signal=2.0, layers=slice(0, 4), seed=2))
    assert r["accuracy_low"] > r["chance"] + 0.2
    assert r["untrained_low"] <= r["chance"] <= r["untrained_high"]


def test_identical_candidates_earn_exactly_chance_whatever_the_order():
    items = [np.tile(np.arange(8.0), (k, 1)) for k in (2, 3, 4, 2, 3, 4, 2, 3, 4, 2)]
    r = identity_probe(items)
    assert r["accuracy"] == pytest.approx(r["chance"]) and r["untrained"] == pytest.approx(r["chance"])
    assert r["null_folds"] == 5


@pytest.mark.statistical
def test_the_probe_is_blind_to_what_all_candidates_share():
    """A shift common to every candidate of an instance (the question's effect) changes nothing."""
    items = _planted(signal=1.0, seed=3)
    rng = np.random.default_rng(9)
    shifted = [m + rng.normal(0, 50, m.shape[1]) for m in items]
    a, b = identity_probe(items), identity_probe(shifted)
    assert a["accuracy"] == pytest.approx(b["accuracy"]) and a["untrained"] == pytest.approx(b["untrained"])


@pytest.mark.parametrize("nonnegative", [True, False])
def test_the_conditional_logit_recovers_the_planted_direction(nonnegative):
    rng = np.random.default_rng(4)
    w_true = np.array([0.0, 0.0, 2.0, 1.0])
    feats = []
    for _ in range(400):
        x = rng.normal(0, 1, (3, 4))
        p = np.exp(x @ w_true)
        p /= p.sum()
        gold = rng.choice(3, p=p)
        feats.append(np.vstack([x[gold], np.delete(x, gold, 0)]))
    w = fit_conditional_logit(feats, l2=0.1, nonnegative=nonnegative)
    assert np.allclose(w, w_true, atol=0.35)


@pytest.mark.statistical
def test_a_gold_the_model_disfavours_is_not_decoded_as_the_answer():
    """anti_oracle's pattern: the gold's mentions are evicted, the distractors' kept, so the gold is the
    *least* likely value. The probe reads only "more likely", so it stays at (or below) chance; an
    unbounded one would learn the inversion and look as if it read the answer."""
    items = _planted(signal=-2.0, seed=6)
    r = identity_probe(items)
    assert r["accuracy"] < r["chance"] + 0.05 and r["accuracy_low"] < r["chance"] and r["untrained"] < r["chance"]
    assert identity_probe(items, nonnegative=False)["accuracy_low"] > r["chance"] + 0.2


def test_candidate_features_bin_the_depth_and_centre_over_candidates():
    m = np.arange(12.0).reshape(2, 6)
    f = candidate_features(m, bins=3)
    assert f.shape == (2, 3)
    assert np.allclose(f, [[-3, -3, -3], [3, 3, 3]])
    assert candidate_features(m, bins=10).shape == (2, 6)


def test_unusable_input_is_refused_clearly():
    with pytest.raises(AnalysisError, match="no items"):
        identity_probe([])
    with pytest.raises(AnalysisError, match="n_candidates ≥ 2"):
        identity_probe([np.zeros((1, 4))] * 10)
    with pytest.raises(AnalysisError, match="too few instances"):
        identity_probe(_planted(n=4))
    with pytest.raises(AnalysisError, match="NaN"):
        identity_probe([np.full((2, 3), np.nan)] * 10)
    with pytest.raises(AnalysisError, match="layer counts"):
        identity_probe([np.zeros((2, 3))] * 5 + [np.zeros((2, 4))] * 5)


@pytest.mark.statistical
def test_folds_never_split_an_instance():
    """Two rows per instance (two seeds): the second copy of an instance never trains its own test fold."""
    items = _planted(n=30, signal=0.0, seed=5)
    # a lookup-table leak: each instance's copy is identical, so a fold that trained on it could memorise
    r = identity_probe(items + items, groups=list(range(30)) * 2)
    assert r["n"] == 60 and r["n_instances"] == 30
    assert r["accuracy_low"] <= r["chance"] <= r["accuracy_high"]


def _records(signal_by_ratio: dict[float, float], n: int = 48, seed: int = 0) -> pd.DataFrame:
    rows = []
    for ratio, signal in signal_by_ratio.items():
        for i, m in enumerate(_planted(n=n, signal=signal, seed=seed + int(ratio * 100))):
            rows.append({"model": "m", "press": "none" if ratio == 0 else "p", "regime": "agnostic", "ratio": ratio,
                         "instance_id": f"i{i}", "unanswerable": False, "exact": float(signal > 0),
                         "lens_candidates": m.tolist(), "lens_candidates_dropped": 0,
                         "lens_gold_logprob": m[0].tolist(), "lens_gold_rank": [0.0] * 6 + [5.0] * 6,
                         "lens_gold_logprob_final": float(m[0, -1]), "lens_gold_rank_final": 5})
    last = rows[-1]  # one unanswerable item and one whose distractors all shared the gold's first token
    rows.append({**last, "instance_id": "u", "unanswerable": True})
    rows.append({**last, "instance_id": "one", "lens_candidates": [last["lens_candidates"][0]],
                 "lens_candidates_dropped": 2})
    return pd.DataFrame(rows)


def test_identity_by_ratio_separates_usable_from_destroyed_evidence_and_counts_exclusions():
    out = identity_by_ratio(_records({0.0: 1.5, 0.9: 0.0}), n_boot=300).set_index("ratio")
    assert set(out.index) == {0.0, 0.9} and (out["press"] == "p").all()  # the baseline starts the press's curve
    base, gone = out.loc[0.0], out.loc[0.9]
    assert base.accuracy_low > base.chance + 0.2
    assert gone.accuracy_low <= gone.chance <= gone.accuracy_high
    assert base.n == 48 and base.n_excluded_unanswerable == 0 and base.exact == pytest.approx(1.0)
    assert gone.n == 48 and gone.n_excluded_unanswerable == 1 and gone.n_excluded_no_distractor == 1
    assert gone.n_candidates_dropped == 2 and base.lens_top1 == 0.0
    assert 2 <= base.mean_candidates <= 4 and base.note == ""
    assert base.verdict == "above chance" and gone.verdict.startswith("at chance")  # 48 instances: it decides
    assert identity_by_ratio(_records({0.0: 1.0}).drop(columns="lens_candidates")).empty


def test_the_identity_verdict_cannot_decide_below_its_instance_floor():
    """The table's verdict says what the finding says: below 30 instances the interval is not trusted however far
    from chance it lies (planted coverage 0.79 at 19 instances); the permutation null's line, when there, is the
    line the interval must clear."""
    clear = {"accuracy_low": 0.9, "accuracy_high": 0.95, "chance": 0.33, "null_high": 0.5}
    assert identity_verdict({**clear, "n_instances": 19}) == "cannot decide: 19 instances (fewer than 30)"
    assert identity_verdict({**clear, "n_instances": 30}) == "above chance"
    assert identity_verdict({**clear, "n_instances": 64, "accuracy_low": 0.45}).startswith("at chance")  # ≤ null
    assert identity_verdict({**clear, "n_instances": 64, "accuracy_low": 0.45, "null_high": float("nan")}) == (
        "above chance")  # against the analytic chance 0.33
    assert identity_verdict({**clear, "n_instances": float("nan")}) == ""  # the probe did not run
    small = identity_by_ratio(_records({0.0: 1.5}, n=19), n_boot=100).iloc[0]
    assert small.accuracy_low > small.chance and small.verdict.startswith("cannot decide: 19 instances")


def test_identity_by_ratio_notes_a_group_it_cannot_probe():
    df = _records({0.5: 1.0}, n=3)
    row = identity_by_ratio(df).iloc[0]
    assert np.isnan(row.accuracy) and "too few instances" in row.note


def test_identity_by_ratio_reads_json_text_from_csv_exports():
    df = _records({0.5: 1.5})
    a = identity_by_ratio(df, n_boot=200).iloc[0]
    df["lens_candidates"] = [None if v is None else __import__("json").dumps(v) for v in df["lens_candidates"]]
    b = identity_by_ratio(df, n_boot=200).iloc[0]
    assert a.accuracy == b.accuracy and a.n == b.n


def test_lens_profiles_average_per_layer():
    prof = lens_profiles(_records({0.5: 1.0}, n=10))
    assert list(prof["layer"]) == list(range(1, 13))
    assert (prof.loc[prof.layer <= 6, "top1"] == 1).all() and (prof.loc[prof.layer > 6, "top1"] == 0).all()
    assert prof["n"].iloc[0] == 12


# ---- candidate values and their first in-context tokens ----------------------------------------------

class _WordTokenizer:
    """Word-level stand-in: one id per whitespace-separated word, ids assigned on first sight."""

    def __init__(self) -> None:
        self.vocab: dict[str, int] = {}

    def __call__(self, text: str, add_special_tokens: bool = False) -> dict[str, list[int]]:
        return {"input_ids": [self.vocab.setdefault(w, len(self.vocab)) for w in text.split()]}


@dataclass
class _Prompt:
    question_text: str
    question_ids: list[int]


@dataclass
class _Instance:
    answers: tuple[str, ...]
    distractors: tuple[str, ...]
    unanswerable: bool = False


def test_candidates_are_the_gold_then_distinguishable_distractors():
    from kvroute.metrics.representation import answer_candidates
    from kvroute.tasks.prompt import answer_ids

    tok = _WordTokenizer()
    q = "Which event did she attend? Answer:"
    prompt = _Prompt(q, tok(q)["input_ids"])
    inst = _Instance(("Salt Race",), ("Salt Regatta", "Driftwood Parade", "salt race", "Driftwood Fair"))
    c = answer_candidates(tok, prompt, inst)
    assert c.texts == ("Salt Race", "Driftwood Parade")  # "salt race" is the gold, normalised
    assert c.dropped == ("Salt Regatta", "Driftwood Fair")  # first tokens taken by the gold / "Driftwood Parade"
    assert c.ids == (tok.vocab["Salt"], tok.vocab["Driftwood"])
    assert answer_ids(tok, prompt, "Salt Race") == [tok.vocab["Salt"], tok.vocab["Race"]]
    assert answer_candidates(tok, prompt, inst, gold_ids=[99, 100]).ids[0] == 99
    unans = answer_candidates(tok, prompt, _Instance(("I don't know",), ("Salt Race",), unanswerable=True))
    assert unans.texts == ("I don't know", "Salt Race")


def test_identity_credit_splits_ties():
    from kvroute.metrics.representation import identity_credit

    assert identity_credit([1.0, 0.0, 0.5]) == 1.0
    assert identity_credit([0.0, 1.0]) == 0.0
    assert identity_credit([1.0, 1.0, 0.0]) == 0.5


# ---- failure modes found on SmolLM2-135M (mask controls): a fitted probe below chance, below its own readout --

@pytest.mark.statistical
def test_a_likelihood_favoured_but_mostly_wrong_direction_does_not_put_the_probe_below_chance():
    """The gold is usually a little behind its distractor and now and then far ahead: the likelihood
    wants a positive weight whose argmax is wrong most of the time. Fitted by likelihood alone, the
    probe scored well below chance out of fold; it must abstain (read chance) instead."""
    rng = np.random.default_rng(11)
    items = []
    for _ in range(60):
        x = rng.normal(-8, 3, 12) + rng.normal(0, 0.05, (2, 12))
        x[0] += 4.0 if rng.random() < 0.3 else -0.3
        items.append(x)
    r = identity_probe(items)
    assert r["untrained"] < r["chance"] - 0.1  # the readout really is below chance: nothing to find
    assert r["accuracy"] >= r["chance"] - 0.02
    assert r["accuracy_low"] <= r["chance"] <= r["accuracy_high"]


@pytest.mark.statistical
def test_a_signal_only_in_the_last_layer_is_read_at_least_as_well_as_the_untrained_readout():
    """SmolLM2's pattern: the gold's first token is a priori less likely (every layer but the last),
    and only the last layer prefers it. The probe must not be worse than its own special case, the
    last-layer readout (an average over the top layers cancels the signal)."""
    items = _planted(signal=-1.0, layers=slice(0, 11), seed=12)
    for m in items:
        m[0, -1] += 3.0
    r = identity_probe(items)
    assert r["untrained"] > r["chance"] + 0.3
    assert r["accuracy"] >= r["untrained"] - 0.05 and r["accuracy_low"] > r["chance"] + 0.2


@pytest.mark.parametrize(("signal", "nonnegative", "golden"), [
    # (accuracy, accuracy_low, accuracy_high, p_value, null_folds), computed with the probe as it was
    # before its solver was batched (scipy L-BFGS-B, one fit at a time); these sets choose the fit at
    # L2 = 10 and 1, the last-layer readout and the null among them
    (0.6, True, (0.5833333333333334, 0.43333333333333335, 0.7333333333333333, 4.413550395094536e-05, 0)),
    (0.35, True, (0.4402777777777777, 0.3214930555555555, 0.5847916666666666, 0.06114413857252323, 1)),
    (0.35, False, (0.48333333333333334, 0.36666666666666664, 0.6166666666666667, 0.011904375158718051, 0)),
])
def test_the_identity_probe_reads_the_same_as_before_its_solver_was_batched(signal, nonnegative, golden):
    items = _planted(n=60, signal=signal, layers=slice(0, 4), seed=7)  # two rows per instance
    r = identity_probe(items, groups=[i // 2 for i in range(60)], seed=3, n_boot=500, nonnegative=nonnegative)
    got = (r["accuracy"], r["p_value"], r["null_folds"])
    assert got == pytest.approx((golden[0], golden[3], golden[4]), rel=1e-9, abs=1e-12)
    # the interval is no longer the bootstrap of the fixed out-of-fold credits (golden[1:3]) but of the whole
    # procedure, refitted and gated in every replicate: it still holds the estimate, and is no narrower
    assert r["accuracy_low"] <= r["accuracy"] <= r["accuracy_high"]
    assert r["accuracy_high"] - r["accuracy_low"] >= 0.9 * (golden[2] - golden[1])


def test_identity_by_ratio_prefers_the_sequence_lens_and_falls_back_to_the_first_token_lens():
    informative, flat = _records({0.5: 1.5}), _records({0.5: 0.0})
    df = flat.copy()
    df["lens_candidates_seq"] = informative["lens_candidates"]  # the whole sequences tell the gold apart
    seq = identity_by_ratio(df, n_boot=200).iloc[0]
    assert seq.input == "lens_candidates_seq" and seq.accuracy_low > seq.chance + 0.2
    assert seq.n_candidates_dropped == 0  # the sequence lens drops no candidate
    first = identity_by_ratio(df, "lens_candidates", n_boot=200).iloc[0]
    assert first.input == "lens_candidates" and first.accuracy_low <= first.chance <= first.accuracy_high
    # a store made before the sequence lens (the column absent, or all null) reads the first-token lens
    old = identity_by_ratio(df.assign(lens_candidates_seq=None), n_boot=200).iloc[0]
    assert old.input == "lens_candidates" and old.accuracy == first.accuracy


def _readout(rng: np.random.Generator, n: int, acc: float) -> list[np.ndarray]:
    """Two candidates per item; the last four layers name the gold with probability ``acc`` (a planted readout)."""
    items = []
    for _ in range(n):
        m = rng.normal(size=(2, 30)) * 0.1
        wins = rng.random() < acc
        m[0 if wins else 1, -4:] += abs(rng.normal()) + 0.5
        items.append(m)
    return items


def test_an_abstaining_probe_never_prints_a_zero_width_interval():
    # the estimator review's finding: with no readout past the gate every item earns exactly 1/n, and a bootstrap
    # of those fixed credits read "0.50 [0.50, 0.50]"; refitting the whole procedure in each replicate does not
    from kvroute.analysis.probe import _bootstrap_mean

    items = _readout(np.random.default_rng(5), 19, 0.5)
    r = identity_probe(items, seed=1)
    assert r["null_folds"] >= 4 and abs(r["accuracy"] - 0.5) < 0.1  # (nearly) every fold abstains
    assert r["accuracy_high"] - r["accuracy_low"] > 0.05
    fixed = _bootstrap_mean(np.full(19, 0.5), np.arange(19).astype(str), 200, 0.95, np.random.default_rng(0))
    assert fixed == (0.5, 0.5)  # the mutation: the former interval, over the fixed credits, has zero width


@pytest.mark.statistical
def test_a_planted_readout_is_covered_by_the_whole_procedure_interval():
    rng = np.random.default_rng(6)
    covered = [(r["accuracy_low"] <= 0.65 <= r["accuracy_high"])
               for r in (identity_probe(_readout(rng, 64, 0.65), seed=s) for s in range(16))]
    assert np.mean(covered) >= 0.8  # 0.925 over 40 sets; 16 here
    null = identity_probe(_readout(rng, 64, 0.5), seed=99)
    assert null["null_accuracy"] == pytest.approx(0.5, abs=0.02) and null["p_permutation"] > 0.05
