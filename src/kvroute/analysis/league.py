"""The press league: the routing view of the kvpress leaderboard, one row per (model, press, regime).

Every number comes from an estimator defined elsewhere; this module only lines them up at
*matched budgets* and says in words where the data cannot decide.

* **Matched budgets.** Within one (model, regime) every press is read on the same ratio grid:
  the ratios every press of that group was tested at (with H recorded). When some press has
  ratios the others lack, those ratios are left out for every press of the group (named in
  ``ratios_left_out``) and the cliffs and the within-ratio link are recomputed on the matched
  records with the same functions; otherwise the run's own tables are reused as they are.
* **α\\*** — the cliff midpoint of :func:`~kvroute.analysis.cliff.cliff_tables` (families pooled),
  with its censored bootstrap interval; ``alpha_star_text`` says which end is open, or why there
  is no midpoint (no cliff in the tested range, beyond or below the grid).
* **safe ratio** — :func:`~kvroute.analysis.cliff.safe_ratio`, as in the cliff table.
* **GER at the safe ratio** — mean ``ger`` of the press's cells at its safe ratio, families
  pooled, with a percentile bootstrap interval over instances
  (:func:`~kvroute.analysis.bootstrap.bootstrap_ci`); undefined ("–") at a safe ratio of 0
  (nothing is compressed) or where no cell there has a defined GER.
* **eviction effect** — :func:`~kvroute.analysis.correlation.within_ratio_link` for the press
  (families pooled): odds ratio per +0.1 GER and the Mantel–Haenszel ΔP(H) evicted − retained at
  the same ratio, with their instance-clustered intervals and the verdict.

**Order: paired comparison** (:mod:`kvroute.analysis.paired`). Within (model, regime), every
pair of presses is compared on the instances both have at every matched ratio — the difference of
the mean area under each instance's H(α), with a paired instance bootstrap interval and a
within-instance sign-flip randomization p-value, Holm-adjusted over the
pairs — and ``rank`` = 1 + the number of presses that beat the row's press in a decided pair; presses
that share a rank are tied (``rank_text`` names whom each beats, loses to and is tied with). Rows of
one rank are listed by their area (``area``, smaller first), which orders nothing: it only lists.
The safe ratio and α* no longer order the league: the safe ratio separates presses by two or three
answers of 64 and its ties were broken by α*, which put the worse of two planted presses first in a
third of the sets with answer churn; the paired rule ordered them right (planted league,
:mod:`kvroute.analysis.planted.league`). The safe ratio stays as a **certification** column (an
exact test whose size at the margin is ≤ 5%: :mod:`kvroute.analysis.excess`).

A row is *undecided* — no ``rank``, listed after the ranked rows, every cell saying why — when its
curve has fewer than ``min_instances`` instances. Numbers stay in the numeric columns for the
record; the ``*_text`` columns are what a reader should quote.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from kvroute.analysis.bootstrap import bootstrap_ci
from kvroute.analysis.cliff import cliff_tables
from kvroute.analysis.common import (
    ALL,
    BASELINE_PRESS,
    PRESS_KEYS,
    AnalysisError,
    attach_baseline,
    has_columns,
    require_columns,
)
from kvroute.analysis.correlation import GLOBAL_EVICTION_THRESHOLD, or_interval, within_ratio_link
from kvroute.analysis.paired import PAIR_COLUMNS, PAIRED_RULE, Standing, paired_comparisons, paired_ranks
from kvroute.analysis.sigmoid import MIN_AMPLITUDE

#: below this many instances a curve's α*, safe ratio and GER are not ranked ("undecided")
MIN_LEAGUE_INSTANCES = 10

LEAGUE_COLUMNS = ["model", "regime", "rank", "press", "family", "decided", "n_instances", "n_ratios", "ratios",
                  "ratios_left_out", "grid_text", "area", "rank_text",
                  "cliff_status", "alpha_star", "alpha_star_low", "alpha_star_high",
                  "alpha_star_identified", "alpha_star_text", "safe_ratio", "safe_ratio_text", "ger_at_safe",
                  "ger_at_safe_low", "ger_at_safe_high", "ger_at_safe_instances", "ger_at_safe_text",
                  "eviction_verdict", "eviction_or_per_tenth", "eviction_or_per_tenth_low",
                  "eviction_or_per_tenth_high", "eviction_risk_difference", "eviction_risk_difference_low",
                  "eviction_risk_difference_high", "eviction_text", "note"]

#: how the league is made, as stated in summary.json's settings
LEAGUE_RULE = ("one row per (model, press, regime), families pooled, every press of a (model, regime) on the ratios "
               "all of them were tested at; ranked by paired comparison: " + PAIRED_RULE + "; rows of one rank listed "
               "by mean area; rows with fewer than {n} instances are undecided and unranked; the safe ratio is a "
               "certification column (exact test on the discordant pairs), not an order; GER at the safe ratio: "
               "mean ger with an instance-bootstrap interval; eviction effect: the within-ratio GER–hallucination "
               "link of the press")


def _is_num(v: object) -> bool:
    return v is not None and not (isinstance(v, float) and np.isnan(v))


def _num(v: Any) -> float | None:
    return float(v) if _is_num(v) else None


def matched_grids(data: pd.DataFrame, value_col: str = "hallucinated") -> pd.DataFrame:
    """Per (model, regime, press): ``ratios`` it was tested at (``value_col`` recorded), the group's
    ``matched`` ratios (tested for every press of the (model, regime)) and ``left_out`` (its own
    ratios outside the matched grid). ``data`` has its baseline attached."""
    tested = data[data[value_col].notna()].groupby(["model", "regime", "press"], sort=True)["ratio"].agg(
        lambda r: tuple(sorted(set(r.astype(float)))))
    rows = []
    for (model, regime), g in tested.groupby(level=["model", "regime"], sort=True):
        common = sorted(set.intersection(*(set(r) for r in g)))
        for (_, _, press), own in g.items():
            rows.append({"model": model, "regime": regime, "press": press, "ratios": list(own), "matched": common,
                         "left_out": [r for r in own if r not in common]})
    return pd.DataFrame(rows, columns=["model", "regime", "press", "ratios", "matched", "left_out"])


def press_league(df: pd.DataFrame, *, cliffs: pd.DataFrame | None = None, within: pd.DataFrame | None = None,
                 delta: float = 0.05, n_boot: int = 1000, confidence: float = 0.95, seed: int = 0,
                 min_amplitude: float = MIN_AMPLITUDE, ger_threshold: float = GLOBAL_EVICTION_THRESHOLD,
                 min_instances: int = MIN_LEAGUE_INSTANCES, pairs: pd.DataFrame | None = None) -> pd.DataFrame:
    """The press league of the records ``df`` (one row per cell; see the module docstring).

    ``cliffs`` (the second table of :func:`cliff_tables`) and ``within`` (:func:`within_ratio_link`)
    are the run's own tables, reused when every press of a (model, regime) shares one ratio grid;
    they are computed here when missing (``within`` only when the records carry ``ger``) and
    recomputed on the matched records when the grids differ; ``pairs`` (:func:`league_pairs`) the
    paired comparisons that rank the rows, computed here when missing. The other arguments are theirs.
    Returns a DataFrame with :data:`LEAGUE_COLUMNS`, sorted by model, regime and rank.
    """
    if min_instances < 2:
        raise AnalysisError(f"min_instances must be at least 2, got {min_instances}")
    data = attach_baseline(df)
    require_columns(data, ["hallucinated"], "the press league")
    data = data[data["press"] != BASELINE_PRESS]
    if data.empty:
        raise AnalysisError(f"no press other than the {BASELINE_PRESS!r} baseline in these records: nothing to rank")
    grids = matched_grids(data)
    if grids["left_out"].map(len).any():
        keep = data.merge(grids[["model", "regime", "press", "matched"]], on=["model", "regime", "press"], how="left")
        data = data[[r in m for r, m in zip(keep["ratio"], keep["matched"], strict=True)]]
        cliffs = within = None  # the run's tables saw the unmatched grids
    boot: dict[str, Any] = dict(n_boot=n_boot, confidence=confidence, seed=seed)
    if cliffs is None:
        cliffs = cliff_tables(data, delta=delta, min_amplitude=min_amplitude, **boot)[1]
    if within is None and has_columns(data, ["ger"]):
        within = within_ratio_link(data, threshold=ger_threshold, **boot)
    if cliffs.empty:
        raise AnalysisError("the cliff analysis gave no curve to rank")
    family = ALL if (cliffs["family"] == ALL).any() else str(cliffs["family"].iloc[0])
    rows = cliffs[(cliffs["family"] == family) & (cliffs["press"] != BASELINE_PRESS)]
    rows = rows.merge(grids, on=["model", "regime", "press"], how="inner")
    ger = _ger_at_safe(data, rows, **boot)
    ev = None if within is None or within.empty else within[within["family"] == family]
    out = [_row(r, family, ger, ev, min_instances) for r in rows.to_dict(orient="records")]
    if pairs is None:  # the records are already matched and carry their baseline: compare them as they are
        pairs = paired_comparisons(data, ratios=_matched_by_group(grids), n_boot=max(n_boot, 2000),
                                   confidence=confidence, seed=seed, min_instances=min_instances)
    return _ranked(pd.DataFrame(out, columns=[c for c in LEAGUE_COLUMNS if c != "rank"]), pairs)


def league_pairs(df: pd.DataFrame, *, n_boot: int = 2000, confidence: float = 0.95, seed: int = 0,
                 min_instances: int = MIN_LEAGUE_INSTANCES) -> pd.DataFrame:
    """The paired comparisons behind the league's order (:data:`~kvroute.analysis.paired.PAIR_COLUMNS`):
    every pair of presses of a (model, regime), families pooled, on the ratios all of them were tested at."""
    data = attach_baseline(df)
    require_columns(data, ["hallucinated"], "the press league")
    data = data[data["press"] != BASELINE_PRESS]
    if data.empty:
        return pd.DataFrame(columns=PAIR_COLUMNS)
    return paired_comparisons(data, ratios=_matched_by_group(matched_grids(data)), n_boot=n_boot,
                              confidence=confidence, seed=seed, min_instances=min_instances)


def _matched_by_group(grids: pd.DataFrame) -> dict[tuple[str, str], list[float]]:
    """:func:`matched_grids`' common ratios keyed by (model, regime), as :func:`paired_comparisons` takes them."""
    return {(m, r): list(g["matched"].iloc[0]) for (m, r), g in grids.groupby(["model", "regime"])}


