"""The press league in the report: how to read it, and the table (from :func:`kvroute.analysis.league.press_league`)."""

from __future__ import annotations

import pandas as pd

from kvroute.report import html as h

#: (column, header) of the rendered league; the ``*_text`` columns say in words where the data cannot decide
LEAGUE_TABLE_COLS = [("rank", "rank"), ("model", "model"), ("regime", "regime"), ("press", "press"),
                     ("rank_text", "paired comparisons"), ("area", "mean H over the grid"),
                     ("n_instances", "instances"), ("grid_text", "matched ratio grid"),
                     ("safe_ratio_text", "certified safe ratio"), ("alpha_star_text", "α* [95% CI]"),
                     ("ger_at_safe_text", "GER at the safe ratio [95% CI]"),
                     ("eviction_text", "eviction effect within instance [95% CI]")]


def league_howto(delta: float, confidence: float, min_instances: int) -> str:
    """The paragraph above the table: what a row is, how rows are ordered, what each cell means."""
    return (
        "The routing view of the press leaderboard. One row per model, press and regime, families pooled; every press "
        "of a model is read on the same ratio grid (matched budgets: a ratio only some presses were tested at is left "
        "out for all of them). Rows are ranked by paired comparison: every pair of presses is compared on the "
        "instances both answered at every ratio of the grid — the difference of their mean hallucination over the "
        f"grid (area under H(α)), with a paired bootstrap interval over instances, decided by a within-instance "
        f"sign-flip randomization test (exact when the two presses are the same), Holm-adjusted over the pairs at "
        f"{confidence:.0%}. A press's rank is 1 + the number of presses that beat it, so presses the data cannot tell "
        "apart share a rank; the 'paired comparisons' column names whom each beats, loses to and is tied with. The "
        f"certified safe ratio is the largest compression whose hallucination rate is shown within δ = {delta:g} of "
        f"the uncompressed one at {confidence:.0%} confidence, at it and every smaller ratio (an exact test on the "
        "answers that change): a certificate, not an order. α* is the fitted sigmoid midpoint with the interval that "
        "both the sigmoid and the model-free crossing allow ('cannot decide' where they disagree). GER at the safe "
        "ratio is the mean share of (layer, answer token) pairs evicted from every head at that ratio, with its "
        "instance-bootstrap interval. The eviction effect compares an instance only with itself: the odds of "
        "hallucinating per +0.1 GER within instance at matched ratios ('raises H' only when the interval excludes no "
        "effect; an end reached by separated replicates is 'open'). Where the data cannot place a number the cell "
        "says so in words, and a press with fewer than "
        f"{min_instances} instances is listed without a rank.")


def league_html(league: pd.DataFrame | None, missing: str, *, delta: float, confidence: float,
                min_instances: int) -> str:
    """The explanation and the league table, or the explanation and a note saying why there is none."""
    howto = h.paragraph(league_howto(delta, confidence, min_instances))
    if league is None or league.empty:
        return howto + h.note(missing)
    return howto + h.table(league, [c for c in LEAGUE_TABLE_COLS if c[0] in league.columns],
                           text_columns=["rank_text", "alpha_star_text", "eviction_text"])


#: (column, header) of the league as the docs quote it: the words a reader quotes, fewer columns than the report
LEAGUE_MARKDOWN_COLS = [("rank", "rank"), ("press", "press"), ("rank_text", "paired comparisons"),
                        ("area", "mean H over the grid"), ("safe_ratio_text", "certified safe ratio"),
                        ("alpha_star_text", "α* [95% CI]"), ("eviction_text", "eviction effect within instance")]


def league_markdown(rows: list[dict]) -> list[str]:
    """The league rows of ``summary.json`` (``press_league``) as a Markdown table, one line per row (what the docs
    quote; tests/unit/test_docs_findings.py regenerates it)."""
    def cell(r: dict, col: str) -> str:
        v = r.get(col)
        if v is None or (isinstance(v, float) and v != v):
            return "–"
        if col == "press":
            return f"`{v}`"
        if col == "area":
            return f"{v:.3f}"
        return str(v).replace("|", "\\|")

    head = "| " + " | ".join(h for _, h in LEAGUE_MARKDOWN_COLS) + " |"
    rule = "|" + "|".join("---" for _ in LEAGUE_MARKDOWN_COLS) + "|"
    return [head, rule, *("| " + " | ".join(cell(r, c) for c, _ in LEAGUE_MARKDOWN_COLS) + " |" for r in rows)]
