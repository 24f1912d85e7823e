"""The analysis by turn on planted conversations: a planted later-turn loss is found, hard questions that fail
uncompressed at one turn are not mistaken for one, and the ingredient that guards against them is needed.

A planted conversation has three questions over one context. Each question is *hard* with a probability set per
turn (it fails at every ratio, the full cache included) or *easy*: it fails exactly above a threshold ratio drawn
per question — from the same distribution at every turn, or lowered by ``shift`` at the later turns (the planted
loss). The cells are those a sweep writes: the ``none`` baseline at ratio 0, and the press at each ratio.
"""

import numpy as np
import pandas as pd
import pytest

import kvroute.analysis.turns as turns_mod
from kvroute.analysis.common import AnalysisError
from kvroute.analysis.turns import has_turns, turn_alpha_text, turn_cliffs, turn_curves, turn_pairs

RATIOS = (0.0, 0.25, 0.5, 0.7, 0.8, 0.9)


def planted(n=48, *, hard=(0.1, 0.1, 0.1), shift=0.0, seed=0, press="p"):
    rng = np.random.default_rng(seed)
    rows = []
    for c in range(n):
        for t in (1, 2, 3):
            iid = f"c{c}t{t}"
            is_hard = rng.random() < hard[t - 1]
            threshold = rng.uniform(0.55, 0.95) - (shift if t > 1 else 0.0)
            for r in RATIOS:
                fail = bool(is_hard or (r > 0 and r > threshold))
                rows.append({"model": "m", "press": "none" if r == 0 else press, "ratio": r, "regime": "agnostic",
                             "seed": 0, "instance_id": iid, "family": "base", "conversation": f"c{c}", "turn": t,
                             "turns": 3, "hallucinated": fail, "outcome": "fabricated" if fail else "correct",
                             "ger_evidence": min(1.0, r * 0.8 + 0.05 * t), "status": "ok"})
    return pd.DataFrame(rows)


def test_a_planted_later_turn_loss_is_found():
    pairs = turn_pairs(planted(shift=0.2), n_boot=500)
    assert set(pairs["turn"]) == {2, 3}
    assert pairs["decided"].all() and (pairs["difference"] > 0).all()
    assert all("the later turn loses more to compression" in f for f in pairs["finding"])
    assert (pairs["difference_low"] > 0).all()


def test_no_planted_loss_is_not_decided_across_datasets():
    """Size: turns planted equal are called different in at most a few of 20 datasets (Holm, α = 0.05)."""
    calls = sum(int(turn_pairs(planted(seed=s), n_boot=400)["decided"].any()) for s in range(20))
    assert calls <= 2


def _confounded(seed):
    # turn 3's questions are far harder uncompressed (60% fail with the full cache); compression does the same
    return planted(hard=(0.05, 0.05, 0.6), seed=seed)


def test_hard_questions_at_one_turn_are_not_a_turn_effect():
    calls = [turn_pairs(_confounded(s), n_boot=400) for s in range(10)]
    assert sum(int(p["decided"].any()) for p in calls) <= 1
    assert all("cannot decide" in f for f in calls[0]["finding"])


def test_without_the_caused_view_hard_questions_become_a_turn_effect(monkeypatch):
    """Mutation: drop the guard (every question counted, hard ones included) and the confounded turn is decided."""
    monkeypatch.setattr(turns_mod, "caused_view", lambda df: df)
    calls = [turn_pairs(_confounded(s), n_boot=400) for s in range(10)]
    assert sum(int(p.loc[p["turn"] == 3, "decided"].any()) for p in calls) >= 8


def test_few_conversations_cannot_decide():
    pairs = turn_pairs(planted(n=6, shift=0.3), n_boot=300, min_instances=10)
    assert not pairs["decided"].any()
    assert all("only" in f and "fewer than 10" in f for f in pairs["finding"])


def test_curves_and_alpha_by_turn():
    df = planted(shift=0.2)
    assert has_turns(df) and not has_turns(df.assign(turn=1))
    curves = turn_curves(df, n_boot=200)
    assert set(curves["turn"]) == {1, 2, 3}
    row = curves[(curves["turn"] == 3) & (curves["ratio"] == 0.9)].iloc[0]
    assert row["n_conversations"] == 48 and row["h_low"] <= row["h"] <= row["h_high"]
    assert row["ger_evidence"] == pytest.approx(0.9 * 0.8 + 0.15)
    cliffs = turn_cliffs(df, n_boot=200)
    a = cliffs.set_index("turn")["alpha_star"]
    assert a[1] > a[3]  # the planted loss moves the cliff to lower ratios at later turns
    lines = turn_alpha_text(cliffs)
    assert len(lines) == 1 and "turn 1: α*" in lines[0] and "turn 3: α*" in lines[0]


def test_records_without_later_turns_say_why():
    with pytest.raises(AnalysisError, match="turn 1 and a later turn"):
        turn_pairs(planted()[lambda d: d["turn"] == 1])


def test_the_report_section_quotes_the_analysis(tmp_path):
    import html

    from kvroute.analysis.settings import AnalysisConfig
    from kvroute.report.build import build_report

    df = planted(shift=0.2)
    cfg = AnalysisConfig()
    pairs = turn_pairs(df, n_boot=cfg.n_boot, confidence=cfg.confidence, seed=cfg.seed,
                       min_instances=cfg.league_min_instances)
    page = html.unescape(build_report(df, tmp_path).read_text(encoding="utf-8"))
    assert "Compress once, ask many: what later turns lose" in page
    flat = " ".join(page.split())
    assert all(f in flat for f in pairs["finding"])


# --- the other sections read turn 1 only ----------------------------------------------------------------------------

def _cliff(df):
    from kvroute.analysis.settings import AnalysisConfig
    from kvroute.analysis.summary import run_analysis

    a = run_analysis(df, AnalysisConfig(n_boot=200))
    return a, a.tables["cliffs"].set_index("press")


def test_every_section_but_the_turns_reads_turn_one_only():
    """Later turns (planted to lose more) change no estimate outside the turn analysis, which still sees them."""
    df = planted(shift=0.3)
    a, cliff = _cliff(df)
    _, alone = _cliff(df[df["turn"] == 1])
    pd.testing.assert_frame_equal(cliff, alone)
    assert "turn_pairs" in a.tables and set(a.tables["turn_pairs"]["turn"]) == {2, 3}
    assert "later turns" not in a.summary["notes"] and "read by the turn analysis only" in a.summary["notes"][
        "later_turns"]


def test_without_the_turn_one_view_later_turns_move_the_cliff(monkeypatch):
    """Mutation: pool every turn into the other sections and the planted later-turn loss moves α*."""
    import kvroute.analysis.summary as summary_mod

    monkeypatch.setattr(summary_mod, "first_turns", lambda df: df)
    df = planted(shift=0.3)
    _, pooled = _cliff(df)
    monkeypatch.undo()
    _, alone = _cliff(df[df["turn"] == 1])
    assert pooled.loc["p", "alpha_star"] < alone.loc["p", "alpha_star"] - 0.05