def _ger_at_safe(data: pd.DataFrame, rows: pd.DataFrame, *, n_boot: int, confidence: float,
                 seed: int) -> dict[tuple[str, ...], dict[str, Any]]:
    """Mean GER with its instance-bootstrap interval at each row's (positive) safe ratio, keyed by PRESS_KEYS."""
    if not has_columns(data, ["ger"]):
        return {}
    safe = rows[["model", "press", "regime", "safe_ratio"]].dropna()
    safe = safe[safe["safe_ratio"] > 0].rename(columns={"safe_ratio": "ratio"})
    cells = data.merge(safe, on=[*PRESS_KEYS, "ratio"], how="inner")
    cells = cells[pd.to_numeric(cells["ger"], errors="coerce").notna()]
    if cells.empty:
        return {}
    ci = bootstrap_ci(cells, "ger", PRESS_KEYS, n_boot=n_boot, confidence=confidence, seed=seed)
    return {tuple(r[k] for k in PRESS_KEYS): r for r in ci.to_dict(orient="records")}


def _grid_text(ratios: Sequence[float], left_out: Sequence[float]) -> str:
    text = f"{len(ratios)} ratios, {min(ratios):g}–{max(ratios):g}" if ratios else "no ratio"
    if left_out:
        text += f" (left out to match the other presses: {', '.join(f'{r:g}' for r in left_out)})"
    return text


