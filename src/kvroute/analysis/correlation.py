"""The GER–hallucination link.

* Across ratios: for each (model, press, regime, family) curve, the mean GER and the
  hallucination rate at each tested ratio (baseline included) give one point per ratio; Pearson
  and Spearman r with their two-sided p-values are computed over those points (scipy.stats).
* Per instance: among compressed cells (ratio > 0), P(hallucinated | answer globally evicted)
  against P(hallucinated | not). "Globally evicted" means ``ger_all_layers >= threshold`` with
  ``threshold = 1.0`` by default: *every* answer token is gone from every head of every layer.
  Fisher's exact test gives a p-value; it treats cells as independent, which they are not quite
  (one instance contributes a cell per ratio), so read it as a guide.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import numpy as np
import pandas as pd

from kvroute.analysis.common import CURVE_KEYS, as_key, attach_baseline, pooled, require_columns

GLOBAL_EVICTION_THRESHOLD = 1.0


def correlate(x: Sequence[float], y: Sequence[float]) -> dict[str, object]:
    """Pearson and Spearman r (with p-values) of paired finite values; None and a reason when undefined."""
    from scipy import stats

    xa, ya = np.asarray(x, float), np.asarray(y, float)
    ok = np.isfinite(xa) & np.isfinite(ya)
    xs, ys = xa[ok], ya[ok]
    out: dict[str, object] = {"n_points": int(len(xs)), "pearson_r": None, "pearson_p": None,
                              "spearman_r": None, "spearman_p": None, "note": ""}
    if len(xs) < 3:
        out["note"] = f"need at least 3 ratios with both values, got {len(xs)}"
        return out
    if np.ptp(xs) == 0 or np.ptp(ys) == 0:
        out["note"] = "one of the series is constant; r is undefined"
        return out
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pr, pp = stats.pearsonr(xs, ys)
        sr, sp = stats.spearmanr(xs, ys)
    out.update(pearson_r=float(pr), pearson_p=float(pp), spearman_r=float(sr), spearman_p=float(sp))
    return out


def ger_hallucination_correlation(df: pd.DataFrame, *, ger_col: str = "ger", value_col: str = "hallucinated",
                                  keys: Sequence[str] = CURVE_KEYS, pool_families: bool = True) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Correlation of mean GER and hallucination rate across the ratio grid, per group of ``keys``.

    Returns ``(points, table)``: ``points`` has one row per (group, ratio) with ``ger`` and ``h``;
    ``table`` one row per group with ``n_points``, ``pearson_r``/``_p``, ``spearman_r``/``_p``, ``note``.
    """
    keys = list(keys)
    data = attach_baseline(df)
    require_columns(data, [ger_col, value_col, *keys], "the GER–hallucination correlation")
    if pool_families and "family" in keys:
        data = pooled(data)
    data = data.assign(_g=pd.to_numeric(data[ger_col], errors="coerce"),
                       _h=pd.to_numeric(data[value_col], errors="coerce").astype(float))
    points = (data.groupby([*keys, "ratio"], sort=True).agg(ger=("_g", "mean"), h=("_h", "mean"), n_cells=("_h", "count"))
              .reset_index())
    rows = [{**as_key(keys, key), **correlate(g["ger"], g["h"])} for key, g in points.groupby(keys, sort=True)]
    return points, pd.DataFrame(rows)


def conditional_hallucination(df: pd.DataFrame, *, threshold: float = GLOBAL_EVICTION_THRESHOLD,
                              ger_col: str = "ger_all_layers", value_col: str = "hallucinated",
                              keys: Sequence[str] = CURVE_KEYS, by_ratio: bool = False,
                              pool_families: bool = True) -> pd.DataFrame:
    """P(hallucinated | globally evicted) vs P(hallucinated | not), over compressed cells, per group.

    Columns: ``n_evicted``, ``p_h_evicted``, ``n_kept``, ``p_h_kept``, ``difference``,
    ``risk_ratio``, ``fisher_p`` (None where a side is empty). ``by_ratio`` adds ``ratio`` to the keys.
    """
    from scipy import stats

    keys = list(keys) + (["ratio"] if by_ratio else [])
    data = attach_baseline(df)
    require_columns(data, [ger_col, value_col, *keys], "P(hallucination | global eviction)")
    if pool_families and "family" in keys:
        data = pooled(data)
    data = data[(data["ratio"] > 0) & data[ger_col].notna() & data[value_col].notna()]
    rows = []
    for key, g in data.groupby(keys, sort=True):
        ev = pd.to_numeric(g[ger_col], errors="coerce").to_numpy(float) >= threshold
        h = g[value_col].astype(bool).to_numpy()
        a, b = int((ev & h).sum()), int((ev & ~h).sum())
        c, d = int((~ev & h).sum()), int((~ev & ~h).sum())
        p1 = a / (a + b) if a + b else None
        p0 = c / (c + d) if c + d else None
        fisher = float(stats.fisher_exact([[a, b], [c, d]])[1]) if (a + b) and (c + d) else None
        rows.append({**as_key(keys, key), "n_evicted": a + b, "p_h_evicted": p1, "n_kept": c + d, "p_h_kept": p0,
                     "difference": None if p1 is None or p0 is None else p1 - p0,
                     "risk_ratio": None if p1 is None or not p0 else p1 / p0, "fisher_p": fisher})
    cols = [*keys, "n_evicted", "p_h_evicted", "n_kept", "p_h_kept", "difference", "risk_ratio", "fisher_p"]
    return pd.DataFrame(rows, columns=cols)
