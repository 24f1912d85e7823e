"""Failure decomposition: erasure (the answer is gone) against rigidity (it survives, yet is not used).

* A **failure** is a cell that hallucinated or whose F1 is below ``f1_threshold`` (0.5 by default;
  abstentions on answerable items count as failures through their F1 of 0).
* A failure is **erasure** when the answer was globally evicted — ``ger_all_layers >= ger_threshold``
  (1.0 by default: every answer token gone from every head of every layer) — and **retained**
  otherwise: some head still holds an answer token, so routing, not retention, failed. Retained
  failures are the *candidates* for representational rigidity.
* **Rigidity check** for retained failures: their per-layer consensus and agreement ρ against
  successes at the same ratio with matched GER. Cells are binned by ``ger`` (``ger_bins``); inside
  each bin the failures' and successes' mean vectors are compared, and bins are weighted by the
  number of failures (so successes are re-weighted to the failures' GER distribution). Lower
  consensus / higher ρ in failures means their heads agree more: rigidity.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from kvroute.analysis.common import PRESS_KEYS, as_key, attach_baseline, has_columns, require_columns, stack_vectors

FAILURE_F1_THRESHOLD = 0.5
GER_BINS: tuple[float, ...] = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)


def failure_mask(df: pd.DataFrame, f1_threshold: float = FAILURE_F1_THRESHOLD) -> pd.Series:
    """True where a cell failed: hallucinated, or F1 below ``f1_threshold`` (either column may be absent)."""
    if not has_columns(df, ["hallucinated"]) and not has_columns(df, ["f1"]):
        require_columns(df, ["hallucinated", "f1"], "the failure decomposition")
    fail = pd.Series(False, index=df.index)
    if "hallucinated" in df.columns:
        fail |= df["hallucinated"].fillna(False).astype(bool)
    if "f1" in df.columns:
        fail |= pd.to_numeric(df["f1"], errors="coerce").lt(f1_threshold).fillna(False)
    return fail


def erasure_mask(df: pd.DataFrame, ger_threshold: float = 1.0, ger_col: str = "ger_all_layers") -> pd.Series:
    """True where the answer was globally evicted."""
    require_columns(df, [ger_col], "the erasure/retention split")
    return pd.to_numeric(df[ger_col], errors="coerce").ge(ger_threshold).fillna(False)


def failure_decomposition(df: pd.DataFrame, *, f1_threshold: float = FAILURE_F1_THRESHOLD, ger_threshold: float = 1.0,
                          keys: Sequence[str] = PRESS_KEYS) -> pd.DataFrame:
    """Per (group, ratio): failure rate split into erasure and retained failures.

    Columns: ``n_cells``, ``n_failures``, ``failure_rate``, ``n_erasure``, ``n_retained``,
    ``erasure_share``/``retained_share`` (of failures), ``erasure_rate``/``retained_rate`` (of all
    cells; they add up to ``failure_rate``) and ``dominant`` (``erasure``, ``retained`` or ``none``).
    """
    keys = list(keys)
    data = attach_baseline(df)
    data = data.assign(_fail=failure_mask(data, f1_threshold), _erase=erasure_mask(data, ger_threshold))
    rows = []
    for key, g in data.groupby([*keys, "ratio"], sort=True):
        n, nf = len(g), int(g["_fail"].sum())
        ne = int((g["_fail"] & g["_erase"]).sum())
        nr = nf - ne
        dominant = "none" if nf == 0 else "erasure" if ne > nr else "retained" if nr > ne else "tie"
        rows.append({**as_key([*keys, "ratio"], key), "n_cells": n, "n_failures": nf, "failure_rate": nf / n,
                     "n_erasure": ne, "n_retained": nr,
                     "erasure_share": ne / nf if nf else None, "retained_share": nr / nf if nf else None,
                     "erasure_rate": ne / n, "retained_rate": nr / n, "dominant": dominant})
    return pd.DataFrame(rows)


def _matched_means(vf: np.ndarray, vs: np.ndarray, bf: np.ndarray, bs: np.ndarray) -> tuple[np.ndarray, np.ndarray, int, int]:
    """Failure-weighted means over GER bins present in both groups: ``(fail [L], success [L], n_f, n_s)``."""
    width = max(vf.shape[1] if vf.size else 0, vs.shape[1] if vs.size else 0)
    num_f, num_s, wsum, nf, ns = np.zeros(width), np.zeros(width), 0.0, 0, 0
    for b in np.intersect1d(bf, bs):
        f, s = vf[bf == b], vs[bs == b]
        w = len(f)
        num_f += w * np.nanmean(f, axis=0)
        num_s += w * np.nanmean(s, axis=0)
        wsum += w
        nf, ns = nf + len(f), ns + len(s)
    if wsum == 0:
        return np.full(width, np.nan), np.full(width, np.nan), 0, 0
    return num_f / wsum, num_s / wsum, nf, ns


def rigidity_comparison(df: pd.DataFrame, *, f1_threshold: float = FAILURE_F1_THRESHOLD, ger_threshold: float = 1.0,
                        ger_bins: Sequence[float] = GER_BINS, vector_cols: Sequence[str] = ("consensus", "rho"),
                        keys: Sequence[str] = PRESS_KEYS) -> pd.DataFrame:
    """Retained failures against GER-matched successes at the same ratio, per (group, ratio > 0).

    For each vector column ``c`` present: ``c_fail`` and ``c_success`` (layer means of the matched
    means), ``c_delta`` (fail − success) and ``c_delta_layers`` (the per-layer difference, a list).
    Also ``n_retained_failures``, ``n_matched_failures``, ``n_matched_successes``.
    """
    keys = list(keys)
    data = attach_baseline(df)
    require_columns(data, ["ger"], "the rigidity comparison (GER matching)")
    cols = [c for c in vector_cols if has_columns(data, [c])]
    data = data[data["ratio"] > 0].assign(_fail=failure_mask(data, f1_threshold), _erase=erasure_mask(data, ger_threshold))
    edges = np.asarray(ger_bins, float)
    data["_bin"] = np.clip(np.digitize(pd.to_numeric(data["ger"], errors="coerce").fillna(0), edges[1:-1]), 0, len(edges) - 2)
    rows = []
    for key, g in data.groupby([*keys, "ratio"], sort=True):
        fail = g[g["_fail"] & ~g["_erase"]]
        succ = g[~g["_fail"]]
        row: dict[str, object] = {**as_key([*keys, "ratio"], key), "n_retained_failures": len(fail),
                                  "n_matched_failures": 0, "n_matched_successes": 0}
        for c in cols:
            mf, ms, nf, ns = _matched_means(stack_vectors(fail[c]), stack_vectors(succ[c]),
                                            fail["_bin"].to_numpy(), succ["_bin"].to_numpy())
            row.update({f"{c}_fail": _mean(mf), f"{c}_success": _mean(ms), f"{c}_delta": _mean(mf - ms),
                        f"{c}_delta_layers": (mf - ms).tolist() if nf else None,
                        "n_matched_failures": nf, "n_matched_successes": ns})
        rows.append(row)
    return pd.DataFrame(rows)


def _mean(v: np.ndarray) -> float | None:
    return float(np.nanmean(v)) if v.size and np.isfinite(v).any() else None
