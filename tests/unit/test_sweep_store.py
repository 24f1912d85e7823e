"""The run store: exact round trips, no duplicates, atomic batches, the run lock, readers and exports."""

import math
import os
import signal
import sqlite3
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from kvroute.analysis.load import load_records
from kvroute.errors import StoreError, StoreLockedError
from kvroute.sweep.export import export_records
from kvroute.sweep.lock import LOCK_NAME
from kvroute.sweep.store import STORE_NAME, Store, encode_list, read_records


def rec(key, **over):
    r = {"key": key, "model": "m", "instance_id": "i" + key, "press": "knorm", "ratio": 0.5, "regime": "agnostic",
         "seed": 0, "settings": "s", "unanswerable": False, "context_tokens": 140, "difficulty": None,
         "gold": ["oak inkwell", "inkwell"], "f1": 0.25, "hallucinated": True, "ger": 0.1 + 0.2,
         "consensus_nosink": [0.75, 1.0, 0.5], "hidden_cosine": [0.1, 0.2, 1 / 3], "probe_features": [float(x) for x in
                                                                                                  range(8)],
         "answer": "Velkirra ünïcode", "meta": {"a": 1}}
    r.update(over)
    return r


def test_records_round_trip_exactly(tmp_path):
    rows = [rec("a"), rec("b", ratio=0.0, press="none", hallucinated=False, difficulty=2, f1=float("nan"),
                          consensus_nosink=[float("nan"), 1.0], gold=[])]
    with Store.open(tmp_path) as s:
        assert s.write(rows) == 2
        back = s.records()
    a, b = back
    assert a == rows[0]
    assert isinstance(a["hallucinated"], bool) and isinstance(a["consensus_nosink"], list)
    assert b["f1"] is None  # SQLite keeps NaN as NULL
    assert math.isnan(b["consensus_nosink"][0]) and b["consensus_nosink"][1] == 1.0
    assert {k: v for k, v in b.items() if k not in ("f1", "consensus_nosink")} == {
        k: v for k, v in rows[1].items() if k not in ("f1", "consensus_nosink")}


def test_float_lists_are_float32_blobs_only_when_lossless():
    assert isinstance(encode_list([0.5, 0.25, 1.0]), bytes)
    assert isinstance(encode_list([1 / 3]), str)  # float64 value: kept exactly as JSON
    assert isinstance(encode_list([1, 2]), str) and isinstance(encode_list(["a"]), str)


def test_numpy_values_are_stored_as_python_values(tmp_path):
    with Store.open(tmp_path) as s:
        s.write([rec("a", f1=np.float32(0.5), hallucinated=np.bool_(True), consensus_nosink=np.array([0.5, 0.25]))])
        (r,) = s.records()
    assert r["f1"] == 0.5 and r["hallucinated"] is True and r["consensus_nosink"] == [0.5, 0.25]


def test_a_key_is_stored_once(tmp_path):
    with Store.open(tmp_path) as s:
        assert s.write([rec("a"), rec("b")]) == 2
        assert s.write([rec("b", f1=0.9), rec("c")]) == 1
        assert s.count() == 3 and s.keys() == {"a", "b", "c"}
        assert [r["f1"] for r in s.records()] == [0.25, 0.25, 0.25]


def test_a_failing_batch_writes_nothing_not_even_new_columns(tmp_path):
    with Store.open(tmp_path) as s:
        s.write([rec("a")])
        with pytest.raises(StoreError, match="field 'f1' holds str"):
            s.write([rec("b", new_field=1.0), rec("c", f1="oops")])
        assert s.keys() == {"a"}
        s.write([rec("d", new_field=[0.5])])  # the rolled-back column can come back with another kind
        assert s.records()[-1]["new_field"] == [0.5]


def test_new_fields_become_columns_and_old_rows_read_none(tmp_path):
    with Store.open(tmp_path) as s:
        s.write([rec("a")])
        s.write([rec("b", extra_metric=0.7)])
        a, b = s.records()
    assert a["extra_metric"] is None and b["extra_metric"] == 0.7


def test_second_writer_is_refused_with_the_holder_named(tmp_path):
    with Store.open(tmp_path):
        with pytest.raises(StoreLockedError, match=rf"being written by another sweep \(pid {os.getpid()} on .*, "
                                                   r"started .*\); wait for it to finish or use another --out"):
            Store.open(tmp_path)
        assert read_records(tmp_path) == []  # readers are never blocked
    Store.open(tmp_path).close()


