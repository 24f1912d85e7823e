"""What the server costs: each press against its own serving-constrained variants, paired on the same instances.

A constrained variant (``snapkv+paged[block=16]+uniform``, :mod:`kvroute.presses.constraints`) keeps exactly
its press's budget, so the two differ only in *which* entries they keep: the question is paired. For every
(model, regime), every press ``p`` present unconstrained and every variant ``v`` of it in the records:

* **Δ area** = mean over shared instances of ``A_iv − A_ip``, the press league's paired rule
  (:mod:`kvroute.analysis.paired`: the normalised trapezoid area under each instance's hallucination flags
  over the common ratio grid), with a paired instance-bootstrap interval and the within-instance sign-flip
  p-value, Holm-adjusted over every variant of the (model, regime). Positive: the constraint hallucinates
  more — the server's cost. A variant is *decided* when its adjusted p ≤ 1 − confidence.
* **Δ area GER**: the same paired rule on each instance's area under GER (the share of the evidence evicted
  from every head) over the grid — instances whose GER is undefined left out — with its own interval,
  sign-flip p-value and Holm adjustment over the variants: the routing side of the cost, decided on its own
  (a constraint can evict the evidence more while the answers change too little to decide).
* **ΔH** and **ΔGER** at each ratio: mean paired differences of the hallucination flag and of GER, with
  paired instance-bootstrap intervals (display; the decisions are the areas').
* **Detection**: per press and head layout (per head, head-uniform), the smallest page size whose variant
  is decided costlier (``uniform`` alone is page size 1: token granularity).

Each variant gets a finding sentence written here ("snapkv at page size 16, head-uniform, hallucinates
+0.05 [+0.02, +0.08] more over the ratio grid …" or "cannot decide …"); :func:`serving_findings` collects them.
Validated on planted costs and a zero-cost control in :mod:`kvroute.analysis.planted.serving`.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pandas as pd

from kvroute.analysis.bootstrap import percentile_interval, resample_weights
from kvroute.analysis.common import BASELINE_PRESS, AnalysisError, attach_baseline, group_seed, require_columns
from kvroute.analysis.paired import compare_pair, holm, instance_areas, paired_sentence

PAIR_COLUMNS = ["model", "regime", "press", "variant", "constrained", "page", "uniform", "n_shared", "n_ratios",
                "area", "area_constrained", "difference", "difference_low", "difference_high", "p_value", "p_holm",
                "decided", "ger_n", "ger_difference", "ger_difference_low", "ger_difference_high", "ger_p_holm",
                "ger_decided", "finding"]
RATIO_COLUMNS = ["model", "regime", "press", "variant", "ratio", "n", "dh", "dh_low", "dh_high", "dger", "dger_low",
                 "dger_high"]
DETECT_COLUMNS = ["model", "regime", "press", "layout", "pages_tested", "smallest_detected", "finding"]


def split_press(name: str) -> tuple[str, str]:
    """``(press, variant)`` of a record's press name: ``snapkv+paged[block=16]+uniform`` → ``(snapkv,
    paged[block=16]+uniform)``; an unconstrained press has variant ``""``."""
    from kvroute.presses.spec import PressSpec, parse_press

    try:
        ps = parse_press(name)
    except Exception:  # a name this version cannot read: no variant
        return name, ""
    return str(PressSpec(ps.scorer, ps.selection)), "+".join(str(c) for c in ps.constraints)


def has_constrained(presses: Any) -> bool:
    """Whether any of the press names carries a serving constraint."""
    return any(split_press(str(p))[1] for p in presses)


def variant_layout(variant: str) -> tuple[int, bool]:
    """``(page size, head-uniform)`` of a variant string: ``paged[block=16]+uniform`` → ``(16, True)``;
    no ``paged`` is page size 1 (tokens); ``paged`` without ``block`` the default 16."""
    m = re.search(r"paged(?:\[([^\]]*)\])?", variant)
    page = 1
    if m:
        params = dict(kv.split("=", 1) for kv in (m.group(1) or "").split(",") if "=" in kv)
        page = int(params.get("block", 16))
    return page, bool(re.search(r"(^|\+)uniform\b", variant))


def _layout_text(page: int, uniform: bool) -> str:
    """``at page size 16, head-uniform`` / ``at page size 64, per head`` / ``head-uniform, token by token``."""
    head = "head-uniform" if uniform else "per head"
    return f"at page size {page}, {head}" if page > 1 else f"{head}, token by token"


def _paired(d: np.ndarray, n_boot: int, confidence: float, rng: np.random.Generator) -> tuple[float, float, float]:
    """Mean of ``d`` and its paired instance-bootstrap percentile interval."""
    if len(d) < 2:
        m = float(d.mean()) if len(d) else float("nan")
        return m, float("nan"), float("nan")
    reps = resample_weights(len(d), n_boot, rng) @ d / len(d)
    lo, hi = percentile_interval(reps, confidence)
    return float(d.mean()), float(lo), float(hi)


def _compared(constrained: pd.Series, press: pd.Series, n_boot: int, confidence: float,
              rng: np.random.Generator) -> dict[str, Any]:
    """:func:`~kvroute.analysis.paired.compare_pair` of per-instance areas, constrained − press, with a NaN
    difference and interval where fewer than two instances pair up."""
    out = {"difference_low": float("nan"), "difference_high": float("nan"),
           **compare_pair(constrained, press, n_boot=n_boot, confidence=confidence, rng=rng)}
    if out["difference"] is None:
        out["difference"] = float("nan")
    return out


def _finding(r: dict[str, Any], confidence: float, min_instances: int) -> str:
    who = f"{r['press']} {_layout_text(r['page'], r['uniform'])} ({r['model']}, {r['regime']})"
    iv = (f"{r['difference']:+.3f} [{r['difference_low']:+.3f}, {r['difference_high']:+.3f}] in H over the ratio grid "
          f"(area under H(α), paired on {r['n_shared']} instances, Holm p = {r['p_holm']:.3g})")
    verb = "costs" if r["difference"] > 0 else "gains"
    text = paired_sentence(who, iv, f"the constraint {verb} {iv}", n=r["n_shared"], unit="instances",
                           min_instances=min_instances, decided=r["decided"])
    return text + _ger_clause(r, min_instances)


def _ger_clause(r: dict[str, Any], min_instances: int) -> str:
    """The GER half of a variant's finding ("" when the records have no GER)."""
    n = r.get("ger_n")
    if n is None or r.get("ger_difference") is None or not np.isfinite(r["ger_difference"]):
        return ""
    iv = (f"{r['ger_difference']:+.3f} [{r['ger_difference_low']:+.3f}, {r['ger_difference_high']:+.3f}] in GER over "
          f"the ratio grid (Holm p = {r['ger_p_holm']:.3g}, {n} instances)")
    more = "more" if r["ger_difference"] > 0 else "less"
    return "; " + paired_sentence("GER", iv, f"it evicts the evidence {more}: {iv}", n=n,
                                  unit="instances with a defined GER", min_instances=min_instances,
                                  decided=r["ger_decided"])


