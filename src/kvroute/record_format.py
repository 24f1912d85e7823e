"""How records are written down: the store's names, column kinds, and the encoding of their values.

The one owner of the record format (the fields themselves are named and described in
:mod:`kvroute.records`): the run store (:mod:`kvroute.sweep.store`) encodes with it, the export
(:mod:`kvroute.sweep.export`) and the analysis loader (:mod:`kvroute.analysis.load`) decode with it,
so a change of encoding is made here once. Free of torch, numpy and pandas.

Kinds: every stored column has one of ``bool | int | float | text | vector | json`` (the store's
``columns`` table records it). Scalars are plain values (booleans as 0/1 in SQLite); a ``vector``
(a list of floats: per-layer vectors, ``probe_features``) is a little-endian float32 blob when that
is lossless, else JSON text; a ``json`` value (other lists, tables) is compact JSON text. Files that
carry no kinds (a CSV or Parquet export, a hand-made store) are decoded by field name:
:data:`VECTOR_FIELDS`, :data:`BOOL_FIELDS`, :data:`TEXT_FIELDS`.
"""

from __future__ import annotations

import json
import math
import numbers
import struct
from collections.abc import Mapping, Sequence
from typing import Any

from kvroute.errors import StoreError
from kvroute.records import LAYER_FIELDS

STORE_NAME = "store.sqlite"  # RUN_DIR/store.sqlite
TABLE = "records"  # its table of records, one row per cell
KINDS = ("bool", "int", "float", "text", "vector", "json")

#: fields holding lists of floats (the per-layer fields of kvroute.records, and the probe's features)
VECTOR_FIELDS: tuple[str, ...] = (*LAYER_FIELDS, "probe_features")
#: fields holding booleans (a file without kinds may write them as 0/1, "True", "yes")
BOOL_FIELDS: tuple[str, ...] = ("hallucinated", "reachable", "routed_reachable", "routed_reachable_pooled",
                                "unanswerable")
#: fields that are always text, whatever they look like (an answer "True" or "[1]" stays a string)
TEXT_FIELDS = frozenset({"model", "instance_id", "press", "restore", "regime", "settings", "family", "answer_type",
                         "question_type", "evidence", "scorer", "selection", "status", "error", "answer",
                         "outcome", "key", "id"})


def kind_of(v: Any) -> str:
    """The column kind a (non-None) value asks for."""
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, int):
        return "int"
    if isinstance(v, float):
        return "float"
    if isinstance(v, str):
        return "text"
    if isinstance(v, list | tuple):
        return "vector" if v and type(v[0]) is float else "json"
    if isinstance(v, dict):
        return "json"
    raise StoreError(f"cannot store a value of type {type(v).__name__} ({v!r:.60}); records hold plain Python values")


def encode_list(v: Sequence[Any] | Mapping[str, Any]) -> bytes | str:
    """A float32 blob when every value survives float32 exactly, else JSON text."""
    if isinstance(v, list | tuple) and v and type(v[0]) is float:
        try:
            blob = struct.pack(f"<{len(v)}f", *v)
        except (struct.error, OverflowError, TypeError):
            pass
        else:
            if struct.unpack(f"<{len(v)}f", blob) == tuple(v):
                return blob
    return json.dumps(v, ensure_ascii=False, separators=(",", ":"))


def decode_list(v: Any) -> Any:
    """A stored list back as Python values: a float32 blob, JSON text ("" is missing), or an array
    (Parquet's list columns) → a list; a list or None stays as it is."""
    if isinstance(v, bytes | bytearray | memoryview):
        b = bytes(v)
        if len(b) % 4:
            raise StoreError(f"a vector column holds a blob of {len(b)} bytes, not a whole number of float32 values "
                             f"(4 bytes each); the store was written by something other than kvroute or is damaged")
        return list(struct.unpack(f"<{len(b) // 4}f", b))
    if isinstance(v, str):
        text = v.strip()
        if not text:
            return None
        try:
            return json.loads(text)
        except json.JSONDecodeError:
            raise StoreError(f"a list column holds text that is not JSON: {text[:60]!r}") from None
        except RecursionError:
            raise StoreError(f"a list column holds JSON nested too deep for a record: {text[:60]!r}") from None
    if hasattr(v, "tolist"):  # a numpy array (Parquet), nested ones included
        return _plain(v.tolist())
    return v


