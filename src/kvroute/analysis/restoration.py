"""Causal restoration: what share of a compressed cell's failures putting entries back repairs.

A restored record (``restore`` set, see :mod:`kvroute.presses.restore`) is paired with its base cell: the same
(model, instance, press, ratio, regime, seed) without a restore. Among base cells that failed (outcome other
than ``correct``) where the full cache of that instance answered correctly (the failures compression caused;
all failures when the records hold no full-cache cells), split by failure class
(:func:`kvroute.analysis.decomposition.failure_classes`: erasure, retained, undefined), the table gives how
many the restoration repaired (the restored cell's outcome is ``correct``) with a Wilson interval — one pair
per instance, so pairs are independent (with several, the interval allows for it, as below). A restored cell
that answers with a list of candidates, the gold among them (outcome ``listed``), is not a repair; ``listed``
counts them beside ``repaired``.
``restore=answer`` repairing erasures is the causal reading of "erasure"; a retained failure that
``restore=evidence`` does not repair is rigidity-like; ``restore=random`` (as many other tokens) is the null.

:func:`pooled_restoration` pools presses (or any other keys) per (model, condition, ratio): several pairs then
come from one instance, so its Wilson interval counts the failures over their design effect across instances.
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from kvroute.analysis.common import AnalysisError, clustered_wilson, require_columns
from kvroute.analysis.decomposition import failure_classes, failure_mask
from kvroute.analysis.load import split_restored

PAIR_KEYS = ["model", "instance_id", "press", "ratio", "regime", "seed"]
GROUP_KEYS = ["model", "press", "ratio", "restore"]


def restoration_pairs(df: pd.DataFrame, *, ger_threshold: float = 1.0) -> pd.DataFrame:
    """One row per (restored cell, its failed base cell): the :data:`PAIR_KEYS`, ``restore``, the base cell's
    failure ``class``, ``repaired`` (the restored cell's outcome is ``correct``) and ``listed`` (it is ``listed``:
    the gold among other candidates, a failure still). Empty without restored cells."""
    main, restored = split_restored(df)
    if restored.empty:
        return pd.DataFrame(columns=[*PAIR_KEYS, "restore", "outcome", "class", "repaired", "listed"])
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
    pairs["repaired"] = pairs["outcome"].eq("correct")  # only a correct answer repairs; a listed one does not
    pairs["listed"] = pairs["outcome"].eq("listed")
    return pairs


def restoration_table(df: pd.DataFrame, *, ger_threshold: float = 1.0) -> pd.DataFrame:
    """Per (model, press, ratio, restore condition, failure class of the base cell): base failures, repaired,
    listed (restored cells that name the gold among other candidates: not repairs), the repaired share and its
    Wilson 95% interval (over the failures' design effect across instances when one instance gives several,
    e.g. several seeds); class ``all`` sums the classes. Empty without restored cells."""
    cols = [*GROUP_KEYS, "class", "failures", "repaired", "listed", "share", "low", "high"]
    pairs = restoration_pairs(df, ger_threshold=ger_threshold)
    if pairs.empty:
        return pd.DataFrame(columns=cols)
    rows = []
    for keys, g in pairs.groupby(GROUP_KEYS, sort=True):
        for cls, part in [*g.groupby("class", sort=True), ("all", g)]:
            rows.append({**dict(zip(GROUP_KEYS, keys, strict=True)), "class": cls, **_repairs(part)})
    return pd.DataFrame(rows, columns=cols)


def pooled_restoration(df: pd.DataFrame, by: Sequence[str] = ("model", "restore", "ratio"), *,
                       ger_threshold: float = 1.0) -> pd.DataFrame:
    """The repaired share of the failures compression caused per group of ``by`` (presses pooled by default),
    with a 95% Wilson interval whose sample size is the failures over their design effect across instances
    (:func:`kvroute.analysis.common.clustered_wilson`): an instance's pairs are not independent.

    Columns: ``by``, ``failures``, ``repaired``, ``listed`` (restored cells answering ``listed``: not repairs),
    ``share``, ``low``, ``high``, ``n_instances``.
    """
    by = list(by)
    cols = [*by, "failures", "repaired", "listed", "share", "low", "high", "n_instances"]
    pairs = restoration_pairs(df, ger_threshold=ger_threshold)
    if pairs.empty:
        return pd.DataFrame(columns=cols)
    rows = [{**dict(zip(by, keys if isinstance(keys, tuple) else (keys,), strict=True)), **_repairs(g)}
            for keys, g in pairs.groupby(by, sort=True)]
    return pd.DataFrame(rows, columns=cols)


def _repairs(part: pd.DataFrame) -> dict[str, float]:
    """Failures, repaired, listed, the repaired share and its 95% interval over some pairs: Wilson's, on the
    failures over their design effect across instances (exactly Wilson's when each instance gives one pair)."""
    per = part.groupby("instance_id")["repaired"].agg(["sum", "count"])
    n, k = int(per["count"].sum()), int(per["sum"].sum())
    lo, hi = clustered_wilson(per["sum"].to_numpy(), per["count"].to_numpy())
    return {"failures": n, "repaired": k, "listed": int(part["listed"].sum()), "share": k / n if n else float("nan"),
            "low": lo, "high": hi, "n_instances": len(per)}
