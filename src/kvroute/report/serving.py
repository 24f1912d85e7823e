"""The "what the server costs" tables and findings, as HTML (the report) and Markdown (benchmarks/serving_cost.py).

Every sentence is the analysis's own (:mod:`kvroute.analysis.serving`): this module only arranges them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import pandas as pd

from kvroute.report import html as h

PAIR_COLS = [("model", "model"), ("press", "press"), ("variant", "constraint"), ("n_shared", "instances"),
             ("area", "area H (press)"), ("area_constrained", "area H (constrained)"), ("difference", "Δ area"),
             ("difference_low", "Δ low"), ("difference_high", "Δ high"), ("p_holm", "Holm p"),
             ("ger_difference", "Δ area GER"), ("ger_difference_low", "GER low"),
             ("ger_difference_high", "GER high"), ("ger_p_holm", "GER Holm p")]
RATIO_COLS = [("model", "model"), ("press", "press"), ("variant", "constraint"), ("ratio", "α"), ("n", "instances"),
              ("dh", "ΔH"), ("dh_low", "ΔH low"), ("dh_high", "ΔH high"), ("dger", "ΔGER"), ("dger_low", "ΔGER low"),
              ("dger_high", "ΔGER high")]


def serving_html(tables: dict[str, pd.DataFrame], missing: str) -> dict[str, str]:
    """The section's parts: ``findings`` (a list), ``pairs``, ``by_ratio`` (tables), or notes saying why not."""
    pairs, by_ratio, detect = (tables.get(k) for k in ("serving_pairs", "serving_by_ratio", "serving_detect"))
    if pairs is None or pairs.empty:
        return {"findings": h.note(missing), "pairs": "", "by_ratio": ""}
    lines = [*pairs["finding"].astype(str), *([] if detect is None else detect["finding"].astype(str))]
    findings = "<ul>" + "".join(f"<li>{h.esc(t)}</li>" for t in lines) + "</ul>"
    return {"findings": findings, "pairs": h.table(pairs, PAIR_COLS),
            "by_ratio": h.table(by_ratio, RATIO_COLS) if by_ratio is not None and not by_ratio.empty else ""}


def _cell(v: Any, signed: bool) -> str:
    if isinstance(v, float):
        return "–" if math.isnan(v) else f"{v:+.3f}" if signed else f"{v:.3g}"
    return "–" if v is None else str(v)


def markdown_table(df: pd.DataFrame, cols: Sequence[tuple[str, str]]) -> list[str]:
    cols = [c for c in cols if c[0] in df.columns]
    out = ["| " + " | ".join(hd for _, hd in cols) + " |", "|" + "---|" * len(cols)]
    for r in df.to_dict(orient="records"):
        out.append("| " + " | ".join(_cell(r[k], k.startswith(("d", "ger_d"))) for k, _ in cols) + " |")
    return out


def serving_markdown(result: tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]) -> list[str]:
    """Findings, the paired table and the per-ratio table, as Markdown lines."""
    pairs, by_ratio, detect = result
    return ["## Findings (written by kvroute.analysis.serving)", "",
            *(f"- {t}" for t in [*pairs["finding"], *detect["finding"]]), "",
            "## Paired over the ratio grid (constrained − unconstrained; Δ area > 0: the constraint hallucinates "
            "more)", "", *markdown_table(pairs, PAIR_COLS), "",
            "## ΔH and ΔGER at each ratio (paired, 95% instance bootstrap)", "", *markdown_table(by_ratio, RATIO_COLS)]
