"""Shared pieces of the analysis layer: its error, column checks, group keys, baselines, JSON.

Every analysis function takes a records DataFrame (one row per cell, columns named in
:mod:`kvroute.records`) and returns a tidy DataFrame or plain data. Nothing here prints.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import pandas as pd

from kvroute.errors import AnalysisError, KvrouteError  # noqa: F401  (AnalysisError re-exported)

#: the cells of one cliff curve share these; ``ratio`` then varies along the curve
CURVE_KEYS: tuple[str, ...] = ("model", "press", "regime", "family")
#: the same without the task family (pooled over families)
PRESS_KEYS: tuple[str, ...] = ("model", "press", "regime")
#: the press name kvroute's sweep writes on uncompressed (ratio 0) baseline cells
BASELINE_PRESS = "none"
#: the family name that stands for "all families pooled"
ALL = "all"


def require_columns(df: pd.DataFrame, columns: Iterable[str], what: str) -> None:
    """Raise :class:`AnalysisError` naming the columns ``what`` needs and the records lack."""
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise AnalysisError(
            f"{what} needs the record column(s) {', '.join(missing)}, which these records lack; "
            f"see kvroute.records for the schema (present: {', '.join(map(str, df.columns)) or 'none'})")


def has_columns(df: pd.DataFrame, columns: Iterable[str]) -> bool:
    """Whether every column exists and has at least one non-null value."""
    return all(c in df.columns and df[c].notna().any() for c in columns)


def with_defaults(df: pd.DataFrame) -> pd.DataFrame:
    """A copy with missing grouping columns filled, so partial records still analyse.

    ``regime``/``family`` default to ``"all"``, ``seed`` to 0; ``ratio`` becomes float, rounded to 6 decimals.
    """
    require_columns(df, ("model", "instance_id", "press", "ratio"), "the analysis")
    out = df.copy()
    for col, default in (("regime", ALL), ("family", ALL), ("seed", 0)):
        if col not in out.columns:
            out[col] = default
        else:
            out[col] = out[col].fillna(default)
    # 0.7000000000000001 and 0.7 are the same ratio (CLI floats, JSON round trips)
    out["ratio"] = out["ratio"].astype(float).round(6)
    for col in ("model", "press", "regime", "family", "instance_id"):
        out[col] = out[col].astype(str)
    return out


def attach_baseline(df: pd.DataFrame) -> pd.DataFrame:
    """Give every press its ratio-0 cells, copied from the shared ``press == "none"`` baseline.

    The sweep runs the uncompressed baseline once per (model, instance, regime, seed) and labels
    it ``press="none"``; each press's curve starts from it. A press that has its own ratio-0
    cells keeps them. When the baseline lacks a regime, the baseline of any regime stands in
    (at ratio 0 nothing is compressed, so the regimes see the same prompt up to order).
    Baseline rows are dropped afterwards unless the records contain no other press.
    """
    df = with_defaults(df)
    base = df[df["press"] == BASELINE_PRESS]
    others = df[df["press"] != BASELINE_PRESS]
    if others.empty or base.empty:
        return df.reset_index(drop=True)
    pieces = [others]
    cell = ["model", "instance_id", "seed"]
    any_regime = base.drop_duplicates(cell)
    for (press, regime), grp in others.groupby(["press", "regime"], sort=False):
        if (grp["ratio"] == 0).any():
            continue
        src = base[base["regime"] == regime]
        if src.empty:
            src = any_regime
        # only the (model, instance, seed) cells this press actually has
        src = src.merge(grp[cell].drop_duplicates(), on=cell, how="inner")
        pieces.append(src.assign(press=press, regime=regime))
    return pd.concat(pieces, ignore_index=True)


def caused_view(df: pd.DataFrame) -> pd.DataFrame:
    """The records of the instances the model answers right with the full cache: hallucination *caused* by
    compression (SCIENCE.md's headline view; H(0) = 0 by construction).

    An instance counts when its uncompressed cell (``press == "none"``, or any press's ratio-0 cell) has
    ``outcome == "correct"``, per (model, regime, seed); every cell of it is kept, the baseline included.
    Instances that fail uncompressed — hard items, the model's own limits — say nothing about what
    compression does and would flatten the cliff. Empty when the records carry no ``outcome``.
    """
    if "outcome" not in df.columns:
        return df.iloc[0:0]
    keys = ["model", "instance_id", "seed"]
    base = with_defaults(df)
    base = base[base["ratio"] == 0]
    right = base[base["outcome"] == "correct"][keys].drop_duplicates()
    return with_defaults(df).merge(right, on=keys, how="inner")


def pooled(df: pd.DataFrame) -> pd.DataFrame:
    """The records plus a copy labelled ``family="all"`` (when there is more than one family)."""
    if df["family"].nunique() <= 1:
        return df
    return pd.concat([df, df.assign(family=ALL)], ignore_index=True)


def group_seed(seed: int, key: object) -> np.random.Generator:
    """A Generator for one group that depends only on ``seed`` and the group's key.

    Results for a group therefore do not change when other groups are added or removed.
    """
    return np.random.default_rng([int(seed), zlib.crc32(repr(key).encode())])


def as_key(keys: Sequence[str], values: object) -> dict[str, Any]:
    """``{key: value}`` for one ``groupby`` group (``values`` is a scalar or a tuple)."""
    vals = values if isinstance(values, tuple) else (values,)
    return dict(zip(keys, vals, strict=True))


def stack_vectors(values: Iterable[object]) -> np.ndarray:
    """Stack per-layer list columns into a float array ``[rows, L]`` (NaN-padded if lengths differ)."""
    rows = [np.asarray(v, dtype=float).ravel() if v is not None and not _isnan(v) else np.zeros(0) for v in values]
    if not rows:
        return np.zeros((0, 0))
    width = max(len(r) for r in rows)
    out = np.full((len(rows), width), np.nan)
    for i, r in enumerate(rows):
        out[i, : len(r)] = r
    return out


def _isnan(v: object) -> bool:
    return isinstance(v, float) and math.isnan(v)


def jsonable(obj: Any) -> Any:
    """Plain JSON data from numpy/pandas values: NaN/inf become ``None``, arrays become lists."""
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return [jsonable(v) for v in obj.tolist()]
    if isinstance(obj, pd.DataFrame):
        return [jsonable(r) for r in obj.to_dict(orient="records")]
    if isinstance(obj, (np.bool_, bool)):
        return bool(obj)
    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, (float, np.floating)):
        f = float(obj)
        return f if math.isfinite(f) else None
    if obj is None or obj is pd.NA or obj is pd.NaT:
        return None
    return obj


def wilson(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The Wilson score interval of a proportion (``z`` = 1.96: 95%); NaN bounds when ``n`` is 0."""
    return wilson_fraction(successes / n, n, z) if n else (math.nan, math.nan)


def clustered_wilson(successes: Sequence[float], trials: Sequence[float], z: float = 1.96) -> tuple[float, float]:
    """A Wilson interval for a proportion whose trials come in clusters (several cells of one instance).

    ``successes[i]`` of ``trials[i]`` in cluster ``i``. The binomial sample size is divided by Kish's design
    effect, estimated from the cluster totals (the ratio estimator's variance over the binomial one) and bounded
    to [1, mean cluster size] — so the interval is never narrower than Wilson's on the trials (independent) nor
    wider than Wilson's on the clusters (each instance one observation). When every trial has the same outcome
    the correlation cannot be estimated and the bound that is honest is taken: one observation per cluster.
    """
    y, m = np.asarray(successes, float), np.asarray(trials, float)
    n, k = float(m.sum()), float(y.sum())
    if n == 0:
        return (math.nan, math.nan)
    p, clusters = k / n, len(m)
    top = n / clusters  # the design effect of perfectly correlated clusters
    if 0 < p < 1 and clusters > 1:
        var_cluster = clusters / (clusters - 1) * float(((y - p * m) ** 2).sum()) / n**2
        deff = min(max(var_cluster / (p * (1 - p) / n), 1.0), top)
    else:
        deff = top
    n_eff = n / deff
    return wilson_fraction(p, n_eff, z)


def wilson_fraction(p: float, n: float, z: float = 1.96) -> tuple[float, float]:
    """:func:`wilson` for an observed share ``p`` of a (possibly non-integer, effective) sample size ``n``."""
    if n <= 0:
        return (math.nan, math.nan)
    d = 1 + z * z / n
    c = (p + z * z / (2 * n)) / d
    w = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return (max(0.0, min(c - w, p)), min(1.0, max(c + w, p)))
