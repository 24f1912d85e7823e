"""Loading records: the run store's SQLite table, and Parquet/CSV/JSONL files."""

import json
import sqlite3

import numpy as np
import pandas as pd
import pytest

from kvroute.analysis.load import load_manifest, load_records
from kvroute.analysis.synthetic import SyntheticSpec, synthetic_records
from kvroute.errors import StoreError

VECTORS = ("consensus_nosink", "rho_nosink", "probe_features")


@pytest.fixture(scope="module")
def records() -> pd.DataFrame:
    spec = SyntheticSpec(n_instances=3, families=("base",), long_context_lengths=(512,), presses=("ea",),
                         press_offsets=(0.0,))
    return synthetic_records(spec)


def _write_store(df: pd.DataFrame, run_dir, *, blobs: bool = False) -> None:
    out = df.copy()
    for c in out.columns:
        if out[c].map(lambda v: isinstance(v, list)).any():
            out[c] = [np.asarray(v, np.float32).tobytes() if blobs else json.dumps(v) for v in out[c]]
    out["hallucinated"] = out["hallucinated"].astype(int)  # SQLite has no booleans
    with sqlite3.connect(run_dir / "store.sqlite") as con:
        out.to_sql("records", con, index=False)
    (run_dir / "manifest.json").write_text(json.dumps({"git": "abc123", "models": ["m"]}))


def _same(a: pd.DataFrame, b: pd.DataFrame) -> None:
    assert list(a.columns) == list(b.columns) and len(a) == len(b)
    for c in VECTORS:
        for va, vb in zip(a[c], b[c], strict=True):  # models differ in depth: compare row by row
            assert isinstance(vb, list)
            np.testing.assert_allclose(va, vb, rtol=1e-6)
    assert b["hallucinated"].dtype == bool and (a["hallucinated"].to_numpy() == b["hallucinated"].to_numpy()).all()
    np.testing.assert_allclose(a["ger"], b["ger"])


@pytest.mark.parametrize("blobs", [False, True])
def test_run_directory_with_sqlite_store(records, tmp_path, blobs):
    _write_store(records, tmp_path, blobs=blobs)
    _same(records, load_records(tmp_path))
    assert load_manifest(tmp_path) == {"git": "abc123", "models": ["m"]}


@pytest.mark.parametrize("suffix", [".parquet", ".csv", ".jsonl"])
def test_records_files(records, tmp_path, suffix):
    p = tmp_path / f"run{suffix}"
    if suffix == ".parquet":
        records.to_parquet(p)
    elif suffix == ".csv":
        out = records.copy()
        for c in VECTORS:
            out[c] = out[c].map(json.dumps)
        out.to_csv(p, index=False)
    else:
        records.to_json(p, orient="records", lines=True)
    _same(records, load_records(p))
    assert load_manifest(p) is None


def test_clear_errors(tmp_path):
    with pytest.raises(StoreError, match="no store.sqlite"):
        load_records(tmp_path)
    with pytest.raises(StoreError, match="no such run directory"):
        load_records(tmp_path / "missing")
    (tmp_path / "x.txt").write_text("hi")
    with pytest.raises(StoreError, match="cannot read records"):
        load_records(tmp_path / "x.txt")
    with sqlite3.connect(tmp_path / "store.sqlite") as con:
        con.execute("CREATE TABLE other (a INTEGER)")
    with pytest.raises(StoreError, match="no 'records' table"):
        load_records(tmp_path)
    (tmp_path / "manifest.json").write_text("{not json")
    with pytest.raises(StoreError, match="not valid JSON"):
        load_manifest(tmp_path)


def test_records_made_before_the_layer_max_routed_test_keep_their_pooled_reading_under_its_own_name(tmp_path):
    """Row by row: a record with routed_p but no routed_p_pooled held the pooled test under today's names; it
    moves to the *_pooled fields and the layer-max fields become missing, so no old value reads as the new test."""
    old = {"model": "m", "press": "p", "ratio": 0.5, "instance_id": "a", "routed_reachable": True,
           "routed_p": 0.05, "routed_z": 3.0}
    new = {"model": "m", "press": "p", "ratio": 0.5, "instance_id": "b", "routed_reachable": False, "routed_p": 0.4,
           "routed_z": 0.2, "routed_reachable_pooled": True, "routed_p_pooled": 0.05, "routed_z_pooled": 2.5}
    p = tmp_path / "mixed.jsonl"
    p.write_text("\n".join(json.dumps(r) for r in (old, new)) + "\n")
    df = load_records(p).set_index("instance_id")
    assert pd.isna(df.loc["a", "routed_reachable"]) and pd.isna(df.loc["a", "routed_p"])
    assert bool(df.loc["a", "routed_reachable_pooled"]) is True and df.loc["a", "routed_p_pooled"] == 0.05
    assert df.loc["a", "routed_z_pooled"] == 3.0
    assert bool(df.loc["b", "routed_reachable"]) is False and df.loc["b", "routed_p"] == 0.4  # new records untouched
    assert bool(df.loc["b", "routed_reachable_pooled"]) is True and df.loc["b", "routed_z_pooled"] == 2.5
    only_old = tmp_path / "old.jsonl"
    only_old.write_text(json.dumps(old) + "\n")
    o = load_records(only_old).iloc[0]
    assert pd.isna(o["routed_reachable"]) and bool(o["routed_reachable_pooled"]) and o["routed_p_pooled"] == 0.05
