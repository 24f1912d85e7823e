"""The press league: planted cliffs come out in the right order, covered, and thin data is said to be undecided."""

import numpy as np
import pandas as pd
import pytest

from kvroute.analysis.common import AnalysisError
from kvroute.analysis.league import LEAGUE_COLUMNS, press_league
from kvroute.analysis.summary import AnalysisConfig, run_analysis
from kvroute.analysis.synthetic import SyntheticModel, SyntheticSpec, synthetic_records
from kvroute.report.league import league_html

pytestmark = pytest.mark.statistical  # planted-truth coverage over many simulated sets: `make test-fast` leaves it out

N_BOOT = 200
#: planted α* per press: base 0.85 plus the press offset; "flat" has its midpoint far past the grid (no cliff in range)
PLANTED = {"early+adakv": 0.6, "late+adakv": 0.85, "flat+adakv": 1.2}
SPEC = SyntheticSpec(models=(SyntheticModel("llama-like", 4, 4, "llama"),), presses=tuple(PLANTED),
                     press_offsets=tuple(a - 0.85 for a in PLANTED.values()), base_alpha_star=0.85,
                     families=("base",), long_context_lengths=(), n_instances=60, seed=3)
TINY = "tiny+adakv"


def _store() -> pd.DataFrame:
    """Synthetic records plus a press run on only 4 instances (a copy of the 0.85 press's cells)."""
    df = synthetic_records(SPEC)
    first = sorted(df["instance_id"].unique())[:4]
    tiny = df[(df["press"] == "late+adakv") & df["instance_id"].isin(first)].assign(press=TINY)
    return pd.concat([df, tiny], ignore_index=True)


@pytest.fixture(scope="module")
def store() -> pd.DataFrame:
    return _store()


@pytest.fixture(scope="module")
def league(store) -> pd.DataFrame:
    return press_league(store, n_boot=N_BOOT)


def _row(league: pd.DataFrame, press: str) -> dict:
    rows = league[league["press"] == press].to_dict(orient="records")
    assert len(rows) == 1, press
    return rows[0]


def test_the_planted_truth_is_what_the_spec_says():
    for i, a in enumerate(PLANTED.values()):
        assert SPEC.alpha_star(0, i) == pytest.approx(a)


def test_one_row_per_press_baseline_left_out(league):
    assert list(league.columns) == LEAGUE_COLUMNS
    assert sorted(league["press"]) == sorted([*PLANTED, TINY])  # "none" is the baseline, not a contender
    assert (league["family"] == "base").all() and (league["n_ratios"] == len(SPEC.ratios)).all()


def test_league_orders_presses_by_paired_comparison(league):
    ranked = league[league["rank"].notna()]
    # planted: no cliff in range < a cliff at 0.85 < a cliff at 0.6 in hallucination over the grid; 60 shared
    # instances decide every pair, so the ranks are 1, 2, 3 and each row says whom it beats
    assert list(ranked["press"]) == ["flat+adakv", "late+adakv", "early+adakv"]
    assert list(ranked["rank"]) == [1, 2, 3]
    assert (np.diff(ranked["area"].to_numpy(float)) > 0).all()
    assert _row(league, "flat+adakv")["rank_text"] == "beats early+adakv, late+adakv"
    assert _row(league, "early+adakv")["rank_text"] == "beaten by flat+adakv, late+adakv"
    for r in ranked.to_dict(orient="records"):
        assert r["safe_ratio"] < PLANTED[r["press"]], r  # a certified ratio sits below the planted cliff
    assert league["press"].iloc[-1] == TINY  # the unranked row comes last


def test_tied_presses_share_a_rank(store):
    """A copy of a press under another name cannot be told apart from it: one rank, each tied with the other."""
    twin = store[store["press"] == "late+adakv"].assign(press="twin+adakv")
    t = press_league(pd.concat([store, twin], ignore_index=True), n_boot=N_BOOT)
    assert _row(t, "late+adakv")["rank"] == _row(t, "twin+adakv")["rank"] == 2
    assert "tied with twin+adakv" in _row(t, "late+adakv")["rank_text"]
    assert _row(t, "early+adakv")["rank"] == 4  # beaten by three presses


def test_the_cliff_table_does_not_order_the_league(store):
    """Hand-built cliffs that would invert the order (early press safest, latest α*) change the α* and safe-ratio
    cells but not the ranks, which come from the paired comparison of the records; few instances stay unranked."""
    base = {"model": "llama-like", "regime": "agnostic", "family": "base", "n_instances": 60, "safe_ratio": 0.7,
            "alpha_star": None, "alpha_star_low": None, "alpha_star_high": None, "alpha_star_identified": None,
            "reason": "hand-built"}
    cliffs = pd.DataFrame([
        {**base, "press": "early+adakv", "status": "ok", "alpha_star": 0.6, "alpha_star_low": 0.55,
         "alpha_star_high": 0.65, "alpha_star_identified": "identified", "safe_ratio": 0.9},
        {**base, "press": "late+adakv", "status": "beyond_grid"},
        {**base, "press": "flat+adakv", "status": "no_cliff"},
        {**base, "press": TINY, "status": "ok", "alpha_star": 0.9, "safe_ratio": 0.9, "n_instances": 4},
        {**base, "press": "none", "status": "ok", "alpha_star": 0.95, "safe_ratio": 0.95},  # the baseline: not ranked
    ])
    t = press_league(store, cliffs=cliffs, within=pd.DataFrame(), n_boot=20)
    assert list(t["press"]) == ["flat+adakv", "late+adakv", "early+adakv", TINY]
    assert t["rank"].tolist()[:3] == [1, 2, 3] and pd.isna(t["rank"].iloc[3])
    assert _row(t, "late+adakv")["alpha_star_text"] == "beyond the tested range: hand-built"
    assert _row(t, "early+adakv")["alpha_star_text"] == "0.600 [0.550, 0.650]"
    assert _row(t, "early+adakv")["safe_ratio"] == 0.9
    assert _row(t, "early+adakv")["eviction_text"].startswith("– (no within-ratio GER test")


