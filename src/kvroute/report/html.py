"""HTML building blocks for the report: escaping, value formatting, tables, figures, the page.

Every piece of text that reaches the page goes through :func:`esc` (``html.escape`` with quotes):
task text, model answers, model and press names, manifest values. The page also carries a
Content-Security-Policy that forbids scripts and any network access, as a second line of defence.
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Iterable, Sequence
from typing import Any

import pandas as pd

CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'"

STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 2rem auto; max-width: 1180px;
       color: #222; line-height: 1.45; padding: 0 1rem; }
h1 { font-size: 1.6rem; margin-bottom: 0.2rem; } h2 { border-bottom: 1px solid #ddd; padding-bottom: 0.2rem; margin-top: 2.2rem; }
.meta { color: #666; font-size: 0.9rem; } .note { background: #fff8e1; border-left: 4px solid #f0b400; padding: 0.5rem 0.8rem; }
nav ol { columns: 2; font-size: 0.95rem; }
table { border-collapse: collapse; font-size: 0.82rem; margin: 0.6rem 0 1rem; display: block; overflow-x: auto; max-width: 100%; }
th, td { border: 1px solid #ddd; padding: 0.25rem 0.5rem; text-align: left; vertical-align: top; }
th { background: #f4f6f8; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
td.text { max-width: 28rem; white-space: pre-wrap; word-break: break-word; font-family: ui-monospace, monospace; }
figure { margin: 1rem 0; } figure img { max-width: 100%; height: auto; border: 1px solid #eee; }
figcaption { font-size: 0.88rem; color: #444; margin-top: 0.3rem; }
"""


def esc(text: object) -> str:
    """HTML-escaped text (``<``, ``>``, ``&``, quotes)."""
    return html.escape(str(text), quote=True)


def fmt(v: Any, digits: int = 3) -> str:
    """A value as escaped display text: None/NaN → "—", floats to ``digits`` significant digits."""
    if v is None or (isinstance(v, float) and math.isnan(v)) or v is pd.NA:
        return "—"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        if v != 0 and (abs(v) < 1e-3 or abs(v) >= 1e5):
            return esc(f"{v:.{digits - 1}e}")
        return esc(f"{v:.{digits}g}")
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(fmt(x, digits) for x in v) + "]"
    return esc(v)


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def table(df: pd.DataFrame | Sequence[dict], columns: Sequence[tuple[str, str]] | None = None, *,
          text_columns: Iterable[str] = (), max_rows: int = 200) -> str:
    """An HTML table; ``columns`` are (key, header) pairs (default: every column). Cells are escaped."""
    rows = df.to_dict(orient="records") if isinstance(df, pd.DataFrame) else list(df)
    if not rows:
        return '<p class="note">No rows.</p>'
    if columns is None:
        columns = [(c, c) for c in rows[0]]
    text_columns = set(text_columns)
    head = "".join(f"<th>{esc(h)}</th>" for _, h in columns)
    body = []
    for r in rows[:max_rows]:
        cells = []
        for key, _ in columns:
            v = r.get(key)
            cls = "text" if key in text_columns else "num" if _is_num(v) else ""
            cells.append(f'<td class="{cls}">{fmt(v)}</td>' if cls else f"<td>{fmt(v)}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    more = f'<p class="meta">{len(rows) - max_rows} more rows in summary.json.</p>' if len(rows) > max_rows else ""
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>{more}"


def figure(fig_id: str, uri: str, caption: str) -> str:
    """An embedded PNG figure with an escaped caption."""
    return (f'<figure id="{esc(fig_id)}"><img src="{uri}" alt="{esc(caption)}">'
            f"<figcaption>{esc(caption)}</figcaption></figure>")


def note(text: str) -> str:
    return f'<p class="note">{esc(text)}</p>'


def paragraph(text: str) -> str:
    return f"<p>{esc(text)}</p>"


def section(sec_id: str, heading: str, *parts: str) -> str:
    return f'<section id="{esc(sec_id)}"><h2>{esc(heading)}</h2>{"".join(parts)}</section>'


def manifest_table(manifest: dict[str, Any] | None) -> str:
    """The run manifest as a two-column table (nested values as compact JSON, long ones cut)."""
    if not manifest:
        return note("No run manifest was given (manifest.json next to the records).")
    rows = []
    for k, v in manifest.items():
        text = v if isinstance(v, str) else json.dumps(v, default=str, ensure_ascii=False)
        rows.append({"key": k, "value": text if len(text) <= 400 else text[:399] + "…"})
    return table(rows, [("key", "field"), ("value", "value")], text_columns=["value"])


def page(title: str, meta: str, toc: Sequence[tuple[str, str]], body: Sequence[str]) -> str:
    """The whole self-contained page."""
    nav = "".join(f'<li><a href="#{esc(i)}">{esc(h)}</a></li>' for i, h in toc)
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{esc(title)}</title><style>{STYLE}</style></head><body>"
            f'<header><h1>{esc(title)}</h1><p class="meta">{esc(meta)}</p></header>'
            f"<nav><ol>{nav}</ol></nav>{''.join(body)}</body></html>\n")
