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
        return list(struct.unpack(f"<{len(b) // 4}f", b))
    if isinstance(v, str):
        text = v.strip()
        if not text:
            return None
        try:
            return json.loads(text)
        except json.JSONDecodeError:
            raise StoreError(f"a list column holds text that is not JSON: {text[:60]!r}") from None
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
