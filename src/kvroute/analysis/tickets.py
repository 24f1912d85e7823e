"""Token-route lottery tickets against the presses' cliffs.

A ticket is a set of kept entries that still yields the answer (kvroute.tickets). If routes are
sparse, tickets are far smaller than the share of the cache a press must keep before it falls off
its cliff, (1 − α*); the ratio between the two says how much of that budget a press wastes.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from kvroute.errors import StoreError

TICKETS_FILE = "tickets.jsonl"


def load_tickets(run_dir: str | Path) -> pd.DataFrame:
    """``RUN_DIR/tickets.jsonl`` (written by ``kvroute ticket --out RUN_DIR``), or an empty frame."""
    p = Path(run_dir)
    f = p / TICKETS_FILE if p.is_dir() else p.parent / TICKETS_FILE
    if not f.is_file():
        return pd.DataFrame()
    rows = []
    for i, line in enumerate(f.read_text().splitlines(), 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise StoreError(f"{f}, line {i}: not valid JSON ({e})") from e
    return pd.DataFrame(rows)


def tickets_vs_cliffs(tickets: pd.DataFrame, cliffs: pd.DataFrame | None) -> pd.DataFrame:
    """Per model and press: median ticket share of the cache against the kept share at the cliff, 1 − α*."""
    if tickets.empty:
        return pd.DataFrame()
    t = tickets.groupby("model").agg(tickets=("fraction", "size"), ticket_median=("fraction", "median"),
                                     ticket_max=("fraction", "max")).reset_index()
    if cliffs is None or cliffs.empty or "alpha_star" not in cliffs:
        return t
    c = cliffs[(cliffs.get("family", "all") == "all") & cliffs["alpha_star"].notna()]
    c = c[["model", "press", "regime", "alpha_star"]].copy()
    c["kept_at_cliff"] = 1 - c["alpha_star"]
    out = t.merge(c, on="model", how="left")
    out["cliff_over_ticket"] = out["kept_at_cliff"] / out["ticket_median"]
    return out
