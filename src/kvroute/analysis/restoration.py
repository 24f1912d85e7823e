"""Causal restoration: what share of a compressed cell's failures putting entries back repairs.

A restored record (``restore`` set, see :mod:`kvroute.presses.restore`) is paired with its base cell: the same
(model, instance, press, ratio, regime, seed) without a restore. Among base cells that failed (outcome other
than ``correct``) where the full cache of that instance answered correctly (the failures compression caused;
all failures when the records hold no full-cache cells), split by failure class
(:func:`kvroute.analysis.decomposition.failure_classes`: erasure, retained, undefined), the table gives how
many the restoration repaired (the restored cell's outcome is ``correct``) with a Wilson interval — one pair
per instance, so pairs are independent. ``restore=answer`` repairing erasures is the causal reading of
"erasure"; a retained failure that ``restore=evidence`` does not
repair is rigidity-like; ``restore=random`` (as many other tokens) is the null.
"""

from __future__ import annotations

import pandas as pd

from kvroute.analysis.common import AnalysisError, require_columns, wilson
from kvroute.analysis.decomposition import failure_classes, failure_mask
from kvroute.analysis.load import split_restored

PAIR_KEYS = ["model", "instance_id", "press", "ratio", "regime", "seed"]
GROUP_KEYS = ["model", "press", "ratio", "restore"]


def restoration_table(df: pd.DataFrame, *, ger_threshold: float = 1.0) -> pd.DataFrame:
    """Per (model, press, ratio, restore condition, failure class of the base cell): base failures, repaired,
    the repaired share and its Wilson 95% interval; class ``all`` sums the classes. Empty without restored
    cells."""
    main, restored = split_restored(df)
    cols = [*GROUP_KEYS, "class", "failures", "repaired", "share", "low", "high"]
    if restored.empty:
        return pd.DataFrame(columns=cols)
    require_columns(df, [*PAIR_KEYS, "outcome"], "the restoration table")
    base = main[main["ratio"] > 0].copy()
    full = main[main["press"] == "none"]
    if not full.empty:  # compression-induced failures only: the full cache of that instance answered correctly
        right = full[full["outcome"] == "correct"][PAIR_KEYS[:2] + PAIR_KEYS[4:]].drop_duplicates()
        base = base.merge(right, on=PAIR_KEYS[:2] + PAIR_KEYS[4:])
    try:
        base["class"] = failure_classes(base, ger_threshold)
    except AnalysisError:  # no retention metric in the run: failures are not classed
        base["class"] = failure_mask(base).map({True: "unclassified", False: "success"})
    base = base[base["class"].isin(["erasure", "retained", "undefined", "unclassified"])]
    pairs = restored[[*PAIR_KEYS, "restore", "outcome"]].merge(base[[*PAIR_KEYS, "class"]], on=PAIR_KEYS)
    pairs["repaired"] = pairs["outcome"].eq("correct")
    rows = []
    for keys, g in pairs.groupby(GROUP_KEYS, sort=True):
        for cls, part in [*g.groupby("class", sort=True), ("all", g)]:
            n, k = len(part), int(part["repaired"].sum())
            lo, hi = wilson(k, n)
            rows.append({**dict(zip(GROUP_KEYS, keys, strict=True)), "class": cls, "failures": n, "repaired": k,
                         "share": k / n if n else float("nan"), "low": lo, "high": hi})
    return pd.DataFrame(rows, columns=cols)