def _plain(v: Any) -> Any:
    if isinstance(v, list):
        return [_plain(x) for x in v]
    return _plain(v.tolist()) if hasattr(v, "tolist") else v


def decode_bool(v: Any) -> bool | None:
    """A boolean written as a bool, 0/1, or text ("True", "yes", "1"); None and NaN are missing."""
    if v is None or (isinstance(v, float) and v != v):
        return None
    if isinstance(v, bool):
        return v
    return str(v).strip().lower() in ("1", "1.0", "true", "yes")


def decode_value(kind: str, v: Any) -> Any:
    """Undo the encoding of one stored value of a column of ``kind``."""
    if v is None:
        return None
    if kind in ("vector", "json"):
        return decode_list(v)
    if kind == "bool":
        return bool(v)
    return v


#: the text fields that name a cell: never empty in a record kvroute wrote
_NAME_FIELDS = ("model", "instance_id", "press")
_BOOL_TEXT = frozenset({"1", "1.0", "true", "yes", "0", "0.0", "false", "no"})
_STATUSES = ("ok", "error")


def _missing(v: Any) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))


def _value_problem(name: str, v: Any) -> str | None:
    """Why ``v`` cannot be the value of field ``name`` in a record kvroute wrote, else None."""
    if name == "ratio":
        if _missing(v):
            return "is missing (every cell has a compression ratio)"
        if isinstance(v, bool) or not isinstance(v, numbers.Real) or not math.isfinite(v) or not 0 <= float(v) < 1:
            return f"is {v!r}; a compression ratio is a number in [0, 1)"
    elif name in _NAME_FIELDS:
        if _missing(v) or not isinstance(v, str) or not v:  # (" " is a name a task file may give)
            return f"is {v!r}; it names the cell, so it must be a non-empty text"
    elif name == "status":
        if not _missing(v) and v not in _STATUSES:
            return f"is {v!r}; allowed: {', '.join(_STATUSES)}"
    elif name == "seed":
        # (a whole float is fine: pandas reads an int column with gaps as floats)
        whole = isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(v) and float(v).is_integer()
        if not _missing(v) and not (whole and v >= 0):
            return f"is {v!r}; a seed is a non-negative integer"
    elif name in BOOL_FIELDS:
        if not _missing(v) and not isinstance(v, bool | numbers.Integral) and str(v).strip().lower() not in _BOOL_TEXT:
            return f"is {v!r}; allowed: true/false (or 1/0, yes/no)"
        if isinstance(v, numbers.Integral) and not isinstance(v, bool) and v not in (0, 1):
            return f"is {v!r}; allowed: true/false (or 1/0, yes/no)"
    return None


CHECKED_FIELDS: tuple[str, ...] = ("ratio", *_NAME_FIELDS, "status", "seed", *BOOL_FIELDS)


def check_columns(columns: Mapping[str, Sequence[Any]], source: str) -> None:
    """Refuse records read back that kvroute could not have written: ``columns`` maps a field to its values (one
    per record, as read). Raises :class:`StoreError` naming ``source``, the record (1-based), the field and what
    it may hold: a ratio outside [0, 1) or missing, a blank model/instance/press, a status other than ok/error, a
    negative seed, a boolean field holding anything but true/false."""
    for name in CHECKED_FIELDS:
        values = columns.get(name)
        if values is None:
            continue
        try:
            distinct: Any = set(values)  # a column holds few distinct keys, ratios, statuses: check each once
        except TypeError:  # an unhashable value (a list where a scalar belongs): check them all
            distinct = values
        if not any(_value_problem(name, v) for v in distinct):
            continue
        for i, v in enumerate(values, start=1):  # the first bad record in file order
            problem = _value_problem(name, v)
            if problem:
                raise StoreError(f"{source}: record {i}: field {name!r} {problem}; fix or remove that record "
                                 "(the file was not written by kvroute as it stands)")
