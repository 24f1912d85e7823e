"""Records grouped by task metadata: the depth × length picture of needle-in-a-haystack runs.

Records carry the instance id but not the instance's ``meta``; :func:`meta_table` joins the task
file's meta (``target_length``, ``depth``, ``evidence``, ...) onto the records and aggregates per
(press, ratio, key…) cell:

- ``n`` records, ``accuracy`` (share with ``outcome == "correct"``), ``f1`` (mean);
- ``ger``, ``reachable``, ``routed_reachable``: means over the records where they are defined;
- ``no_evidence``: records of instances whose answers occur nowhere in the context
  (``meta["evidence"] == "none"``, imported data) — their GER and reachability are undefined, so
  they count in ``n``/``accuracy`` but not in the routing means. Group by ``evidence`` to see them
  apart (``kvroute tasks grid RECORDS --tasks FILE --by evidence``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from kvroute.analysis.common import AnalysisError

GRID_KEYS = ("target_length", "depth")
_ROUTING = ("ger", "reachable", "routed_reachable")


def meta_frame(instances: Sequence[Any], keys: Sequence[str]) -> pd.DataFrame:
    """One row per instance: ``instance_id``, ``evidence`` and the requested meta ``keys``."""
    rows = []
    for inst in instances:
        row = {"instance_id": inst.id, "evidence": inst.meta.get("evidence", "located" if inst.answer_spans
                                                                  else "none")}
        row.update({k: inst.meta.get(k) for k in keys if k != "evidence"})
        rows.append(row)
    return pd.DataFrame(rows, columns=["instance_id", "evidence", *[k for k in keys if k != "evidence"]])


def meta_table(records: pd.DataFrame, instances: Sequence[Any], keys: Sequence[str] = GRID_KEYS) -> pd.DataFrame:
    """Per (press, ratio, *keys) cell: n, accuracy, f1, ger, reachable, routed_reachable, no_evidence."""
    if "instance_id" not in records.columns:
        raise AnalysisError("records have no instance_id column; pass the records a `kvroute run`/sweep wrote")
    meta = meta_frame(instances, keys)
    missing = [k for k in keys if meta[k].isna().all()]
    if missing:
        raise AnalysisError(f"no instance of the task file has meta {', '.join(map(repr, missing))}; "
                            "group by keys the instances record (niah: target_length, depth)")
    df = records.merge(meta, on="instance_id", how="inner", suffixes=("", "_meta"))
    if df.empty:
        raise AnalysisError("no record belongs to an instance of the task file; is it the file the run used?")
    df = df.copy()
    df["correct"] = (df["outcome"] == "correct").astype(float) if "outcome" in df else np.nan
    df["no_evidence"] = (df["evidence"] == "none").astype(int)
    for col in _ROUTING:
        df[col] = pd.to_numeric(df[col], errors="coerce").astype(float) if col in df else np.nan
        df.loc[df["no_evidence"] == 1, col] = np.nan
    if "f1" not in df:
        df["f1"] = np.nan
    by = ["press", "ratio", *keys]
    g = df.groupby(by, sort=True, dropna=False)
    out = g.agg(n=("instance_id", "size"), accuracy=("correct", "mean"), f1=("f1", "mean"), ger=("ger", "mean"),
                reachable=("reachable", "mean"), routed_reachable=("routed_reachable", "mean"),
                no_evidence=("no_evidence", "sum"))
    return out.reset_index()