def test_alpha_star_intervals_cover_the_planted_midpoints(league):
    for press in ("early+adakv", "late+adakv"):
        r = _row(league, press)
        assert r["cliff_status"].startswith("ok") and r["alpha_star_identified"] == "identified", r
        assert r["alpha_star_low"] <= PLANTED[press] <= r["alpha_star_high"], r
        assert abs(r["alpha_star"] - PLANTED[press]) < 0.1, r  # 0.6 sits in the grid's 0.5–0.7 gap
        assert r["alpha_star_text"] == f"{r['alpha_star']:.3f} [{r['alpha_star_low']:.3f}, {r['alpha_star_high']:.3f}]"
    early, late = _row(league, "early+adakv"), _row(league, "late+adakv")
    assert early["alpha_star_high"] < late["alpha_star_low"]  # the two planted cliffs are told apart


def test_no_cliff_in_range_is_said_in_words_not_as_a_number(league):
    r = _row(league, "flat+adakv")
    assert pd.isna(r["alpha_star"]) and r["cliff_status"] == "no_cliff"
    assert r["alpha_star_text"].startswith("no cliff in the tested range")


def test_a_press_with_too_few_instances_is_undecided_and_unranked(league):
    r = _row(league, TINY)
    assert r["n_instances"] == 4 and not r["decided"] and pd.isna(r["rank"])
    for col in ("alpha_star_text", "safe_ratio_text", "ger_at_safe_text", "eviction_text"):
        assert r[col] == "undecided: only 4 instances (fewer than 10)", (col, r[col])  # words, no estimate


def test_ger_at_the_safe_ratio_is_the_mean_of_those_cells_with_an_interval(store, league):
    r = _row(league, "late+adakv")
    cells = store[(store["press"] == "late+adakv") & (store["ratio"] == r["safe_ratio"])]
    assert r["ger_at_safe"] == pytest.approx(cells["ger"].mean())
    assert r["ger_at_safe_low"] <= r["ger_at_safe"] <= r["ger_at_safe_high"]
    assert r["ger_at_safe_instances"] == SPEC.n_instances


def test_eviction_effect_is_the_within_ratio_link_of_each_press(league):
    # the synthetic GER is higher in hallucinated cells at every ratio: the link raises H, per press
    for press in ("early+adakv", "late+adakv"):
        r = _row(league, press)
        assert r["eviction_verdict"].startswith("raises H") and r["eviction_or_per_tenth_low"] > 1, r
        assert r["eviction_text"].startswith("raises H")


def test_unmatched_grids_are_matched_before_ranking(store):
    """A press tested at an extra ratio: that ratio is left out for it, so every press shares one grid."""
    extra = store[(store["press"] == "late+adakv") & (store["ratio"] == 0.8)].assign(ratio=0.75)
    t = press_league(pd.concat([store, extra], ignore_index=True), n_boot=50)
    late = _row(t, "late+adakv")
    assert late["ratios_left_out"] == [0.75] and 0.75 not in late["ratios"]
    assert "left out to match the other presses: 0.75" in late["grid_text"] and late["note"]
    assert (t["n_ratios"] == len(SPEC.ratios)).all() and not _row(t, "early+adakv")["ratios_left_out"]


def test_league_needs_a_press_besides_the_baseline(store):
    with pytest.raises(AnalysisError, match="nothing to rank"):
        press_league(store[store["press"] == "none"], n_boot=20)


def test_run_analysis_puts_the_league_in_the_summary_and_renders_it(store):
    a = run_analysis(store, AnalysisConfig(n_boot=N_BOOT))
    league = a.tables["press_league"]
    assert [r["press"] for r in a.summary["press_league"]] == list(league["press"])
    # the run's own cliff table is reused as it is (same grid for every press)
    cliffs = a.tables["cliffs"].set_index("press")
    for r in league.to_dict(orient="records"):
        assert r["safe_ratio"] == cliffs.loc[r["press"], "safe_ratio"]
    assert "press_league" in a.summary["settings"]
    html = league_html(league, "unused", delta=0.05, confidence=0.95, min_instances=10)
    assert html.count("<tr>") == len(league) + 1 and "undecided: only 4 instances" in html
    assert "no cliff in the tested range" in html
