"""``kvroute export``: a run store as one Parquet or CSV file.

Parquet keeps vectors as list columns; CSV writes lists and tables as JSON text (which
:func:`kvroute.analysis.load.load_records` reads back). Rows are ordered by (model, regime, seed,
instance, press, ratio), so two runs of the same grid export byte-identical data columns
(timings aside). The default file is ``RUN_DIR/records.<format>``, where the analysis looks too.
Both are written atomically (:func:`kvroute.files.atomic_write`): an export that fails leaves the
previous file as it was.

The CSV dialect (RFC 4180, written by :func:`write_csv`, read by :func:`read_csv`): every value
is quoted — so ``\\r``, ``\\n``, ``,`` and ``"`` inside an answer never split a row — except a
missing value (None), which is written as a bare ``nan`` that any CSV reader (pandas included)
reads as missing; an empty string stays ``""``. Numbers are written with ``repr`` (exact floats;
``3`` for ints, ``3.0`` for floats), booleans as ``True``/``False``, lists and tables as compact
JSON. :func:`read_csv` undoes all of it, so store → CSV → ``load_records`` is exact.
"""

from __future__ import annotations

import csv
import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from kvroute.errors import ConfigError, StoreError
from kvroute.files import atomic_write, check_not_input, check_output_file
from kvroute.record_format import CHECKED_FIELDS, STORE_NAME, TEXT_FIELDS, check_columns
from kvroute.sweep.manifest import MANIFEST_NAME
from kvroute.sweep.store import check_integrity, read_records, store_columns

FORMATS = ("parquet", "csv")
ORDER = "model, regime, seed, instance_id, press != 'none', press, ratio"
_MISSING = "nan"
_INT = re.compile(r"^[+-]?\d+$")


def _cell(v: Any) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return _MISSING
    if isinstance(v, bool):
        text = "True" if v else "False"
    elif isinstance(v, float):
        text = repr(v)
    elif isinstance(v, int):
        text = str(v)
    elif isinstance(v, list | tuple | dict):
        text = json.dumps(v, ensure_ascii=False, separators=(",", ":"))
    elif hasattr(v, "tolist"):  # numpy values
        return _cell(v.tolist())
    else:
        text = str(v)
    return '"' + text.replace('"', '""') + '"'


def write_csv(records: Sequence[Mapping[str, Any]], path: str | Path, columns: Sequence[str] | None = None) -> int:
    """Write ``records`` as CSV (the dialect above) atomically; returns the number of rows."""
    if columns is None:
        seen: dict[str, None] = {}
        for r in records:
            seen.update(dict.fromkeys(r))
        columns = list(seen)
    with atomic_write(path, "w", newline="") as f:
        f.write(",".join(_cell(c) for c in columns) + "\n")
        for r in records:
            f.write(",".join(_cell(r.get(c)) for c in columns) + "\n")
    return len(records)


def _column(name: str, raw: list[Any]) -> list[Any]:
    """Typed values of one CSV column (``raw``: str for quoted cells, float for bare ones, None for missing)."""
    present = [v for v in raw if v is not None]
    if name in TEXT_FIELDS or not present or any(not isinstance(v, str) for v in present):
        return [None if v is None else v if isinstance(v, str) else _number(v) for v in raw]
    if all(v in ("True", "False") for v in present):
        return [None if v is None else v == "True" for v in raw]
    if all(v[:1] in ("[", "{") for v in present):
        try:
            return [None if v is None else json.loads(v) for v in raw]
        except json.JSONDecodeError:
            return raw
    out: list[Any] = []
    for v in raw:
        if v is None:
            out.append(None)
        elif _INT.match(v):
            out.append(int(v))
        else:
            try:
                out.append(float(v))
            except ValueError:
                return raw  # a text column after all
    return out


def _number(v: float) -> float | int:
    return int(v) if v.is_integer() and abs(v) < 2**53 else v


def read_csv(path: str | Path) -> list[dict[str, Any]]:
    """The records of a CSV file, typed back (see the module docstring); foreign CSVs are read as well as can be.

    Raises :class:`ValueError` on a malformed file (ragged rows, broken quoting).
    """
    with open(path, encoding="utf-8-sig", newline="") as f:  # a byte-order mark (Excel) is no content
        rows: Iterable[list[Any]] = csv.reader(f, quoting=csv.QUOTE_NONNUMERIC, strict=True)
        try:
            it = iter(rows)
            header = next(it, None)
            if header is None:
                return []
            header = [str(h) for h in header]
            body = list(it)
        except csv.Error as e:
            raise ValueError(f"malformed CSV: {e}") from None
    for i, row in enumerate(body, start=2):
        if len(row) != len(header):
            raise ValueError(f"row {i} has {len(row)} fields, the header {len(header)}")
    cols = {}
    for j, name in enumerate(header):
        raw = [_bare(row[j]) for row in body]
        cols[name] = _column(name, raw)
    return [{name: cols[name][i] for name in header} for i in range(len(body))]


def _bare(v: Any) -> Any:
    """A bare (unquoted) cell: csv's QUOTE_NONNUMERIC made it a float; NaN and an empty cell mean missing."""
    if isinstance(v, float):
        return None if math.isnan(v) else v
    return v


def run_inputs(run_dir: Path) -> dict[str, Path]:
    """The files of a run folder that no output may replace: its store (and SQLite's companions) and manifest."""
    store = run_dir / STORE_NAME
    return {"the run's store": store, "the run's store journal": store.with_name(STORE_NAME + "-wal"),
            "the run's store index": store.with_name(STORE_NAME + "-shm"),
            "the run's manifest": run_dir / MANIFEST_NAME}


def export_records(run_dir: str | Path, fmt: str = "parquet", out: str | Path | None = None) -> tuple[Path, int]:
    """Write the store's records to ``out`` (default ``RUN_DIR/records.<fmt>``); returns (path, rows)."""
    if fmt not in FORMATS:
        raise ConfigError(f"unknown export format {fmt!r}; use one of {', '.join(FORMATS)}")
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise StoreError(f"no such run directory: {run_dir}")
    check_integrity(run_dir)
    try:
        records = read_records(run_dir, order=ORDER)
    except StoreError as e:  # a store that has no records yet lacks the key columns
        if "no such column" not in str(e):
            raise
        records = read_records(run_dir)
    check_columns({c: [r.get(c) for r in records] for c in CHECKED_FIELDS if any(c in r for r in records)},
                  str(run_dir / STORE_NAME))  # records read back are checked as records written are
    path = Path(out) if out is not None else run_dir / f"records.{fmt}"
    check_output_file(path)
    check_not_input(path, run_inputs(run_dir))
    path.parent.mkdir(parents=True, exist_ok=True)
    columns = None if records else store_columns(run_dir)  # an empty store: a header-only file, still a table
    if fmt == "csv":
        return path, write_csv(records, path, columns)
    import pandas as pd

    df = pd.DataFrame.from_records(records, columns=columns)
    with atomic_write(path, "wb") as f:
        df.to_parquet(f, index=False)
    return path, len(df)
