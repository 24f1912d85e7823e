"""HTML building blocks for the report: escaping, value formatting, tables, figures, the page.

Every piece of text that reaches the page goes through :func:`esc` (``html.escape`` with quotes):
task text, model answers, model and press names, manifest values. The page also carries a
Content-Security-Policy that forbids scripts and any network access, as a second line of defence.
"""

from __future__ import annotations

import html
import math
from collections.abc import Iterable, Sequence
from typing import Any

import pandas as pd

CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'"

STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 1.2rem auto; max-width: 1180px;
       color: #222; line-height: 1.45; padding: 0 1rem; }
h1 { font-size: 1.5rem; margin: 0 0 0.1rem; } \
h2 { border-bottom: 1px solid #ddd; padding-bottom: 0.2rem; margin-top: 2.2rem; }
header p.meta { margin: 0 0 0.4rem; }
.meta { color: #666; font-size: 0.88rem; } \
.note { background: #fff8e1; border-left: 4px solid #f0b400; padding: 0.5rem 0.8rem; }
#findings h2 { margin-top: 0.6rem; } ul.findings { margin: 0.3rem 0; padding-left: 1.2rem; font-size: 0.9rem; }
ul.findings li { margin: 0.1rem 0; } #findings figure { margin: 0.5rem 0; }
nav ol { columns: 3; font-size: 0.92rem; }
.scroll { overflow-x: auto; max-width: 100%; margin: 0.6rem 0 1rem; }
table { border-collapse: collapse; font-size: 0.82rem; }
th, td { border: 1px solid #ddd; padding: 0.25rem 0.5rem; text-align: left; vertical-align: top; }
th { background: #f4f6f8; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
td.text { max-width: 28rem; white-space: pre-wrap; word-break: break-word; font-family: ui-monospace, monospace; }
figure { margin: 1rem 0; } figure img { max-width: 100%; height: auto; border: 1px solid #eee; }
figcaption { font-size: 0.88rem; color: #444; margin-top: 0.3rem; }
dl.manifest { display: grid; grid-template-columns: max-content minmax(0, 1fr); gap: 0.3rem 1rem; font-size: 0.9rem; }
dl.manifest dt { font-weight: 600; } dl.manifest dd { margin: 0; overflow-wrap: anywhere; }
dl.manifest ol { margin: 0.2rem 0; padding-left: 1.2rem; }
details pre { overflow-x: auto; max-height: 40rem; background: #f8f8f8; padding: 0.6rem; font-size: 0.8rem; }
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
    # the box scrolls sideways, not the page, when a table is wider than the window
    return (f'<div class="scroll"><table><thead><tr>{head}</tr></thead>'
            f'<tbody>{"".join(body)}</tbody></table></div>{more}')


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


def page(title: str, meta: str, toc: Sequence[tuple[str, str]], body: Sequence[str], opening: str = "") -> str:
    """The whole self-contained page: the header, ``opening`` (what a reader came for), the contents, ``body``."""
    nav = "".join(f'<li><a href="#{esc(i)}">{esc(h)}</a></li>' for i, h in toc)
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{esc(title)}</title><style>{STYLE}</style></head><body>"
            f'<header><h1>{esc(title)}</h1><p class="meta">{esc(meta)}</p></header>'
            f"{opening}<nav><ol>{nav}</ol></nav>{''.join(body)}</body></html>\n")
