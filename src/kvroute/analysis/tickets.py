"""Token-route lottery tickets against the presses' cliffs.

A ticket is a set of kept entries that still yields the answer (kvroute.tickets). If routes are
sparse, tickets are far smaller than the share of the cache a press must keep before it falls off
its cliff, (1 − α*); the ratio between the two says how much of that budget a press wastes.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from kvroute.bounds import loads_json
from kvroute.errors import StoreError

TICKETS_FILE = "tickets.jsonl"


def load_tickets(run_dir: str | Path) -> pd.DataFrame:
    """``RUN_DIR/tickets.jsonl`` (written by ``kvroute ticket --out RUN_DIR``), or an empty frame."""
    p = Path(run_dir)
    f = p / TICKETS_FILE if p.is_dir() else p.parent / TICKETS_FILE
    if not f.is_file():
        return pd.DataFrame()
    rows = []
    for i, line in enumerate(f.read_text(encoding="utf-8-sig").splitlines(), 1):
        if line.strip():
            try:
                rows.append(loads_json(line))
            except ValueError as e:  # bad syntax, nesting deeper than a ticket's or a lone surrogate
                raise StoreError(f"{f}, line {i}: not a ticket record ({e})") from None
    return pd.DataFrame(rows)


TICKET_KEYS = ("model", "regime", "family")


def tickets_vs_cliffs(tickets: pd.DataFrame, cliffs: pd.DataFrame | None) -> pd.DataFrame:
    """Per (model, regime, family) of the tickets and per press: median ticket share against 1 − α*.

    A ticket is compared only with cliffs of the same model *and* regime, and of the tickets' task
    family when the cliff table has that family's own curve; otherwise with the pooled curve
    (``cliff_family`` says which). Both shares count context entries only, the entries a press's
    ratio refers to; ``ticket_median_with_question`` adds the question suffix every cell keeps.
    Tickets written before the regime was recorded count as ``agnostic`` (the search's default).
    """
    if tickets.empty:
        return pd.DataFrame()
    t = tickets.copy()
    if "regime" not in t:
        t["regime"] = "agnostic"
    t["regime"] = t["regime"].fillna("agnostic")
    if "family" not in t:
        t["family"] = "all"
    aggs = {"tickets": ("fraction", "size"), "ticket_median": ("fraction", "median"),
            "ticket_max": ("fraction", "max")}
    if "fraction_with_question" in t:
        aggs["ticket_median_with_question"] = ("fraction_with_question", "median")
    g = t.groupby(list(TICKET_KEYS)).agg(**aggs).reset_index()
    if cliffs is None or cliffs.empty or "alpha_star" not in cliffs:
        return g
    c = cliffs[cliffs["alpha_star"].notna()].copy()
    if "family" not in c:
        c["family"] = "all"
    c = c[["model", "press", "regime", "family", "alpha_star"]]
    rows = []
    for _, tk in g.iterrows():
        same = c[(c["model"] == tk["model"]) & (c["regime"] == tk["regime"])]
        own = same[same["family"] == tk["family"]]
        chosen = own if not own.empty else same[same["family"] == "all"]
        if chosen.empty:
            rows.append({**tk.to_dict(), "press": None, "cliff_family": None, "alpha_star": float("nan")})
            continue
        for _, cl in chosen.iterrows():
            rows.append({**tk.to_dict(), "press": cl["press"], "cliff_family": cl["family"],
                         "alpha_star": cl["alpha_star"]})
    out = pd.DataFrame(rows)
    out["kept_at_cliff"] = 1 - out["alpha_star"]
    out["cliff_over_ticket"] = out["kept_at_cliff"] / out["ticket_median"]
    return out
