"""kvroute.record_format: the one owner of the record format (names, kinds, encode/decode)."""

from __future__ import annotations

import ast
import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from kvroute.errors import StoreError
from kvroute.record_format import (
    BOOL_FIELDS,
    VECTOR_FIELDS,
    decode_bool,
    decode_list,
    decode_value,
    encode_list,
    kind_of,
)
from kvroute.records import ALL_FIELDS

SRC = Path(__file__).resolve().parents[2] / "src" / "kvroute"
OWNED = {"STORE_NAME", "TABLE", "VECTOR_FIELDS", "BOOL_FIELDS", "TEXT_FIELDS", "kind_of", "encode_list",
         "decode_list", "decode_value", "decode_bool"}


@pytest.mark.parametrize("value, kind", [
    (True, "bool"), (3, "int"), (0.5, "float"), ("a", "text"),
    ([0.5, 0.25, -1.0], "vector"), ([1 / 3, 0.1], "vector"), ([1, 2], "json"), (["a", "b"], "json"),
    ({"k": [1, 2]}, "json"), ([[0.5], [1.0]], "json"),
])
def test_every_kind_round_trips_exactly(value, kind):
    assert kind_of(value) == kind
    stored = encode_list(value) if kind in ("vector", "json") else (int(value) if kind == "bool" else value)
    back = decode_value(kind, stored)
    assert back == value and type(back) is type(value)


def test_float32_blobs_only_when_lossless():
    assert isinstance(encode_list([0.5, 0.25, 1.0]), bytes)
    assert isinstance(encode_list([1 / 3]), str)  # a float64 value stays exact as JSON text
    assert decode_list(encode_list([1 / 3])) == [1 / 3]


def test_decode_list_reads_every_way_a_file_writes_a_list():
    assert decode_list(np.array([0.5, 1.0], dtype=np.float32)) == [0.5, 1.0]  # Parquet
    assert decode_list(np.array([np.array([1, 2]), np.array([3])], dtype=object)) == [[1, 2], [3]]
    assert decode_list(memoryview(encode_list([0.5]))) == [0.5]  # type: ignore[arg-type]
    assert decode_list("  ") is None and decode_list(None) is None
    with pytest.raises(StoreError, match="not JSON"):
        decode_list("[0.5, oops")


@pytest.mark.parametrize("v, out", [(1, True), (0, False), ("True", True), ("false", False), ("yes", True),
                                    (1.0, True), (None, None), (math.nan, None), (True, True)])
def test_decode_bool(v, out):
    assert decode_bool(v) is out


def test_the_fields_it_names_are_record_fields():
    assert set(VECTOR_FIELDS) <= set(ALL_FIELDS) and set(BOOL_FIELDS) <= set(ALL_FIELDS)


def test_no_other_module_defines_the_format():
    """The store, the export and the analysis import these names; none defines its own."""
    for path in SRC.rglob("*.py"):
        if path.name == "record_format.py":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in tree.body:
            names = ([t.id for t in node.targets if isinstance(t, ast.Name)] if isinstance(node, ast.Assign)
                     else [node.target.id] if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                     else [node.name] if isinstance(node, ast.FunctionDef) else [])
            assert not set(names) & OWNED, f"{path.relative_to(SRC)} defines {set(names) & OWNED}"
        text = path.read_text(encoding="utf-8")
        assert "np.frombuffer" not in text or "float32" not in text, f"{path.name}: a second float32 decoder"


def test_it_imports_neither_torch_nor_numpy_nor_pandas():
    code = ("import sys, kvroute.record_format\n"
            "print(sorted(m for m in ('torch', 'numpy', 'pandas') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout.replace("'", '"')) == []
