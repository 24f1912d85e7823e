"""Retention, accessibility and utilization side by side per ratio; breakdowns; layer-wise profiles.

Per (model, press, regime, ratio), pooled over families:

* retention = 1 − mean GER (``retention``), and 1 − mean ``ger_evidence`` (``retention_evidence``);
* accessibility = mean ``evidence_attention_mass`` / mean ``evidence_attention_mass_full`` (a ratio
  of means, steadier than a mean of per-cell ratios when the full mass is small),
  ``reachable`` share, ``routed_reachable`` share;
* utilization = mean ``f1``, mean ``exact``, mean ``gold_logprob_delta``, hallucination rate.

Columns the records lack are simply left out.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from kvroute.analysis.common import PRESS_KEYS, as_key, attach_baseline, has_columns, require_columns, stack_vectors

_MEANS = {"ger": "ger", "ger_evidence": "ger_evidence", "reachable": "reachability", "routed_reachable": "routed_reachability",
          "f1": "f1", "exact": "exact", "gold_logprob_delta": "logprob_delta", "hallucinated": "hallucination",
          "evidence_attention_mass": "_mass", "evidence_attention_mass_full": "_mass_full"}


def _numeric(s: pd.Series) -> pd.Series:
    return pd.to_numeric(s.astype(float) if s.dtype == bool else s, errors="coerce")


def routing_curves(df: pd.DataFrame, *, keys: Sequence[str] = PRESS_KEYS) -> pd.DataFrame:
    """One row per (group, ratio) with the retention / accessibility / utilization means that exist."""
    keys = list(keys)
    data = attach_baseline(df)
    present = {c: name for c, name in _MEANS.items() if has_columns(data, [c])}
    num = pd.DataFrame({name: _numeric(data[c]) for c, name in present.items()}, index=data.index)
    num[[*keys, "ratio"]] = data[[*keys, "ratio"]]
    out = num.groupby([*keys, "ratio"], sort=True).mean(numeric_only=True)
    out["n_cells"] = num.groupby([*keys, "ratio"], sort=True).size()
    out = out.reset_index()
    if "ger" in out:
        out["retention"] = 1 - out["ger"]
    if "ger_evidence" in out:
        out["retention_evidence"] = 1 - out["ger_evidence"]
    if "_mass" in out and "_mass_full" in out:
        with np.errstate(all="ignore"):
            out["accessibility"] = out["_mass"] / out["_mass_full"].where(out["_mass_full"] > 0)
    return out.drop(columns=[c for c in ("_mass", "_mass_full") if c in out])


def breakdown(df: pd.DataFrame, by: str, *, keys: Sequence[str] = ("model", "press"),
              values: Sequence[str] = ("f1", "hallucinated")) -> pd.DataFrame:
    """Means of ``values`` per (keys, ratio, ``by``), e.g. ``by="answer_type"`` or ``"question_type"``."""
    data = attach_baseline(df)
    require_columns(data, [by, *keys], f"the breakdown by {by}")
    vals = [v for v in values if has_columns(data, [v])]
    num = pd.DataFrame({v: _numeric(data[v]) for v in vals}, index=data.index)
    num[[*keys, "ratio", by]] = data[[*keys, "ratio", by]]
    grouped = num.groupby([*keys, "ratio", by], sort=True)
    out = grouped.mean(numeric_only=True)
    out["n_cells"] = grouped.size()
    return out.reset_index()


def layer_profiles(df: pd.DataFrame, col: str = "consensus", *, keys: Sequence[str] = PRESS_KEYS) -> pd.DataFrame:
    """Mean per-layer vector of ``col`` per (group, ratio), tidy: one row per (group, ratio, layer).

    Columns: the keys, ``ratio``, ``layer`` (0-based), ``value`` (mean over cells), ``n_cells``.
    """
    keys = list(keys)
    data = attach_baseline(df)
    require_columns(data, [col], f"the layer-wise {col} profile")
    rows = []
    for key, g in data[data[col].notna()].groupby([*keys, "ratio"], sort=True):
        v = stack_vectors(g[col])  # [cells, L]
        if v.size == 0:
            continue
        with np.errstate(all="ignore"):
            mean = np.nanmean(v, axis=0)  # [L]
        k = as_key([*keys, "ratio"], key)
        rows += [{**k, "layer": layer, "value": float(m), "n_cells": len(g)} for layer, m in enumerate(mean)]
    return pd.DataFrame(rows, columns=[*keys, "ratio", "layer", "value", "n_cells"])
