"""The redundancy proposition: evidence kept by k heads is reachable with probability 1 − (1 − p)^k.

If each (layer, KV head) that keeps an evidence token independently offers a route with
probability p, evidence kept by k heads is reachable with probability 1 − (1 − p)^k. Each
compressed cell gives one observation (k = ``evidence_heads``, y = ``reachable``); p is fitted by
maximum likelihood per model and the empirical P(reachable | k) is compared with the curve.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from scipy.optimize import minimize_scalar

from kvroute.analysis.common import BASELINE_PRESS, has_columns, wilson

#: k bins: exact counts up to 4, then octaves
_EDGES = [0, 1, 2, 3, 4, 5, 9, 17, 33, 65, 129, 257, 513, 10**9]


def _bin_label(lo: int, hi: int) -> str:
    return str(lo) if hi - lo == 1 else f"{lo}–{hi - 1}"


def fit_p(k: np.ndarray, y: np.ndarray) -> float | None:
    """MLE of p in P(y = 1 | k) = 1 − (1 − p)^k (cells with k = 0 carry no information on p)."""
    m = k > 0
    k, y = k[m].astype(float), y[m].astype(float)
    if len(k) == 0:
        return None

    def nll(p: float) -> float:
        q = np.clip(1 - (1 - p) ** k, 1e-12, 1 - 1e-12)
        return -float(np.sum(y * np.log(q) + (1 - y) * np.log1p(-q)))

    res = minimize_scalar(nll, bounds=(1e-6, 1 - 1e-6), method="bounded")
    return float(res.x)


def redundancy_table(df: pd.DataFrame, *, reach_col: str = "reachable") -> tuple[pd.DataFrame, pd.DataFrame]:
    """(bins, fits): empirical P(reachable | k bin) with Wilson 95% intervals and the fitted curve; p per model."""
    if not has_columns(df, ("evidence_heads", reach_col)):
        return pd.DataFrame(), pd.DataFrame()
    d = df[(df["press"] != BASELINE_PRESS) & (df["ratio"] > 0)].dropna(subset=["evidence_heads", reach_col])
    if d.empty:
        return pd.DataFrame(), pd.DataFrame()
    rows, fits = [], []
    for model, g in d.groupby("model", sort=True):
        k = g["evidence_heads"].to_numpy(dtype=int)
        y = g[reach_col].astype(bool).to_numpy()
        p = fit_p(k, y)
        fits.append({"model": model, "p": p, "n_cells": len(g), "max_k": int(k.max())})
        for lo, hi in zip(_EDGES[:-1], _EDGES[1:], strict=True):
            m = (k >= lo) & (k < hi)
            n = int(m.sum())
            if n == 0:
                continue
            s = int(y[m].sum())
            low, high = wilson(s, n)
            kmid = float(k[m].mean())
            rows.append({"model": model, "k_bin": _bin_label(lo, hi), "k_mean": kmid, "n": n, "p_reach": s / n,
                         "low": low, "high": high,
                         "predicted": (1 - (1 - p) ** kmid) if p is not None else None})
    return pd.DataFrame(rows), pd.DataFrame(fits)