def serving_cost(df: pd.DataFrame, *, n_boot: int = 2000, confidence: float = 0.95, seed: int = 0,
                 min_instances: int = 10, per_ratio: bool = True) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """The three tables (``serving_pairs``, ``serving_by_ratio``, ``serving_detect``; see the module docstring).

    ``per_ratio=False`` leaves ``serving_by_ratio`` empty (the planted-truth runs, which check the pairs).

    Raises :class:`AnalysisError` when no press is present both unconstrained and constrained.
    """
    data = attach_baseline(df)
    require_columns(data, ["hallucinated", "instance_id", "ratio", "press", "model", "regime"], "the serving cost")
    data = data[(data["press"] != BASELINE_PRESS) & data["hallucinated"].notna()].copy()
    split = {p: split_press(p) for p in data["press"].unique()}
    data["_base"] = data["press"].map(lambda p: split[p][0])
    data["_variant"] = data["press"].map(lambda p: split[p][1])
    has_ger = "ger" in data.columns
    pairs: list[dict[str, Any]] = []
    by_ratio: list[dict[str, Any]] = []
    for (model, regime), g in data.groupby(["model", "regime"], sort=True):
        group: list[dict[str, Any]] = []
        for base, gb in g.groupby("_base", sort=True):
            plain = gb[gb["_variant"] == ""]
            if plain.empty:
                continue
            for variant, gv in gb[gb["_variant"] != ""].groupby("_variant", sort=True):
                grid = sorted(set(plain["ratio"].astype(float)) & set(gv["ratio"].astype(float)))
                if len(grid) < 2:
                    continue
                rng = group_seed(seed, ("serving", model, regime, base, variant))
                # compare_pair(x, y) pairs x − y: the constrained variant against its press
                h = _compared(instance_areas(gv, grid), instance_areas(plain, grid), n_boot, confidence, rng)
                page, uniform = variant_layout(str(variant))
                row: dict[str, Any] = {
                    "model": model, "regime": regime, "press": base, "variant": variant,
                    "constrained": gv["press"].iloc[0], "page": page, "uniform": uniform, "n_shared": h["n_shared"],
                    "n_ratios": len(grid), "area": h["area_b"], "area_constrained": h["area_a"],
                    "difference": h["difference"], "difference_low": h["difference_low"],
                    "difference_high": h["difference_high"], "p_value": h["p_value"]}
                if has_ger:
                    g = _compared(instance_areas(gv, grid, "ger"), instance_areas(plain, grid, "ger"), n_boot,
                                  confidence, rng)
                    row.update(ger_n=g["n_shared"], ger_difference=g["difference"] if g["n_shared"] else None,
                               ger_difference_low=g["difference_low"], ger_difference_high=g["difference_high"],
                               ger_p_value=g["p_value"])
                group.append(row)
                key = {"model": model, "regime": regime, "press": base, "variant": variant}
                if per_ratio:
                    by_ratio += _by_ratio(plain, gv, grid, has_ger, n_boot=n_boot, confidence=confidence, rng=rng,
                                          key=key)
        if not group:
            continue
        for r, ph in zip(group, holm(np.array([r["p_value"] for r in group])), strict=True):
            r["p_holm"] = float(ph)
            r["decided"] = bool(r["n_shared"] >= min_instances and ph <= 1 - confidence)
        if has_ger:  # its own Holm family: the GER areas of the same variants
            for r, ph in zip(group, holm(np.array([r["ger_p_value"] for r in group])), strict=True):
                r["ger_p_holm"] = float(ph)
                r["ger_decided"] = bool(r["ger_n"] >= min_instances and ph <= 1 - confidence)
        for r in group:
            r["finding"] = _finding(r, confidence, min_instances)
        pairs += group
    if not pairs:
        raise AnalysisError("no press appears both unconstrained and with a serving constraint "
                            "(e.g. snapkv and snapkv+paged[block=16]) at two or more common ratios")
    pt = pd.DataFrame(pairs, columns=PAIR_COLUMNS)
    return pt, pd.DataFrame(by_ratio, columns=RATIO_COLUMNS), detection(pt, min_instances)


