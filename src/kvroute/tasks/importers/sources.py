"""Reading a source into rows: local JSONL/JSON/CSV/TSV/Parquet files, or a Hugging Face dataset.

Every row comes with its :class:`~kvroute.tasks.importers.base.Where` (1-based record number, and
the physical line for JSONL and CSV), so a malformed row is reported where a user can find it.
A hub dataset is loaded through ``datasets.load_dataset`` only after a quick reachability check;
offline, the import fails at once and says how to import a local export instead.
"""

from __future__ import annotations

import csv
import json
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvroute.bounds import loads_json
from kvroute.errors import ConfigError, NetworkError, TaskFormatError
from kvroute.tasks.importers.base import Where

FILE_KINDS = {".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "json", ".csv": "csv", ".tsv": "tsv",
              ".parquet": "parquet", ".pq": "parquet"}
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


@dataclass(frozen=True)
class Table:
    """All rows of one source, with its column names (in order of first appearance)."""

    name: str  # the path or hub id, as errors and meta["source"] show it
    stem: str  # the default task family name
    columns: tuple[str, ...]
    rows: tuple[tuple[Where, Mapping[str, Any]], ...]


def is_hub_id(source: str) -> bool:
    """Whether ``source`` names a hub dataset rather than a local file."""
    p = Path(source).expanduser()
    return not p.exists() and p.suffix.lower() not in FILE_KINDS and bool(_HUB_ID.match(source))


def read_source(source: str, *, config: str | None = None, split: str | None = None) -> Table:
    """Read a local file (by its suffix) or, for an ``org/name`` id, a hub dataset."""
    if is_hub_id(source):
        return read_hub(source, config=config, split=split)
    path = Path(source).expanduser()
    if not path.is_file():
        raise TaskFormatError("no such file; give a .parquet, .csv, .tsv, .jsonl or .json file, or a Hugging Face "
                              "dataset id (org/name)", path=str(path))
    if config is not None or split is not None:
        raise ConfigError("--config and --split choose a Hugging Face dataset's subset; a local file has neither")
    kind = FILE_KINDS.get(path.suffix.lower())
    if kind is None:
        raise TaskFormatError(f"unknown file type {path.suffix!r}; kvroute imports {', '.join(sorted(FILE_KINDS))}",
                              path=str(path))
    reader = {"jsonl": _jsonl, "json": _json, "csv": _csv, "tsv": _csv, "parquet": _parquet}[kind]
    rows = reader(path, kind)
    return Table(str(path), path.stem, _columns(r for _, r in rows), tuple(rows))


def _columns(rows: Any) -> tuple[str, ...]:
    seen: dict[str, None] = {}
    for r in rows:
        for k in r:
            seen.setdefault(str(k), None)
    return tuple(seen)


def _text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8-sig")  # a byte-order mark is no content
    except UnicodeDecodeError as e:
        raise TaskFormatError(f"not UTF-8 text ({e.reason} at byte {e.start})", path=str(path)) from None


def _object(item: Any, where: Where) -> Mapping[str, Any]:
    if not isinstance(item, dict):
        raise where.error(f"expected a JSON object, got {type(item).__name__}")
    return item


def _jsonl(path: Path, kind: str) -> list[tuple[Where, Mapping[str, Any]]]:
    out: list[tuple[Where, Mapping[str, Any]]] = []
    for lineno, line in enumerate(_text(path).split("\n"), start=1):
        if not line.strip():
            continue
        where = Where(str(path), len(out) + 1, lineno)
        try:
            item = loads_json(line)
        except json.JSONDecodeError as e:
            raise where.error(f"invalid JSON: {e.msg} (column {e.colno})") from None
        except ValueError as e:
            raise where.error(f"the JSON {e}") from None
        out.append((where, _object(item, where)))
    return out


def _json(path: Path, kind: str) -> list[tuple[Where, Mapping[str, Any]]]:
    try:
        items = loads_json(_text(path))
    except json.JSONDecodeError as e:
        raise TaskFormatError(f"invalid JSON: {e.msg} (column {e.colno})", path=str(path), line=e.lineno) from None
    except ValueError as e:
        raise TaskFormatError(f"the JSON {e}", path=str(path)) from None
    if not isinstance(items, list):
        raise TaskFormatError("a .json source must hold a list of row objects (or use .jsonl)", path=str(path))
    out = []
    for i, item in enumerate(items, start=1):
        where = Where(str(path), i)
        out.append((where, _object(item, where)))
    return out


def _csv(path: Path, kind: str) -> list[tuple[Where, Mapping[str, Any]]]:
    csv.field_size_limit(min(sys.maxsize, 2**31 - 1))  # long contexts exceed the 128 KiB default
    out: list[tuple[Where, Mapping[str, Any]]] = []
    try:
        with open(path, encoding="utf-8-sig", newline="") as f:  # Excel writes a byte-order mark
            reader = csv.DictReader(f, delimiter="\t" if kind == "tsv" else ",")
            last = reader.line_num
            for row in reader:
                where = Where(str(path), len(out) + 1, last + 1)  # the line the row starts on
                last = reader.line_num
                if None in row:
                    raise where.error(f"has {len(row) - 1 + len(row[None])} fields but the header has "  # type: ignore[index]
                                      f"{len(reader.fieldnames or [])}")
                out.append((where, row))
    except UnicodeDecodeError as e:
        raise TaskFormatError(f"not UTF-8 text ({e.reason} at byte {e.start})", path=str(path)) from None
    except csv.Error as e:
        raise TaskFormatError(f"malformed CSV: {e}", path=str(path)) from None
    return out


def _parquet(path: Path, kind: str) -> list[tuple[Where, Mapping[str, Any]]]:
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except Exception as e:  # pyarrow raises several unrelated types for unreadable files
        raise TaskFormatError(f"cannot read Parquet: {e}", path=str(path)) from None
    return [(Where(str(path), i), row) for i, row in enumerate(table.to_pylist(), start=1)]


def read_hub(dataset: str, *, config: str | None = None, split: str | None = None) -> Table:
    """``datasets.load_dataset(dataset, config, split=split or "test")``, after checking the hub answers."""
    from kvroute.hub import hub_reachable

    if not hub_reachable():
        raise NetworkError(f"the Hugging Face hub is unreachable, so dataset {dataset!r} cannot be loaded; import a "
                           "local export instead: save it where the hub is reachable (datasets: "
                           "load_dataset(...).to_parquet('data.parquet')) and run `kvroute tasks import "
                           "data.parquet` (Parquet, CSV and JSONL files work)")
    try:
        import datasets
    except ImportError:
        raise ConfigError("importing a hub dataset needs the `datasets` package: pip install datasets "
                          "(or import a local Parquet/CSV/JSONL export)") from None
    split = split or "test"
    try:
        ds = datasets.load_dataset(dataset, config, split=split)
    except (OSError, ValueError) as e:
        raise ConfigError(f"cannot load dataset {dataset!r} (config {config!r}, split {split!r}): {e}") from None
    name = f"{dataset}:{config}:{split}" if config else f"{dataset}:{split}"
    rows = [(Where(name, i), row) for i, row in enumerate(ds, start=1)]
    stem = dataset.rsplit("/", 1)[-1] + (f"-{config}" if config else "")
    return Table(name, stem, tuple(ds.column_names), tuple(rows))
