"""The press league in the report: how to read it, and the table (from :func:`kvroute.analysis.league.press_league`)."""

from __future__ import annotations

import pandas as pd

from kvroute.report import html as h

#: (column, header) of the rendered league; the ``*_text`` columns say in words where the data cannot decide
LEAGUE_TABLE_COLS = [("rank", "rank"), ("model", "model"), ("regime", "regime"), ("press", "press"),
                     ("n_instances", "instances"), ("grid_text", "matched ratio grid"),
                     ("safe_ratio_text", "safe ratio"), ("alpha_star_text", "α* [95% CI]"),
                     ("ger_at_safe_text", "GER at the safe ratio [95% CI]"),
                     ("eviction_text", "eviction effect within ratio [95% CI]")]


def league_howto(delta: float, confidence: float, min_instances: int) -> str:
    """The paragraph above the table: what a row is, how rows are ordered, what each cell means."""
    return (
        "The routing view of the press leaderboard. One row per model, press and regime, families pooled; every press "
        "of a model is read on the same ratio grid (matched budgets: a ratio only some presses were tested at is left "
        "out for all of them). Rows are ranked, per model and regime, by the safe ratio — the largest compression "
        f"whose hallucination rate stays within δ = {delta:g} of the uncompressed one at {confidence:.0%} confidence — "
        "best first, then by α*, where the hallucination cliff sits (later is better; a cliff beyond the tested range "
        "ranks above any inside it, a curve without a cliff after its ties). α* is the fitted sigmoid midpoint with "
        f"its {confidence:.0%} bootstrap interval over instances, as in the cliff table above. GER at the safe ratio "
        "is the mean share of (layer, answer token) pairs evicted from every head at that ratio, with its "
        "instance-bootstrap interval: how much of the answer a press already erases while it is still safe. The "
        "eviction effect is the within-ratio test of section 3 for that press: the odds of hallucinating per +0.1 GER "
        "and ΔP(H) between cells whose answer is globally evicted and cells that keep it, at the same ratio ('raises "
        "H' only when the interval excludes no effect). Where the data cannot place a number the cell says so in words "
        "— 'undecided', 'no cliff in the tested range', 'beyond the tested range', '–' where a quantity is undefined — "
        f"and a press with fewer than {min_instances} instances is listed without a rank. Read a safe-ratio "
        "difference of one grid step as a difference of one grid step: the safe ratio has no interval of its own.")


def league_html(league: pd.DataFrame | None, missing: str, *, delta: float, confidence: float,
                min_instances: int) -> str:
    """The explanation and the league table, or the explanation and a note saying why there is none."""
    howto = h.paragraph(league_howto(delta, confidence, min_instances))
    if league is None or league.empty:
        return howto + h.note(missing)
    return howto + h.table(league, [c for c in LEAGUE_TABLE_COLS if c[0] in league.columns],
                           text_columns=["alpha_star_text", "eviction_text"])
