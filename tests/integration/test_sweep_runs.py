"""Sweeps end to end on a tiny Qwen2 saved as a local folder: kill and resume, determinism, Ray = local,
the run lock, bad input refused before any model loads, the CLI's summary and export."""

import json
import math
import shutil
import signal
import sqlite3
import subprocess
import sys
import time

import pytest
from typer.testing import CliRunner

import kvroute.models
from kvroute.cli import app
from kvroute.errors import ConfigError, StoreLockedError
from kvroute.models import save_tiny_model
from kvroute.sweep import load_sweep_config, read_records, run_sweep
from kvroute.sweep.manifest import read_manifest
from kvroute.sweep.store import STORE_NAME, Store

N_INSTANCES, CELLS_PER_UNIT = 10, 5
TOTAL = N_INSTANCES * CELLS_PER_UNIT

CONFIG = """
name = "tiny"
models = ["{model}"]
presses = ["knorm", "snapkv+adakv"]
ratios = [0, 0.5, 0.9]

[[tasks]]
family = "base"
n = {n}

[decoding]
max_new_tokens = 4
"""


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    d = tmp_path_factory.mktemp("sweep")
    save_tiny_model(d / "tiny-qwen2", "qwen2", seed=0)
    (d / "sweep.toml").write_text(CONFIG.format(model=d / "tiny-qwen2", n=N_INSTANCES))
    return d


@pytest.fixture(scope="module")
def config_path(folder):
    return folder / "sweep.toml"


@pytest.fixture(scope="module")
def uninterrupted(folder, config_path):
    """The reference: one uninterrupted local run."""
    out = run_sweep(load_sweep_config(config_path), folder / "ref")
    assert out.computed == TOTAL
    return folder / "ref"


def comparable(run_dir):
    """Records by key, timings left out; fails on a duplicated key."""
    recs = read_records(run_dir)
    keys = [r["key"] for r in recs]
    assert len(keys) == len(set(keys)), "a cell was stored twice"
    return {r["key"]: {k: v for k, v in r.items() if not k.startswith("seconds_")} for r in recs}


def assert_same_records(a, b, *, rel):
    """Same keys, same fields, equal values; floats (also inside lists) equal to ``rel``, NaN equal to NaN."""
    assert a.keys() == b.keys()

    def same(x, y):
        if isinstance(x, float) and isinstance(y, float):
            return (math.isnan(x) and math.isnan(y)) or x == pytest.approx(y, rel=rel, abs=1e-6)
        if isinstance(x, list) and isinstance(y, list):
            return len(x) == len(y) and all(same(u, v) for u, v in zip(x, y, strict=True))
        return x == y

    for key in a:
        assert a[key].keys() == b[key].keys(), key
        bad = [f for f in a[key] if not same(a[key][f], b[key][f])]
        assert not bad, f"{key}: {[(f, a[key][f], b[key][f]) for f in bad][:3]}"


def count(run_dir):
    try:
        con = sqlite3.connect(f"file:{run_dir / STORE_NAME}?mode=ro", uri=True)
        try:
            return con.execute("SELECT COUNT(*) FROM records").fetchone()[0]
        finally:
            con.close()
    except sqlite3.Error:
        return 0