def test_lock_dies_with_a_killed_process(tmp_path):
    code = (f"from kvroute.sweep.lock import RunLock; import time; RunLock({str(tmp_path)!r}).acquire(); "
            "print('locked', flush=True); time.sleep(60)")
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "locked"
        with pytest.raises(StoreLockedError, match=f"pid {p.pid}"):
            Store.open(tmp_path)
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait()
    assert (tmp_path / LOCK_NAME).exists()  # the file stays, the lock does not
    Store.open(tmp_path).close()


def test_not_a_store_is_refused(tmp_path):
    (tmp_path / STORE_NAME).write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(StoreError, match="as a kvroute run store .*file is not a database"):
        Store.open(tmp_path)


def test_store_uses_wal_and_readers_see_committed_batches(tmp_path):
    with Store.open(tmp_path) as s:
        s.write([rec("a")])
        con = sqlite3.connect(tmp_path / STORE_NAME)
        assert con.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert con.execute("SELECT COUNT(*) FROM records").fetchone()[0] == 1
        con.close()


def test_summary_per_model_press_ratio(tmp_path):
    rows = [rec("a", f1=1.0, hallucinated=False, ger=0.0), rec("b", f1=0.0, hallucinated=True, ger=0.5),
            rec("c", press="none", ratio=0.0, f1=1.0, hallucinated=False, ger=0.0),
            rec("d", settings="other"), rec("e", f1=1.0, hallucinated=False, ger=0.0, restore="answer")]
    with Store.open(tmp_path) as s:
        s.write(rows)
        out = s.summary("s")
    assert out == [  # a restored cell is its own row, after its press's own cells
        {"model": "m", "regime": "agnostic", "press": "none", "ratio": 0.0, "restore": None, "n": 1, "f1": 1.0,
         "hallucination_rate": 0.0, "ger": 0.0, "errors": 0},
        {"model": "m", "regime": "agnostic", "press": "knorm", "ratio": 0.5, "restore": None, "n": 2, "f1": 0.5,
         "hallucination_rate": 0.5, "ger": 0.25, "errors": 0},
        {"model": "m", "regime": "agnostic", "press": "knorm", "ratio": 0.5, "restore": "answer", "n": 1, "f1": 1.0,
         "hallucination_rate": 0.0, "ger": 0.0, "errors": 0},
    ]


def test_analysis_reads_the_store_and_both_exports(tmp_path):
    rows = [rec(k, press=p, ratio=r, instance_id="x")
            for k, p, r in (("a", "knorm", 0.5), ("b", "none", 0.0), ("c", "knorm", 0.9))]
    run = tmp_path / "run"
    with Store.open(run) as s:
        s.write(rows)
    df = load_records(run)
    assert df["consensus_nosink"].tolist() == [r["consensus_nosink"] for r in rows]
    assert df["gold"].tolist() == [r["gold"] for r in rows] and df["hallucinated"].dtype == bool
    for fmt in ("parquet", "csv"):
        path, n = export_records(run, fmt)
        assert n == 3 and path == run / f"records.{fmt}"
        back = load_records(path)
        assert back["press"].tolist() == ["none", "knorm", "knorm"]  # baseline first, then by ratio
        assert [list(v) for v in back["probe_features"]] == [r["probe_features"] for r in rows]
        assert back["hallucinated"].tolist() == [True] * 3
    assert isinstance(pd.read_csv(run / "records.csv")["gold"][0], str)


def test_reading_while_a_writer_commits(tmp_path):
    with Store.open(tmp_path) as s:
        for i in range(5):
            s.write([rec(f"k{i}")])
            assert len(read_records(tmp_path)) == i + 1
        # a writer in the middle of a transaction: a reader sees the committed records, without waiting
        s.con.execute("BEGIN IMMEDIATE")
        s.con.execute("UPDATE records SET key = key")
        assert s.con.execute("PRAGMA journal_mode").fetchone()[0] == "wal"  # readers never wait on writers
        reader = sqlite3.connect(tmp_path / STORE_NAME, timeout=0)  # waiting for a lock would raise at once
        assert reader.execute("SELECT COUNT(*) FROM records").fetchone()[0] == 5
        reader.close()
        assert len(read_records(tmp_path)) == 5
        s.con.execute("ROLLBACK")