def _row(c: dict[str, Any], family: str, ger: dict[tuple[str, ...], dict[str, Any]],
         ev: pd.DataFrame | None, min_instances: int) -> dict[str, Any]:
    key = tuple(str(c[k]) for k in PRESS_KEYS)
    matched = [r for r in c["ratios"] if r not in c["left_out"]]
    n_inst = int(c["n_instances"]) if _is_num(c.get("n_instances")) else 0
    safe = _num(c.get("safe_ratio"))
    few = n_inst < min_instances
    undecided = f"undecided: only {n_inst} instances (fewer than {min_instances})" if few else None
    out: dict[str, Any] = {
        "model": c["model"], "regime": c["regime"], "press": c["press"], "family": family, "n_instances": n_inst,
        "n_ratios": len(matched), "ratios": matched, "ratios_left_out": list(c["left_out"]),
        "grid_text": _grid_text(matched, c["left_out"]),
        "cliff_status": c.get("status"), "alpha_star": _num(c.get("alpha_star")),
        "alpha_star_low": _num(c.get("alpha_star_low")), "alpha_star_high": _num(c.get("alpha_star_high")),
        "alpha_star_identified": c.get("alpha_star_identified"), "safe_ratio": safe,
        "alpha_star_text": undecided or _alpha_text(c),
        "safe_ratio_text": undecided or _safe_text(safe),
        "decided": not few,
    }
    g = ger.get(key) if safe else None
    out.update(ger_at_safe=_num(g["mean"]) if g else None, ger_at_safe_low=_num(g["ci_low"]) if g else None,
               ger_at_safe_high=_num(g["ci_high"]) if g else None,
               ger_at_safe_instances=int(g["n_instances"]) if g else None,
               ger_at_safe_text=undecided or _ger_text(g, safe, ev is not None))
    w = None if ev is None else ev[(ev["model"] == c["model"]) & (ev["press"] == c["press"])
                                   & (ev["regime"] == c["regime"])]
    wr = w.iloc[0].to_dict() if w is not None and not w.empty else {}
    out.update(eviction_verdict=wr.get("verdict"),
               **{f"eviction_{k}": _num(wr.get(k)) for k in ("or_per_tenth", "or_per_tenth_low", "or_per_tenth_high",
                                                          "risk_difference", "risk_difference_low",
                                                          "risk_difference_high")},
               eviction_text=undecided or _eviction_text(wr, ev is not None))
    notes = [undecided] if undecided else []
    if safe is None:
        notes.append("no ratio-0 baseline cells, so no safe ratio to certify")
    if c["left_out"]:
        notes.append(_grid_text(matched, c["left_out"]))
    out["note"] = "; ".join(n for n in notes if n) or None
    return out