def test_killed_sweep_resumes_to_exactly_the_uninterrupted_records(folder, config_path, uninterrupted):
    run = folder / "killed"
    proc = subprocess.Popen([sys.executable, "-m", "kvroute.cli", "sweep", str(config_path), "--out", str(run)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while count(run) < CELLS_PER_UNIT and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        with pytest.raises(StoreLockedError, match=f"pid {proc.pid}"):  # a concurrent sweep is refused
            Store.open(run)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    before = count(run)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.read().decode()[-2000:]
    assert 0 < before < TOTAL and before % CELLS_PER_UNIT == 0  # whole units only: one transaction each
    assert read_manifest(run)["status"] == "running"  # it never got to say otherwise

    out = run_sweep(load_sweep_config(config_path), run, resume=True)
    assert (out.already_done, out.computed) == (before, TOTAL - before)
    got, want = comparable(run), comparable(uninterrupted)
    assert got.keys() == want.keys()
    assert [k for k in want if got[k] != want[k]] == []
    sessions = read_manifest(run)["sessions"]
    assert ([s["status"] for s in sessions] == ["interrupted", "complete"]
            and sessions[1]["cells_computed"] == TOTAL - before)
    assert sessions[0]["stale"] is True  # the killed session, marked when the resume took the lock


def test_same_config_twice_gives_identical_records(folder, config_path, uninterrupted):
    run_sweep(load_sweep_config(config_path), folder / "again")
    assert comparable(folder / "again") == comparable(uninterrupted)
    assert len(comparable(uninterrupted)) == TOTAL


def test_ray_backend_gives_the_local_records(folder, config_path, uninterrupted):
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, logging_level="WARNING")
    try:
        cfg = load_sweep_config(config_path, ["ray.instances_per_shard=3"])
        out = run_sweep(cfg, folder / "ray", backend="ray")
    finally:
        ray.shutdown()
    assert out.computed == TOTAL
    # Ray's workers run torch with their own thread count, so float reductions may differ in the last bits
    assert_same_records(comparable(folder / "ray"), comparable(uninterrupted), rel=1e-5)
    assert read_manifest(folder / "ray")["backend"] == "ray"


def test_rerun_without_resume_is_refused_and_resume_of_a_finished_run_computes_nothing(folder, config_path,
                                                                                      uninterrupted):
    copy = folder / "copy"
    shutil.copytree(uninterrupted, copy)
    with pytest.raises(Exception, match="already holds 50 records.*--resume"):
        run_sweep(load_sweep_config(config_path), copy)
    res = CliRunner().invoke(app, ["sweep", str(config_path), "--out", str(copy), "--resume"])
    assert res.exit_code == 0, res.output
    assert "0 cells computed, 50 already in the store" in res.output
    assert "snapkv+adakv" in res.output and "halluc. rate" in res.output  # the summary table
    res = CliRunner().invoke(app, ["export", str(copy), "--format", "csv", "--out", str(folder / "x.csv")])
    assert res.exit_code == 0 and "wrote 50 records" in res.output


def test_cli_refuses_a_locked_run_dir(folder, config_path):
    run = folder / "locked"
    with Store.open(run):
        res = CliRunner().invoke(app, ["sweep", str(config_path), "--out", str(run)])
    assert isinstance(res.exception, StoreLockedError)
    assert "being written by another sweep" in str(res.exception)


@pytest.fixture
def no_model_loads(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("a model or tokenizer was loaded")

    for name in ("load_model", "load_tokenizer"):
        monkeypatch.setattr(kvroute.models, name, refuse)
        monkeypatch.setattr(kvroute.models.loading, name, refuse)


@pytest.mark.parametrize(("edit", "needle"), [
    (("presses = [\"knorm\"", "presses = [\"knrom\""),
     r"presses\[0\] = 'knrom': unknown scorer 'knrom'; did you mean 'knorm'"),
    (("ratios = [0, 0.5, 0.9]", "ratios = [0, 0.5, 1.0]"), r"ratios\[2\] = 1.0: compression ratio must be in \[0, 1\)"),
    (("family = \"base\"\nn = 10", "file = \"missing.jsonl\""),
     r"tasks\[0\].file = 'missing.jsonl': no such task file"),
    (("family = \"base\"\nn = 10", "file = \"empty.jsonl\""),
     r"tasks\[0\]: gives no task instances, so the grid would be empty"),
    (("ratios = [0, 0.5, 0.9]", "ratios = []"), r"ratios = \[\]: is empty, so the grid would be empty"),
])
def test_bad_input_fails_before_any_model_loads(folder, tmp_path, no_model_loads, edit, needle):
    (tmp_path / "empty.jsonl").write_text("")
    text = (folder / "sweep.toml").read_text()
    assert edit[0] in text
    cfg = tmp_path / "bad.toml"
    cfg.write_text(text.replace(*edit))
    with pytest.raises(ConfigError, match=needle) as e:
        run_sweep(load_sweep_config(cfg), tmp_path / "run")
    assert "bad.toml" in str(e.value)
    assert not (tmp_path / "run").exists()  # nothing written either


def test_dry_run_shows_the_grid_without_loading(config_path, no_model_loads):
    res = CliRunner().invoke(app, ["sweep", str(config_path), "--out", "unused", "--dry-run", "--ratios", "0,0.5"])
    assert res.exit_code == 0, res.output
    assert "30 cells = 10 units (prefills) × 3 cells" in " ".join(res.output.split())


def test_run_dir_is_reproducible_from_itself(uninterrupted):
    m = read_manifest(uninterrupted)
    assert m["status"] == "complete" and m["config"]["settings_hash"] == read_records(uninterrupted)[0]["settings"]
    assert set(m) >= {"versions", "git", "device", "started", "finished", "config", "grid"}
    (task_file,) = m["task_files"]
    lines = (uninterrupted / task_file).read_text().splitlines()
    ids = {json.loads(line)["id"] for line in lines}
    assert ids == {r["instance_id"] for r in read_records(uninterrupted)}


def test_a_grid_too_big_for_the_memory_stops_before_its_first_cell(folder, config_path, tmp_path, monkeypatch):
    """The largest instance is checked against the free memory before any unit runs: the sweep stops naming it and
    the memory it needs, with nothing in the store."""
    import kvroute.engine.attention.streaming as streaming
    from kvroute.errors import SweepError

    monkeypatch.setattr(streaming, "available_memory", lambda _device: 50_000)
    with pytest.raises(SweepError, match=r"instance \w+ \(the longest: \d+ context tokens\).*needs about .*nothing "
                                         "was computed"):
        run_sweep(load_sweep_config(config_path), tmp_path / "run")
    assert list(read_records(tmp_path / "run")) == []


def test_restored_cells_are_keyed_recorded_and_kept_out_of_the_other_analyses(folder, tmp_path):
    """A sweep with restore conditions: each compressed cell also runs restored; the records carry the condition;
    the cells without one keep the keys they have without restores; load_records leaves restored cells out unless
    asked; the report shows the restoration table."""
    from kvroute.analysis.load import load_records
    from kvroute.analysis.restoration import restoration_table
    from kvroute.report.build import build_run_report
    from kvroute.sweep.driver import plan_sweep

    text = CONFIG.format(model=folder / "tiny-qwen2", n=3).replace("ratios = [0, 0.5, 0.9]", "ratios = [0, 0.9]")
    text = text.replace("n = 3\n", "n = 3\ndistractors = 2\n")  # values for restore=distractor to put back
    plain = tmp_path / "plain.toml"
    plain.write_text(text)
    restored = tmp_path / "restored.toml"
    restored.write_text(text.replace("ratios = [0, 0.9]",
                                     'ratios = [0, 0.9]\nrestore = ["answer", "random", "distractor"]'))
    keys = {k for u in plan_sweep(load_sweep_config(plain)).units for k in u.keys}
    plan = plan_sweep(load_sweep_config(restored))
    assert keys < {k for u in plan.units for k in u.keys}
    assert len(plan.units[0].cells) == 1 + 2 * 4  # the baseline, then each press's cell and its three restorations
    run_sweep(load_sweep_config(restored), tmp_path / "run")
    recs = list(read_records(tmp_path / "run"))
    assert {r["restore"] for r in recs} == {None, "answer", "random", "distractor"} and len(recs) == 3 * 9
    null = [r for r in recs if r["restore"] == "distractor"]
    assert all(r.get("status", "ok") == "ok" for r in null), [r.get("error") for r in null]
    assert {r["key"] for r in recs if r["restore"] is None} == keys
    assert load_records(tmp_path / "run")["restore"].isna().all()
    assert len(load_records(tmp_path / "run", with_restored=True)) == len(recs)
    table = restoration_table(load_records(tmp_path / "run", with_restored=True))
    assert set(table["restore"]) <= {"answer", "random", "distractor"}
    html = build_run_report(tmp_path / "run").read_text()
    assert "Causal restoration" in html
