"""Reading records for analysis: a run directory's SQLite store, or a Parquet/CSV/JSONL export.

The run store is owned by :mod:`kvroute.sweep`; this module is the *only* place the analysis
reads it. Names, column kinds and the decoding of values are :mod:`kvroute.record_format`'s (the
store encodes with the same module): ``RUN_DIR/store.sqlite`` holds a table ``records`` whose
columns are the field names of :mod:`kvroute.records` (a ``columns`` table, when present, names
each column's kind and :func:`kvroute.sweep.store.decode_columns` decodes them; files without kinds
are decoded by field name); ``RUN_DIR/manifest.json`` holds the run manifest.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from kvroute.errors import StoreError
from kvroute.record_format import (
    BOOL_FIELDS,
    CHECKED_FIELDS,
    STORE_NAME,
    TABLE,
    VECTOR_FIELDS,
    check_columns,
    decode_bool,
    decode_list,
)
from kvroute.records import RENAMED_FIELDS

MANIFEST_NAME = "manifest.json"
_FILE_SUFFIXES = (".parquet", ".csv", ".jsonl", ".ndjson", ".sqlite", ".db")


#: ``DataFrame.attrs`` key under which :func:`load_records` leaves the errored cells it dropped (grouped)
ERRORS_ATTR = "cell_errors"
_ERROR_KEYS = ("model", "press", "error")


def split_errors(df: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``(ok, errored)``: the cells that ran and those recorded with ``status == "error"`` (metrics absent).

    Records without a ``status`` column (older stores) all ran.
    """
    if "status" not in df.columns:
        return df, df.iloc[0:0]
    bad = (df["status"] == "error").to_numpy()
    if not bad.any():
        return df, df.iloc[0:0]
    ok = df[~bad].reset_index(drop=True)
    ok.attrs = dict(df.attrs)
    return ok, df[bad].reset_index(drop=True)


def error_groups(errored: pd.DataFrame) -> list[dict[str, Any]]:
    """Errored cells per (model, press, error): ``n`` and the ratios they hit; most frequent first."""
    if errored.empty:
        return []
    e = errored.copy()
    for k in _ERROR_KEYS:
        e[k] = e[k].fillna("?").astype(str) if k in e.columns else "?"
    if "ratio" not in e.columns:
        e["ratio"] = np.nan
    out = [{"model": m, "press": p, "error": r, "n": int(len(g)),
            "ratios": sorted({float(x) for x in g["ratio"].dropna()})}
           for (m, p, r), g in e.groupby(list(_ERROR_KEYS), sort=True)]
    return sorted(out, key=lambda d: -d["n"])


def drop_errors(df: pd.DataFrame) -> tuple[pd.DataFrame, list[dict[str, Any]]]:
    """The cells that ran, and every errored cell grouped by (model, press, error).

    Counts both the errored rows still in ``df`` and those :func:`load_records` already dropped
    (``df.attrs["cell_errors"]``), so every estimator reads only cells that ran and the summary can
    still say how many did not. The returned frame's attrs hold the merged groups, so applying it
    twice counts nothing twice.
    """
    ok, errored = split_errors(df)
    groups: dict[tuple[str, str, str], dict[str, Any]] = {}
    for g in [*df.attrs.get(ERRORS_ATTR, []), *error_groups(errored)]:
        key = (g["model"], g["press"], g["error"])
        if key in groups:
            groups[key]["n"] += g["n"]
            groups[key]["ratios"] = sorted(set(groups[key]["ratios"]) | set(g["ratios"]))
        else:
            groups[key] = {**g, "ratios": list(g["ratios"])}
    out = sorted(groups.values(), key=lambda d: -d["n"])
    ok = ok.copy(deep=False)  # never touch the caller's frame; the result carries the merged count (idempotent)
    ok.attrs = {**df.attrs, ERRORS_ATTR: out}
    return ok, out