def _alpha_text(c: dict[str, Any]) -> str:
    status = str(c.get("status") or "no_data")
    a, lo, hi = _num(c.get("alpha_star")), _num(c.get("alpha_star_low")), _num(c.get("alpha_star_high"))
    ident = c.get("alpha_star_identified")
    if a is not None and status.startswith("ok"):
        if ident == "identified" and lo is not None and hi is not None:
            return f"{a:.3f} [{lo:.3f}, {hi:.3f}]"
        if ident == "open_above" and lo is not None:
            return (f"{a:.3f} [{lo:.3f}, open): the upper end is not identified "
                    f"({_share(c.get('boot_beyond_grid'))} of replicates beyond the grid)")
        if ident == "open_below" and hi is not None:
            return (f"{a:.3f} (open, {hi:.3f}]: the lower end is not identified "
                    f"({_share(c.get('boot_below_grid'))} of replicates below the grid)")
        if ident == "cannot decide":
            return f"{c.get('alpha_star_interval')} (the sigmoid's midpoint is {a:.3f})"
        return (f"undecided: the interval is open at both ends ({_share(c.get('boot_no_cliff'))} of replicates "
                f"without a cliff), so the point estimate {a:.3f} says little")
    reason = str(c.get("reason") or "")
    if status == "no_cliff":
        return f"no cliff in the tested range: {reason}"
    if status == "beyond_grid":
        return f"beyond the tested range: {reason}"
    if status == "below_grid":
        return f"below the tested range: {reason}"
    return f"undecided: {reason or status}"


def _share(v: object) -> str:
    return f"{v:.0%}" if _is_num(v) else "–"


def _safe_text(safe: float | None) -> str:
    if safe is None:
        return "– (no ratio-0 baseline, so no safe ratio)"
    if safe == 0:
        return "0 (no compressed ratio stays within δ of the baseline)"
    return f"{safe:g}"


