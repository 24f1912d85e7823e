"""Failure decomposition: erasure (the answer is gone) against rigidity (it survives, yet is not used).

* A **failure** is a scored cell whose ``outcome`` is not ``correct`` (listed, distractor, abstained,
  partial or fabricated; see kvroute.metrics.hallucination). It is not an F1 threshold: a sentence
  answer that contains the gold ("She was born in Velkirra.", F1 ≈ 0.3–0.4) is correct. Cells
  without an outcome (e.g. cells that errored) are not scored and are left out.
* GER is **undefined** for a cell when ``ger_all_layers`` is missing/NaN (unanswerable items, answers
  that never occur in the context) or its ``evidence`` is ``"none"``. Such failures are their own
  class, ``undefined`` — never "retained", and never matched into a GER bin.
* A failure with defined GER is **erasure** when the answer was globally evicted —
  ``ger_all_layers >= ger_threshold`` (1.0 by default: every answer token gone from every head of
  every layer) — and **retained** otherwise: some head still holds an answer token, so routing, not
  retention, failed. Retained failures are the *candidates* for representational rigidity.
* Shares of failures (erased / retained / undefined) come with percentile intervals from an
  instance-clustered bootstrap (kvroute.analysis.bootstrap): instances are resampled with all
  their cells of the group, and each replicate's share is its erased (…) count over its failures.
* **Rigidity check** for retained failures: their per-layer sink-free consensus and agreement ρ
  (``consensus_nosink``/``rho_nosink``, argmax after the attention-sink positions) against
  successes (``outcome == "correct"``, GER defined) at the same ratio with matched GER. Cells are
  binned by ``ger`` (``ger_bins``); cells without a GER are in no bin. Inside each bin the
  failures' and successes' mean vectors are compared, and bins are weighted by the number of
  failures (so successes are re-weighted to the failures' GER distribution). Lower consensus /
  higher ρ in failures means their heads agree more: rigidity.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from kvroute.analysis.bootstrap import boot_means, percentile_interval, resample_weights
from kvroute.analysis.common import (
    PRESS_KEYS,
    as_key,
    attach_baseline,
    group_seed,
    has_columns,
    require_columns,
    stack_vectors,
)

GER_BINS: tuple[float, ...] = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)
#: the classes a failure falls into, in the order of the share columns
FAILURE_CLASSES: tuple[str, ...] = ("erasure", "retained", "undefined")


def scored_mask(df: pd.DataFrame) -> pd.Series:
    """True where a cell has an outcome (it was scored)."""
    require_columns(df, ["outcome"], "the failure decomposition")
    return df["outcome"].notna()


def failure_mask(df: pd.DataFrame) -> pd.Series:
    """True where a scored cell failed: its ``outcome`` is anything but ``correct``."""
    return scored_mask(df) & df["outcome"].ne("correct")


def undefined_mask(df: pd.DataFrame, ger_col: str = "ger_all_layers") -> pd.Series:
    """True where GER is undefined: ``ger_col`` missing/NaN, or ``evidence == "none"``."""
    require_columns(df, [ger_col], "the erasure/retention split")
    undefined = pd.to_numeric(df[ger_col], errors="coerce").isna()
    if "evidence" in df.columns:
        undefined |= df["evidence"].eq("none")
    return undefined


def erasure_mask(df: pd.DataFrame, ger_threshold: float = 1.0, ger_col: str = "ger_all_layers") -> pd.Series:
    """True where the answer was globally evicted (False where GER is undefined; see :func:`undefined_mask`)."""
    undefined = undefined_mask(df, ger_col)
    return pd.to_numeric(df[ger_col], errors="coerce").ge(ger_threshold) & ~undefined


def failure_classes(df: pd.DataFrame, ger_threshold: float = 1.0, ger_col: str = "ger_all_layers") -> pd.Series:
    """Per cell: ``erasure``, ``retained`` or ``undefined`` for failures, ``success`` for correct cells and
    None for unscored cells."""
    fail, undefined = failure_mask(df), undefined_mask(df, ger_col)
    erased = erasure_mask(df, ger_threshold, ger_col)
    out = pd.Series("retained", index=df.index, dtype=object)
    out[erased] = "erasure"
    out[undefined] = "undefined"
    out[~fail] = "success"
    out[~scored_mask(df)] = None
    return out


def share_intervals(instance_ids: pd.Series, classes: pd.Series, *, n_boot: int = 1000, confidence: float = 0.95,
                    rng: np.random.Generator) -> dict[str, tuple[float, float]]:
    """Instance-clustered percentile intervals of each class's share of the failures.

    ``classes`` holds :func:`failure_classes` values for the cells of one group. Returns
    ``{class: (low, high)}`` for :data:`FAILURE_CLASSES` (NaN bounds when there are no failures).
    """
    cls = classes.to_numpy()
    if not np.isin(cls, FAILURE_CLASSES).any():
        return {c: (np.nan, np.nan) for c in FAILURE_CLASSES}
    onehot = pd.DataFrame({c: (cls == c).astype(float) for c in FAILURE_CLASSES})
    per = onehot.groupby(instance_ids.to_numpy(), sort=True).sum()  # [I, 3]: failures of each class per instance
    sums = per.to_numpy(float)
    counts = np.repeat(sums.sum(axis=1, keepdims=True), len(FAILURE_CLASSES), axis=1)
    reps = boot_means(sums, counts, resample_weights(len(per), n_boot, rng))
    lo, hi = percentile_interval(reps, confidence)
    return {c: (float(lo[j]), float(hi[j])) for j, c in enumerate(FAILURE_CLASSES)}


def failure_decomposition(df: pd.DataFrame, *, ger_threshold: float = 1.0, keys: Sequence[str] = PRESS_KEYS,
                          n_boot: int = 1000, confidence: float = 0.95, seed: int = 0) -> pd.DataFrame:
    """Per (group, ratio): failure rate split into erasure, retained and undefined-GER failures.

    Columns: ``n_cells`` (scored cells), ``n_failures``, ``failure_rate``, ``n_erasure``,
    ``n_retained``, ``n_undefined``; ``erasure_share``/``retained_share``/``undefined_share`` (of
    failures; they add up to 1) each with ``_low``/``_high`` instance-bootstrap bounds;
    ``erasure_rate``/``retained_rate``/``undefined_rate`` (of all scored cells; they add up to
    ``failure_rate``); and ``dominant``: ``erasure``, ``retained`` or ``tie`` between the failures
    with defined GER, ``undefined`` when every failure has undefined GER, ``none`` without failures.
    """
    keys = list(keys)
    data = attach_baseline(df)
    data = data.assign(_class=failure_classes(data, ger_threshold))
    data = data[data["_class"].notna()]
    rows = []
    for key, g in data.groupby([*keys, "ratio"], sort=True):
        n = len(g)
        counts = {c: int((g["_class"] == c).sum()) for c in FAILURE_CLASSES}
        nf = sum(counts.values())
        ne, nr, nu = counts["erasure"], counts["retained"], counts["undefined"]
        if nf == 0:
            dominant = "none"
        elif ne + nr == 0:
            dominant = "undefined"
        else:
            dominant = "erasure" if ne > nr else "retained" if nr > ne else "tie"
        ci = share_intervals(g["instance_id"], g["_class"], n_boot=n_boot, confidence=confidence,
                             rng=group_seed(seed, ("decomposition", key)))
        row = {**as_key([*keys, "ratio"], key), "n_cells": n, "n_failures": nf, "failure_rate": nf / n,
               "n_erasure": ne, "n_retained": nr, "n_undefined": nu}
        for c in FAILURE_CLASSES:
            row[f"{c}_share"] = counts[c] / nf if nf else None
            row[f"{c}_share_low"] = ci[c][0] if nf else None
            row[f"{c}_share_high"] = ci[c][1] if nf else None
        for c in FAILURE_CLASSES:
            row[f"{c}_rate"] = counts[c] / n
        row["dominant"] = dominant
        rows.append(row)
    return pd.DataFrame(rows)


def _matched_means(vf: np.ndarray, vs: np.ndarray, bf: np.ndarray,
                   bs: np.ndarray) -> tuple[np.ndarray, np.ndarray, int, int]:
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


def rigidity_comparison(df: pd.DataFrame, *, ger_threshold: float = 1.0, ger_bins: Sequence[float] = GER_BINS,
                        vector_cols: Sequence[str] = ("consensus_nosink", "rho_nosink"),
                        keys: Sequence[str] = PRESS_KEYS) -> pd.DataFrame:
    """Retained failures against GER-matched successes at the same ratio, per (group, ratio > 0).

    Only cells with a defined GER take part: undefined-GER failures are not retained failures, and
    cells whose ``ger`` is missing are in no bin (neither side is matched on a made-up GER of 0).
    For each vector column ``c`` present: ``c_fail`` and ``c_success`` (layer means of the matched
    means), ``c_delta`` (fail − success) and ``c_delta_layers`` (the per-layer difference, a list).
    Also ``n_retained_failures``, ``n_matched_failures``, ``n_matched_successes``.
    """
    keys = list(keys)
    data = attach_baseline(df)
    require_columns(data, ["ger"], "the rigidity comparison (GER matching)")
    cols = [c for c in vector_cols if has_columns(data, [c])]
    data = data.assign(_class=failure_classes(data, ger_threshold))
    data = data[(data["ratio"] > 0) & data["_class"].isin(("retained", "success"))].copy()
    ger = pd.to_numeric(data["ger"], errors="coerce")
    data = data[ger.notna()].copy()
    edges = np.asarray(ger_bins, float)
    data["_bin"] = np.clip(np.digitize(ger[ger.notna()].to_numpy(float), edges[1:-1]), 0, len(edges) - 2)
    rows = []
    for key, g in data.groupby([*keys, "ratio"], sort=True):
        fail = g[g["_class"] == "retained"]
        succ = g[g["_class"] == "success"]
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