def split_restored(df: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``(main, restored)``: the presses' own cells (and the full cache), and the cells with a ``restore``
    condition (interventions: kvroute.analysis.restoration reads them; every other analysis leaves them out)."""
    if "restore" not in df.columns:
        return df, df.iloc[0:0]
    restored = df["restore"].notna() & df["restore"].astype(str).ne("")
    return df[~restored], df[restored]


def load_records(path: str | Path, *, with_restored: bool = False) -> pd.DataFrame:
    """Records from a run directory (``store.sqlite``) or a ``.parquet``/``.csv``/``.jsonl``/``.sqlite`` file.

    Vector columns come back as lists of floats, boolean columns as booleans. Cells that errored
    (``status == "error"``: no metrics) are left out; ``df.attrs["cell_errors"]`` lists them per
    (model, press, error) with their count (see :func:`drop_errors`). Restored cells (a ``restore``
    condition) are left out unless ``with_restored``: they are interventions, not compression. Raises
    :class:`~kvroute.errors.StoreError` when nothing readable is there.
    """
    df = _load_records(path)
    return df if with_restored else split_restored(df)[0]


def _load_records(path: str | Path) -> pd.DataFrame:
    p = Path(path)
    if p.is_dir():
        store = p / STORE_NAME
        if store.is_file():
            return _decode(_read_sqlite(store), store)
        exports = [p / f"records{s}" for s in _FILE_SUFFIXES[:4] if (p / f"records{s}").is_file()]
        if exports:
            return _load_records(exports[0])
        raise StoreError(f"{p} holds no {STORE_NAME} (nor a records.parquet/.csv/.jsonl export); "
                         f"pass the directory a sweep wrote, or a records file")
    if not p.is_file():
        raise StoreError(f"no such run directory or records file: {p}")
    suffix = p.suffix.lower()
    try:
        if suffix == ".parquet":
            df = pd.read_parquet(p)
        elif suffix == ".csv":
            df = _read_csv(p)
        elif suffix in (".jsonl", ".ndjson"):
            df = pd.read_json(p, lines=True, dtype=False, encoding="utf-8-sig")
        elif suffix in (".sqlite", ".db"):
            df = _read_sqlite(p)
        else:
            raise StoreError(f"cannot read records from {p.name}: use a run directory or a "
                             f"{', '.join(_FILE_SUFFIXES)} file")
    except (ValueError, OSError) as e:
        raise StoreError(f"could not read records from {p}: {e}") from e
    return _decode(df, p)


def load_manifest(path: str | Path) -> dict[str, Any] | None:
    """The run manifest next to the records (``manifest.json``), or None when there is none."""
    p = Path(path)
    f = (p if p.is_dir() else p.parent) / MANIFEST_NAME
    if not f.is_file():
        return None
    try:
        data = json.loads(f.read_text(encoding="utf-8-sig"))
    except RecursionError:
        raise StoreError(f"{f} is nested too deep to be a run manifest; fix or remove it") from None
    except json.JSONDecodeError as e:
        raise StoreError(f"{f} is not valid JSON ({e}); fix or remove it") from e
    return data if isinstance(data, dict) else {"manifest": data}


def _read_csv(path: Path) -> pd.DataFrame:
    """A CSV export (:func:`kvroute.sweep.export.read_csv`: exact types back); other CSVs through pandas."""
    from kvroute.sweep.export import read_csv

    try:
        records = read_csv(path)
    except ValueError:  # not kvroute's dialect (e.g. written by pandas): pandas' own inference
        return pd.read_csv(path, encoding="utf-8-sig")
    return pd.DataFrame.from_records(records)


def _read_sqlite(path: Path) -> pd.DataFrame:
    """The ``records`` table of a run store, read-only, after SQLite's integrity check."""
    try:
        con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    except sqlite3.Error as e:
        raise StoreError(f"cannot open {path}: {e}") from e
    try:
        from kvroute.sweep.store import check_schema, quick_check

        quick_check(con, path)
        check_schema(con, path)
        tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type IN ('table', 'view')")}
        if TABLE not in tables:
            raise StoreError(f"{path} has no {TABLE!r} table (tables: {', '.join(sorted(tables)) or 'none'}); "
                             f"is it a kvroute run store?")
        from kvroute.sweep.store import decode_columns  # the store's own column kinds: vectors, lists, bools

        try:
            return decode_columns(con, pd.read_sql_query(f"SELECT * FROM {TABLE}", con))
        except StoreError as e:  # a value the store's encoding cannot hold (a torn blob): name the store
            raise StoreError(f"{path}: {e}") from None
    except sqlite3.Error as e:
        raise StoreError(f"cannot read {path}: {e}") from e
    finally:
        con.close()


def rename_legacy_fields(df: pd.DataFrame) -> pd.DataFrame:
    """Records with the field names of :data:`kvroute.records.RENAMED_FIELDS` mapped to today's.

    Earlier stores named the with-sink consensus vectors ``consensus``/``rho``; they become
    ``consensus_withsink``/``rho_withsink`` (never the sink-free default). Where a store holds both
    names (a sweep resumed across the rename), the new column keeps its values and the old one fills
    its gaps. Returns ``df`` itself when nothing is to rename.
    """
    old = [c for c in RENAMED_FIELDS if c in df.columns]
    if not old:
        return df
    df = df.copy()
    for c in old:
        new = RENAMED_FIELDS[c]
        col = df.pop(c)
        df[new] = df[new].where(df[new].notna(), col) if new in df.columns else col
    return df


#: the routed-reachability fields whose meaning changed with the layer-max test: in earlier records they
#: held the pooled test, which now has its own names
_ROUTED_POOLED = {"routed_reachable": "routed_reachable_pooled", "routed_p": "routed_p_pooled",
                  "routed_z": "routed_z_pooled"}


def legacy_routed(df: pd.DataFrame) -> pd.DataFrame:
    """Records made before the layer-max routed test, row by row: a row with ``routed_p`` but no
    ``routed_p_pooled`` held the pooled test under today's layer-max names; its values move to the
    ``*_pooled`` fields and the layer-max fields become missing (never read as the new test). Returns
    ``df`` itself when no row is such a record."""
    if "routed_p" not in df.columns:
        return df
    pooled = df["routed_p_pooled"] if "routed_p_pooled" in df.columns else pd.Series(np.nan, index=df.index)
    old = df["routed_p"].notna() & pooled.isna()
    if not old.any():
        return df
    df = df.copy()
    for cur, new in _ROUTED_POOLED.items():
        if cur not in df.columns:
            continue
        if new not in df.columns:
            df[new] = pd.Series([None] * len(df), index=df.index, dtype=object)
        df[new] = df[new].astype(object)
        df.loc[old, new] = df.loc[old, cur]
        df[cur] = df[cur].astype(object)
        df.loc[old, cur] = None
    for col in ("routed_p", "routed_z", "routed_p_pooled", "routed_z_pooled"):
        if col in df.columns:
            df[col] = pd.to_numeric(df[col], errors="coerce")
    return df


def _decode(df: pd.DataFrame, source: Path) -> pd.DataFrame:
    # records read back are checked as records written are: a ratio in [0, 1), named cells, true/false booleans
    check_columns({c: df[c].tolist() for c in CHECKED_FIELDS if c in df.columns}, str(source))
    df, errored = split_errors(legacy_routed(rename_legacy_fields(df)))
    df = df.copy()
    df.attrs = {**df.attrs, ERRORS_ATTR: error_groups(errored)}
    for col in VECTOR_FIELDS:
        if col in df.columns and df[col].dtype == object:
            df[col] = [decode_list(v) for v in df[col]]
    for col in df.columns:  # other list columns (Parquet gives numpy arrays): plain lists, as the store holds them
        if col not in VECTOR_FIELDS and df[col].dtype == object and any(isinstance(v, np.ndarray) for v in df[col]):
            df[col] = [decode_list(v) for v in df[col]]
    for col in BOOL_FIELDS:
        if col in df.columns and df[col].dtype != bool:
            s = df[col].map(decode_bool)
            df[col] = s.astype("boolean") if s.isna().any() else s.astype(bool)
    return df