def _ger_text(g: dict[str, Any] | None, safe: float | None, has_ger: bool) -> str:
    if safe is None:
        return "– (no safe ratio)"
    if safe == 0:
        return "– (safe ratio 0: nothing is compressed)"
    if g is None:
        return "– (no cell at the safe ratio has a defined GER)" if has_ger else "– (the records carry no GER)"
    lo, hi = _num(g["ci_low"]), _num(g["ci_high"])
    ci = f" [{lo:.3f}, {hi:.3f}]" if lo is not None and hi is not None else " (no interval: a single instance)"
    return f"{float(g['mean']):.3f}{ci}"


def _eviction_text(w: dict[str, Any], has_link: bool) -> str:
    if not w:
        return ("– (no within-ratio GER test: the records carry no GER)" if not has_link
                else "– (no within-ratio fit for this press)")
    verdict = str(w.get("verdict"))
    o, olo, ohi = (_num(w.get(k)) for k in ("or_per_tenth", "or_per_tenth_low", "or_per_tenth_high"))
    d, dlo, dhi = (_num(w.get(k)) for k in ("risk_difference", "risk_difference_low", "risk_difference_high"))
    odds = (f"OR per +0.1 GER within instance {o:.2f} {or_interval(olo, ohi)}"
            if None not in (o, olo, ohi) else None)
    rd = (f"between instances (confounded by difficulty) ΔP(H) evicted − retained {d:+.3f} [{dlo:+.3f}, {dhi:+.3f}]"
          if None not in (d, dlo, dhi) else None)
    if verdict in ("too few data", "no data"):
        return f"undecided ({verdict}): {w.get('note')}"
    if verdict.endswith("(separated)"):
        return (f"{verdict}: GER separates H within instance, so the point odds ratio is held finite only by the "
                "ridge" + "".join(f"; {p}" for p in (odds, rd) if p))
    if verdict == "undecided":
        return "undecided: the interval spans no effect" + "".join(f"; {p}" for p in (odds, rd) if p)
    return verdict + (": " + "; ".join(p for p in (odds, rd) if p) if odds or rd else "")


def _ranked(t: pd.DataFrame, pairs: pd.DataFrame) -> pd.DataFrame:
    """Rank the decided rows of each (model, regime) by the paired comparisons among them (see the module docstring)."""
    if t.empty:
        return t.reindex(columns=LEAGUE_COLUMNS)
    t = t.assign(rank_text=t["rank_text"].astype(object), area=t["area"].astype(float))
    rank: dict[int, int] = {}
    for (model, regime), g in t.groupby(["model", "regime"], sort=False):
        decided = g[g["decided"].astype(bool)]
        p = pairs[(pairs["model"] == model) & (pairs["regime"] == regime)] if not pairs.empty else pairs
        standing: dict[str, Standing] = paired_ranks(p, list(decided["press"]))
        for i, press in decided["press"].items():
            rank[i] = standing[press].rank
            t.loc[i, "rank_text"] = standing[press].text
        areas = _areas(p)
        for i, press in g["press"].items():
            t.loc[i, "area"] = areas.get(press)
    t["rank"] = pd.Series(rank, dtype="Int64").reindex(t.index)
    t = t.assign(_undecided=~t["decided"].astype(bool), _r=t["rank"].astype(float), _a=t["area"].astype(float))
    t = t.sort_values(["model", "regime", "_undecided", "_r", "_a", "press"], na_position="last", kind="stable")
    return t.drop(columns=["_undecided", "_r", "_a"])[LEAGUE_COLUMNS].reset_index(drop=True)


def _areas(pairs: pd.DataFrame) -> dict[str, float]:
    """Each press's mean area under H(α) over the common grid, from its comparison with the most shared instances."""
    out: dict[str, tuple[int, float]] = {}
    for r in pairs.to_dict(orient="records"):
        for side in ("a", "b"):
            press, area, n = r[f"press_{side}"], r[f"area_{side}"], int(r["n_shared"])
            if _is_num(area) and n > out.get(press, (-1, 0.0))[0]:
                out[press] = (n, float(area))
    return {p: v for p, (_, v) in out.items()}
