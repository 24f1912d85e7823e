"""What a source layout hands on (``SourceRow``), the layout contract, and the ``LAYOUTS`` registry.

A layout reads one row (a mapping of column name to value) of an existing dataset and returns a
:class:`SourceRow`: the context, the question, the gold answers and what kvpress needs to rebuild
its exact prompt. Layouts are detected from the columns a source has (:func:`detect_layout`);
``--layout`` overrides the detection.
"""

from __future__ import annotations

import ast
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from kvroute.errors import TaskFormatError
from kvroute.registry import Registry


@dataclass(frozen=True)
class Where:
    """A row's place in its source, for error messages and ``meta["source_row"]``."""

    path: str  # file path or hub id
    row: int  # 1-based record number (blank lines and the CSV header not counted)
    line: int | None = None  # physical line in a JSONL/CSV file, when known

    def error(self, message: str, field: str | None = None) -> TaskFormatError:
        if self.line is None:
            message = f"row {self.row}: {message}"
        return TaskFormatError(message, path=self.path, line=self.line, field=field)


@dataclass(frozen=True)
class SourceRow:
    """One dataset row, read by a layout; ``extra`` holds the source's other scalar columns."""

    where: Where
    context: str
    question: str
    answers: tuple[str, ...]
    task: str | None = None
    answer_prefix: str = ""
    max_new_tokens: int | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)


class Layout:
    """Base of the source layouts: ``required`` columns must all be present for detection."""

    name: ClassVar[str]
    summary: ClassVar[str]
    required: ClassVar[tuple[str, ...]]
    optional: ClassVar[tuple[str, ...]] = ()

    def read(self, row: Mapping[str, Any], where: Where) -> SourceRow:  # pragma: no cover - abstract
        raise NotImplementedError

    @classmethod
    def matches(cls, columns: Sequence[str]) -> bool:
        return set(cls.required) <= set(columns)

    def extras(self, row: Mapping[str, Any]) -> dict[str, Any]:
        """The row's scalar columns this layout does not read (kept in the instance's meta)."""
        known = set(self.required) | set(self.optional)
        return {k: v for k, v in row.items() if k not in known and _scalar(v)}


def _scalar(v: Any) -> bool:
    if isinstance(v, float) and math.isnan(v):
        return False
    return v is None or isinstance(v, str | int | float | bool)


LAYOUTS: Registry[type[Layout]] = Registry("source layout", hint="See `kvroute tasks import --help`.")


def detect_layout(columns: Sequence[str], source: str) -> Layout:
    """The one registered layout whose required columns ``columns`` has."""
    hits = [cls for _, cls in LAYOUTS.items() if cls.matches(columns)]
    if len(hits) == 1:
        return hits[0]()
    needs = "; ".join(f"{n}: {', '.join(c.required)}" for n, c in LAYOUTS.items())
    if not hits:
        raise TaskFormatError(f"columns {', '.join(columns) or '(none)'} fit no known layout (required columns — "
                              f"{needs}); rename the columns or pass --layout", path=source)
    raise TaskFormatError(f"columns fit several layouts ({', '.join(c.name for c in hits)}); pass --layout",
                          path=source)


# --- value coercion shared by the layouts -----------------------------------------------------------

def missing(v: Any) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))


def text(row: Mapping[str, Any], col: str, where: Where, *, required: bool = True, default: str = "") -> str:
    """Column ``col`` as a string; ``required`` ones must be present and not blank."""
    v = row.get(col)
    if missing(v):
        if required:
            raise where.error("missing value", col)
        return default
    if not isinstance(v, str):
        raise where.error(f"must be text, got {type(v).__name__} {v!r}", col)
    if required and not v.strip():
        raise where.error("is empty", col)
    return v


def optional_int(row: Mapping[str, Any], col: str, where: Where) -> int | None:
    v = row.get(col)
    if missing(v) or v == "":
        return None
    if isinstance(v, bool):
        raise where.error(f"must be a whole number, got {v!r}", col)
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    if isinstance(v, str):
        try:
            v = int(v.strip())
        except ValueError:
            raise where.error(f"must be a whole number, got {v!r}", col) from None
    if not isinstance(v, int) or v < 0:
        raise where.error(f"must be a non-negative whole number, got {v!r}", col)
    return v


def answer_list(row: Mapping[str, Any], col: str, where: Where) -> tuple[str, ...]:
    """Gold answers from a string, a number, or a list of them.

    A string that looks like a list (``["a", "b"]`` as JSON or ``['a', 'b']`` as pandas writes
    lists into CSV) is parsed as one. Blank answers are dropped; none left is an error.
    """
    v: Any = row.get(col)
    if missing(v):
        raise where.error("missing value", col)
    if isinstance(v, str) and v.strip().startswith("[") and v.strip().endswith("]"):
        v = _parse_list(v)
    items = list(v) if isinstance(v, list | tuple) or _is_array(v) else [v]
    out: list[str] = []
    for i, a in enumerate(items):
        if isinstance(a, bool) or not isinstance(a, str | int | float):
            raise where.error(f"answer {i} must be text or a number, got {type(a).__name__} {a!r}", col)
        s = a if isinstance(a, str) else (str(int(a)) if isinstance(a, float) and a.is_integer() else str(a))
        if s.strip() and s not in out:
            out.append(s)
    if not out:
        raise where.error("has no non-empty answer", col)
    return tuple(out)


def _parse_list(s: str) -> Any:
    for parse in (json.loads, ast.literal_eval):
        try:
            v = parse(s)
        except (ValueError, SyntaxError):
            continue
        if isinstance(v, list):
            return v
    return s


def _is_array(v: Any) -> bool:
    return type(v).__name__ == "ndarray"  # numpy arrays from pandas/datasets, without importing numpy
