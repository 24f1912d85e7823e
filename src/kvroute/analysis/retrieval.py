"""Retrieval heads per model, the answer's survival in them, and whether that predicts hallucination within a ratio
better than GER does.

Scores (Wu et al. 2024): over a model's full-cache records, head (ℓ, h)'s retrieval score is the sum of its
``retrieval_hits`` over the sum of ``retrieval_events`` — the share of copied answer tokens generated while
it attended most to that token in the answer; retrieval heads score at least :data:`THRESHOLD`. A compressed
cell's retrieval survival is the mean, over the retrieval heads, of the share of answer tokens their KV head
keeps (``answer_kept_heads``; query head h reads KV head h // G).

The comparison is within ratio, as the GER link is: per ratio, the AUC of each predictor for hallucination
(1 − retrieval survival; GER), averaged over the ratios weighted by their positive × negative pairs; the
difference (retrieval − GER) gets a 95% interval from a bootstrap over instances. "cannot decide" when the
interval holds 0.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
from scipy.stats import rankdata

from kvroute.analysis.common import AnalysisError, require_columns
from kvroute.metrics.retrieval import MIN_EVENTS, THRESHOLD, RetrievalHeads, select_heads

__all__ = ["MIN_EVENTS", "THRESHOLD", "RetrievalHeads", "retrieval_heads", "retrieval_scores", "retrieval_survival",
           "retrieval_vs_ger"]

def retrieval_scores(df: pd.DataFrame) -> pd.DataFrame:
    """Per model and (layer, query head): summed hits, events and the retrieval score."""
    require_columns(df, ["model", "press", "retrieval_hits", "retrieval_events"], "retrieval heads")
    full = df[(df["press"] == "none") & df["retrieval_hits"].notna()]
    rows = []
    for model, g in full.groupby("model", sort=True):
        hits = np.sum([np.asarray(h, dtype=float) for h in g["retrieval_hits"]], axis=0)  # [L, H]
        events = int(pd.to_numeric(g["retrieval_events"]).sum())
        for (layer, head), k in np.ndenumerate(hits):
            rows.append({"model": model, "layer": layer, "head": head, "hits": float(k), "events": events,
                         "score": float(k) / events if events else float("nan")})
    return pd.DataFrame(rows, columns=["model", "layer", "head", "hits", "events", "score"])


def retrieval_heads(scores: pd.DataFrame, threshold: float = THRESHOLD) -> dict[str, RetrievalHeads]:
    """Per model with at least :data:`MIN_EVENTS` copying events: its retrieval heads
    (:func:`kvroute.metrics.retrieval.select_heads`, the rule a sweep's ``@heads:retrieval`` uses too)."""
    out = {}
    for model, g in scores.groupby("model", sort=True):
        hits = np.zeros((int(g["layer"].max()) + 1, int(g["head"].max()) + 1))
        hits[g["layer"].to_numpy(int), g["head"].to_numpy(int)] = g["hits"].to_numpy(float)
        rh = select_heads(hits, int(g["events"].iloc[0]), threshold)
        if rh is not None:
            out[str(model)] = rh
    return out


def retrieval_survival(df: pd.DataFrame, heads: dict[str, RetrievalHeads]) -> pd.Series:
    """Per record: the mean share of the answer's tokens kept by the KV heads of its model's retrieval heads (NaN
    without retrieval heads or answer tokens)."""
    require_columns(df, ["model", "answer_kept_heads"], "retrieval survival")
    out = np.full(len(df), np.nan)
    for i, (model, kept) in enumerate(zip(df["model"], df["answer_kept_heads"], strict=True)):
        rh = heads.get(str(model))
        if rh is None or not rh.heads or not isinstance(kept, list | tuple | np.ndarray):
            continue
        k = np.asarray(kept, dtype=float)  # [L, Hkv]
        group = rh.num_heads // k.shape[1]  # query heads per KV head
        out[i] = float(np.mean([k[layer, head // group] for layer, head in rh.heads]))
    return pd.Series(out, index=df.index)


def _stratified_auc(y: np.ndarray, x: np.ndarray, strata: np.ndarray) -> float:
    """AUC of ``x`` for ``y`` within each stratum (ties count half), averaged with weights n_pos · n_neg."""
    num = den = 0.0
    for s in np.unique(strata):
        m = strata == s
        ys, xs = y[m], x[m]
        pos, neg = int(ys.sum()), int((~ys).sum())
        if pos == 0 or neg == 0:
            continue
        r = rankdata(xs)
        auc = (r[ys].sum() - pos * (pos + 1) / 2) / (pos * neg)
        num += auc * pos * neg
        den += pos * neg
    return num / den if den else float("nan")


def retrieval_vs_ger(df: pd.DataFrame, *, n_boot: int = 1000, seed: int = 0) -> pd.DataFrame:
    """Per model: retrieval heads found, and the within-ratio AUC for hallucination of 1 − retrieval survival and of
    GER over the compressed cells where both are defined, their difference with a 95% instance-bootstrap interval,
    and a verdict."""
    cols = ["model", "retrieval_heads", "events", "cells", "auc_retrieval", "auc_ger", "delta", "low", "high",
            "verdict"]
    try:
        scores = retrieval_scores(df)
    except AnalysisError:
        return pd.DataFrame(columns=cols)
    heads = retrieval_heads(scores)
    rows: list[dict[str, Any]] = []
    rng = np.random.default_rng(seed)
    for model, rh in heads.items():
        d = df[(df["model"] == model) & (df["ratio"] > 0)].copy()
        d["survival"] = retrieval_survival(d, {model: rh})
        d = d.dropna(subset=["survival", "ger", "hallucinated"])
        row: dict[str, Any] = {"model": model, "retrieval_heads": len(rh.heads), "events": rh.events, "cells": len(d)}
        if len(d) < 10 or not rh.heads:
            rows.append({**row, "verdict": "too few data" if rh.heads else "no retrieval heads"})
            continue
        y = d["hallucinated"].astype(bool).to_numpy()
        xr, xg = 1 - d["survival"].to_numpy(float), d["ger"].to_numpy(float)
        strata = d["ratio"].to_numpy()
        a_r, a_g = _stratified_auc(y, xr, strata), _stratified_auc(y, xg, strata)
        inst = d["instance_id"].to_numpy()
        ids = np.unique(inst)
        where = {i: np.flatnonzero(inst == i) for i in ids}
        deltas = []
        for _ in range(n_boot):
            take = np.concatenate([where[i] for i in rng.choice(ids, size=len(ids), replace=True)])
            deltas.append(_stratified_auc(y[take], xr[take], strata[take])
                          - _stratified_auc(y[take], xg[take], strata[take]))
        lo, hi = np.nanpercentile(deltas, [2.5, 97.5]) if np.isfinite(deltas).any() else (np.nan, np.nan)
        verdict = ("retrieval survival predicts better" if lo > 0 else "GER predicts better" if hi < 0
                   else "cannot decide")
        rows.append({**row, "auc_retrieval": a_r, "auc_ger": a_g, "delta": a_r - a_g, "low": float(lo),
                     "high": float(hi), "verdict": verdict})
    return pd.DataFrame(rows, columns=cols)