def _by_ratio(plain: pd.DataFrame, gv: pd.DataFrame, grid: list[float], has_ger: bool, *, n_boot: int,
              confidence: float, rng: np.random.Generator, key: dict[str, Any]) -> list[dict[str, Any]]:
    """ΔH and ΔGER per ratio of ``grid`` (ratio 0 left out: both sides are the same uncompressed cells)."""
    cols = ["hallucinated", *(["ger"] if has_ger else [])]

    def per_instance(cells: pd.DataFrame) -> pd.DataFrame:
        c = cells.assign(**{k: pd.to_numeric(cells[k], errors="coerce").astype(float) for k in cols})
        return c.groupby(["instance_id", "ratio"])[cols].mean()

    a, b = per_instance(plain), per_instance(gv)
    out = []
    for r in grid:
        if r == 0:
            continue
        try:
            ar, br = a.xs(r, level="ratio"), b.xs(r, level="ratio")
        except KeyError:
            continue
        shared = ar.index.intersection(br.index)
        dh = _paired((br.loc[shared, "hallucinated"] - ar.loc[shared, "hallucinated"]).to_numpy(float), n_boot,
                     confidence, rng)
        row = {**key, "ratio": r, "n": len(shared), "dh": dh[0], "dh_low": dh[1], "dh_high": dh[2]}
        if has_ger:
            dg = (br.loc[shared, "ger"] - ar.loc[shared, "ger"]).dropna().to_numpy(float)
            row.update(zip(("dger", "dger_low", "dger_high"), _paired(dg, n_boot, confidence, rng), strict=True))
        out.append(row)
    return out


def detection(pairs: pd.DataFrame, min_instances: int = 10) -> pd.DataFrame:
    """Per (model, regime, press, head layout): the smallest page size whose variant is decided costlier
    (None: none is; "cannot decide" where every variant has fewer than ``min_instances`` shared instances)."""
    rows = []
    for (model, regime, press, uniform), g in pairs.groupby(["model", "regime", "press", "uniform"], sort=True):
        g = g.sort_values("page")
        pages = [int(p) for p in g["page"]]
        hit = g[g["decided"] & (g["difference"] > 0)]
        smallest = int(hit["page"].iloc[0]) if len(hit) else None
        layout = "head-uniform" if uniform else "per head"
        tested = ", ".join(str(p) for p in pages)
        who = f"{press} ({model}, {regime}), {layout}"
        if smallest is not None:
            finding = (f"{who}: the cost is detectable from page size {smallest} (page sizes tested: {tested}; "
                       "1 = token granularity)")
        elif (g["n_shared"] < min_instances).all():
            finding = f"{who}: cannot decide — fewer than {min_instances} shared instances at every page size"
        else:
            finding = (f"{who}: no page size tested ({tested}; 1 = token granularity) shows a decided cost — "
                       "none detectable at this number of instances")
        rows.append({"model": model, "regime": regime, "press": press, "layout": layout, "pages_tested": tested,
                     "smallest_detected": smallest, "finding": finding})
    return pd.DataFrame(rows, columns=DETECT_COLUMNS)


def serving_findings(pairs: pd.DataFrame, detect: pd.DataFrame) -> list[str]:
    """The finding sentences, variant by variant, then the detection lines."""
    return [*pairs["finding"].astype(str), *detect["finding"].astype(str)]
