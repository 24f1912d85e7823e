"""The "compress once, ask many" tables and findings, as HTML (the report) and Markdown (benchmarks/multi_turn.py).

Every sentence is the analysis's own (:mod:`kvroute.analysis.turns`): this module only arranges them.
"""

from __future__ import annotations

import pandas as pd

from kvroute.analysis.turns import turn_alpha_text
from kvroute.report import html as h
from kvroute.report.serving import markdown_table

PAIR_COLS = [("model", "model"), ("press", "press"), ("turn", "turn"), ("n_shared", "conversations"),
             ("area_first", "area H (turn 1)"), ("area_turn", "area H (turn)"), ("difference", "Δ area"),
             ("difference_low", "Δ low"), ("difference_high", "Δ high"), ("p_holm", "Holm p")]
CURVE_COLS = [("model", "model"), ("press", "press"), ("turn", "turn"), ("ratio", "α"),
              ("n_conversations", "conversations"), ("h", "H"), ("h_low", "H low"), ("h_high", "H high"),
              ("ger_evidence", "GER (turn's evidence)"), ("ger_low", "GER low"), ("ger_high", "GER high")]


def _lines(tables: dict[str, pd.DataFrame]) -> list[str]:
    pairs, cliffs = tables.get("turn_pairs"), tables.get("turn_cliffs")
    return [*([] if pairs is None else pairs["finding"].astype(str)),
            *([] if cliffs is None or cliffs.empty else turn_alpha_text(cliffs))]


def turns_html(tables: dict[str, pd.DataFrame], missing: str) -> dict[str, str]:
    """The section's parts: ``findings`` (a list), ``pairs``, ``curves`` (tables), or a note saying why not."""
    pairs, curves = tables.get("turn_pairs"), tables.get("turn_curves")
    if pairs is None or pairs.empty:
        return {"findings": h.note(missing), "pairs": "", "curves": ""}
    findings = "<ul>" + "".join(f"<li>{h.esc(t)}</li>" for t in _lines(tables)) + "</ul>"
    return {"findings": findings, "pairs": h.table(pairs, PAIR_COLS),
            "curves": h.table(curves, CURVE_COLS) if curves is not None and not curves.empty else ""}


def turns_markdown(tables: dict[str, pd.DataFrame]) -> list[str]:
    """Findings, the paired table and the per-turn curves, as Markdown lines."""
    out = ["## Findings (written by kvroute.analysis.turns)", "", *(f"- {t}" for t in _lines(tables)), ""]
    if "turn_pairs" in tables:
        out += ["## Each later turn against turn 1 (paired on conversations; Δ area > 0: the later turn "
                "hallucinates more under compression)", "", *markdown_table(tables["turn_pairs"], PAIR_COLS), ""]
    if "turn_curves" in tables:
        out += ["## H and the GER of each turn's own evidence, by turn and ratio (95% bootstrap over "
                "conversations)", "", *markdown_table(tables["turn_curves"], CURVE_COLS), ""]
    return out
