"""Fault tests (issue 20): real kills and a real full disk, on the tiny models of the bad-input catalogue.

* SIGKILL at seeded random points of ``kvroute export`` and ``kvroute report`` (a subprocess, killed the
  moment its temporary file appears plus a seeded few milliseconds, or after a seeded delay anywhere in
  the run): afterwards every visible output is either its old bytes or the complete new file, only the
  killed writer's hidden temporary is left, and a rerun removes it and writes exactly what an
  uninterrupted run writes;
* SIGINT during a sweep: one line ``interrupted; ... resume with kvroute sweep ... --resume``, exit 130,
  the store intact, and the resume gives the records of an uninterrupted run;
* a session killed with -9 (left ``"running"`` in the manifest) reads ``interrupted`` in the next
  report and after the next resume;
* a full disk: a 2 MiB tmpfs in a mount namespace (``unshare -m``, as root), filled: export and sweep
  fail with one line naming the path, and the store is intact.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from kvroute.cli import main
from kvroute.models import save_tiny_model
from kvroute.sweep import load_sweep_config, read_records, run_sweep
from kvroute.sweep.manifest import MANIFEST_NAME, read_manifest, write_manifest
from kvroute.sweep.store import STORE_NAME, Store

KVROUTE = [sys.executable, "-m", "kvroute.cli"]
#: the same CLI with every store write followed by a pause: a tiny-model unit takes ~50 ms, so without it a
#: signal sent once some units are stored can land after the last one on a fast (or a busy) machine
SLOW_KVROUTE = [sys.executable, "-c", "import time; from kvroute.sweep.store import Store; w = Store.write; "
                "Store.write = lambda self, r: (w(self, r), time.sleep(0.5))[0]; "
                "from kvroute.cli import main; main()"]
_VOLATILE = ("-wal", "-shm", ".lock")

CONFIG = """
name = "faults"
models = ["{model}"]
presses = {presses}
ratios = [0, 0.5, 0.9]

[[tasks]]
family = "base"
n = {n}

[decoding]
max_new_tokens = 3
"""


# helpers ---------------------------------------------------------------------------------------------
def cli(argv: list) -> int:
    """``kvroute ARGV`` in this process; the exit code."""
    try:
        main([str(a) for a in argv])
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else 1
    return 0


def files(root: Path) -> dict[str, bytes]:
    """Every visible file under ``root`` (hidden temporaries and SQLite's -wal/-shm left out)."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and not p.name.endswith(_VOLATILE)
            and not any(part.startswith(".") for part in p.relative_to(root).parts)}


def temps(folder: Path) -> list[str]:
    """The hidden temporaries of kvroute's writers (``.NAME.PID.XXXX.tmp``) directly in ``folder``."""
    return sorted(p.name for p in folder.iterdir() if p.name.startswith(".") and p.name.endswith(".tmp"))


def kill_during(argv: list, folder: Path, *, mode: str, seed: int, delay: tuple[float, float] = (0.3, 3.0),
                limit: float = 60, until: Callable[[], bool] | None = None) -> int:
    """Run ``kvroute ARGV`` in a subprocess and SIGKILL it; returns its exit code (-9, or 0 if it finished first).

    ``mode="temp"``: the moment a temporary appears in ``folder`` (the write has begun), plus a seeded
    0–10 ms; ``mode="until"``: the moment ``until()`` holds, plus a seeded time in ``delay``;
    ``mode="delay"``: after a seeded time in ``delay`` (import, reading, analysing or writing).
    """
    rng = random.Random(seed)
    proc = subprocess.Popen([*KVROUTE, *map(str, argv)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        if mode in ("temp", "until"):
            ready = until if mode == "until" and until is not None else (lambda: bool(temps(folder)))
            deadline = time.monotonic() + limit
            while proc.poll() is None and not ready() and time.monotonic() < deadline:
                time.sleep(0.0005)
            time.sleep(rng.uniform(*delay) if mode == "until" else rng.uniform(0, 0.01))
        else:
            time.sleep(rng.uniform(*delay))
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode


def quick_check(run: Path) -> str:
    con = sqlite3.connect(f"file:{run / STORE_NAME}?mode=ro", uri=True)
    try:
        return con.execute("PRAGMA quick_check").fetchone()[0]
    finally:
        con.close()


def count(run: Path) -> int:
    try:
        con = sqlite3.connect(f"file:{run / STORE_NAME}?mode=ro", uri=True)
        try:
            return con.execute("SELECT COUNT(*) FROM records").fetchone()[0]
        finally:
            con.close()
    except sqlite3.Error:
        return 0


def comparable(run: Path) -> dict[str, dict]:
    return {r["key"]: {k: v for k, v in r.items() if not k.startswith("seconds_")} for r in read_records(run)}


# fixtures ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_model(tmp_path_factory.mktemp("faults-model") / "tiny-llama", "llama", seed=0)


@pytest.fixture(scope="module")
def small_config(tiny: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    p = tmp_path_factory.mktemp("faults-config") / "small.toml"
    p.write_text(CONFIG.format(model=tiny, presses='["knorm"]', n=3))  # 3 units (prefills) × 3 cells
    return p


@pytest.fixture(scope="module")
def finished_run(small_config: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = tmp_path_factory.mktemp("faults-run") / "run"
    assert run_sweep(load_sweep_config(small_config), run).computed == 9
    return run


@pytest.fixture(scope="module")
def padded_run(finished_run: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The finished run plus 3,000 copies of its records under new keys: an export that takes a while to write."""
    run = tmp_path_factory.mktemp("faults-padded") / "run"
    shutil.copytree(finished_run, run)
    recs = read_records(run)
    with Store.open(run) as s:
        s.write([{**r, "key": f"{r['key']}-{i}", "instance_id": f"{r['instance_id']}-{i}"}
                 for i in range(3000 // len(recs)) for r in recs])
    return run


@pytest.fixture(scope="module")
def reference_exports(padded_run: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    ref = tmp_path_factory.mktemp("faults-ref-export")
    out = {}
    for fmt in ("csv", "parquet"):
        assert cli(["export", padded_run, "--format", fmt, "--out", ref / f"records.{fmt}"]) == 0
        out[fmt] = (ref / f"records.{fmt}").read_bytes()
    return out


@pytest.fixture(scope="module")
def reference_report(finished_run: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    run = tmp_path_factory.mktemp("faults-ref-report") / "run"
    shutil.copytree(finished_run, run)
    assert cli(["report", run, "--n-boot", "10"]) == 0
    return files(run / "report")


@pytest.fixture(scope="module")
def reported_run(finished_run: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The finished run with an earlier report of another title (so old and new bytes differ)."""
    run = tmp_path_factory.mktemp("faults-reported") / "run"
    shutil.copytree(finished_run, run)
    assert cli(["report", run, "--n-boot", "10", "--title", "the previous report"]) == 0
    return run


# SIGKILL during an export --------------------------------------------------------------------------------
@pytest.mark.parametrize(("fmt", "mode", "seed"), [("csv", "temp", 0), ("csv", "delay", 1), ("csv", "delay", 2),
                                                   ("parquet", "temp", 3), ("parquet", "delay", 4)])
def test_export_killed_at_a_random_point(fmt, mode, seed, padded_run, reference_exports, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(padded_run, run)
    target = run / f"records.{fmt}"
    target.write_bytes(b"previous export\n")
    before = files(run)
    # an export of these 3,000 records takes ~0.7 s (CSV) to ~0.9 s (Parquet) from the start of the process:
    # a delay in 0.3–0.65 s lands in the read, the conversion or the write
    code = kill_during(["export", run, "--format", fmt], run, mode=mode, seed=seed, delay=(0.3, 0.65))
    assert code in (-signal.SIGKILL, 0)
    after = files(run)
    assert sorted(after) == sorted(before)  # no visible partial file
    assert after[f"records.{fmt}"] in (b"previous export\n", reference_exports[fmt])  # old bytes or all new ones
    assert {k: v for k, v in after.items() if k != f"records.{fmt}"} == \
        {k: v for k, v in before.items() if k != f"records.{fmt}"}  # the store and the manifest untouched
    assert all(t.startswith(f".records.{fmt}.") for t in temps(run)), temps(run)  # only the killed writer's temp
    assert quick_check(run) == "ok"
    assert cli(["export", run, "--format", fmt]) == 0  # the rerun
    assert target.read_bytes() == reference_exports[fmt]
    assert temps(run) == []  # the killed writer's temp is gone too


# SIGKILL during a report ----------------------------------------------------------------------------------
@pytest.mark.parametrize(("mode", "seed"), [("temp", 0), ("delay", 1), ("delay", 2)])
def test_report_killed_at_a_random_point(mode, seed, reported_run, reference_report, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(reported_run, run)
    old = files(run / "report")
    assert old != reference_report
    run_files = {k: v for k, v in files(run).items() if not k.startswith("report/")}
    code = kill_during(["report", run, "--n-boot", "10"], run, mode=mode, seed=seed)
    assert code in (-signal.SIGKILL, 0)
    now = files(run / "report")
    assert now in (old, reference_report), sorted(set(now) ^ set(old))  # the old report or the whole new one
    assert {k: v for k, v in files(run).items() if not k.startswith("report/")} == run_files
    assert all(t.startswith(".report.") for t in temps(run)), temps(run)
    assert cli(["report", run, "--n-boot", "10"]) == 0
    assert files(run / "report") == reference_report
    assert temps(run) == []


# SIGKILL during a sweep ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def eight_units(tiny: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A config of 8 units (prefills) × 3 cells and its uninterrupted run."""
    p = tmp_path_factory.mktemp("faults-config8") / "eight.toml"
    p.write_text(CONFIG.format(model=tiny, presses='["knorm"]', n=8))
    run = tmp_path_factory.mktemp("faults-run8") / "run"
    assert run_sweep(load_sweep_config(p), run).computed == 24
    return p, run


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_sweep_killed_at_a_random_point_resumes_to_the_uninterrupted_records(seed, eight_units, tmp_path):
    """Killed once the store holds a seeded number of units (0–3 of 8), plus a seeded 0–20 ms: in a
    prefill, a decode or a store transaction. A tiny-model unit takes ~50 ms, so at least five units
    (~0.25 s) are still to come: the kill is mid-sweep however fast the machine."""
    config, finished = eight_units
    run = tmp_path / "run"
    units = random.Random(seed).choice([0, 1, 2, 3])
    code = kill_during(["sweep", config, "--out", run], tmp_path, mode="until", seed=seed, delay=(0, 0.02),
                       limit=120, until=lambda: (run / STORE_NAME).exists() and count(run) >= 3 * units)
    assert code == -signal.SIGKILL  # killed mid-sweep, not after it
    done = count(run)
    assert quick_check(run) == "ok"
    assert done % 3 == 0 and 3 * units <= done < 24  # whole units only
    assert cli(["sweep", config, "--out", run, "--resume"]) == 0
    assert comparable(run) == comparable(finished)
    assert temps(run) == []


# SIGINT during a sweep; a kill -9'd session shown as interrupted -----------------------------------------
def test_sigint_during_a_sweep_says_how_to_resume(eight_units, tmp_path):
    """SIGINT once the first unit is stored. Every store write is followed by a 0.5 s pause (SLOW_KVROUTE), so
    seven units (≥ 3.5 s) are still to come: the signal lands mid-sweep however fast or busy the machine."""
    config, finished = eight_units
    run = tmp_path / "run"
    # SIGINT back to its default in the child: a test run started in the background (`pytest &`) inherits an
    # ignored SIGINT, and Python then never raises KeyboardInterrupt
    proc = subprocess.Popen([*SLOW_KVROUTE, "sweep", str(config), "--out", str(run)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 120
        while proc.poll() is None and time.monotonic() < deadline:
            if (run / STORE_NAME).exists() and count(run) >= 3:
                break
            time.sleep(0.0005)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err[-2000:]
    assert "Traceback" not in err
    last = [line for line in err.splitlines() if line.strip()][-1]
    assert last.startswith("interrupted;") and f"kvroute sweep {config} --out {run} --resume" in last, last
    assert quick_check(run) == "ok"
    done = len(read_records(run))
    assert 0 < done < 24 and done % 3 == 0  # whole units only
    assert read_manifest(run)["sessions"][-1]["status"] == "interrupted"
    assert cli(["sweep", config, "--out", run, "--resume"]) == 0
    assert comparable(run) == comparable(finished)  # exactly the uninterrupted run's records


def test_a_killed_session_reads_interrupted_in_the_report_and_after_a_resume(finished_run, small_config, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    m = read_manifest(run)
    m["status"] = m["sessions"][-1]["status"] = "running"  # what kill -9 leaves: it never said otherwise
    m["sessions"][-1]["finished"] = None
    write_manifest(run, m)
    manifest_bytes = (run / MANIFEST_NAME).read_bytes()
    from kvroute.sweep.lock import RunLock

    with RunLock(run):  # a sweep holds the run: "running" is true, and the report says so
        assert cli(["report", run, "--n-boot", "10"]) == 0
        assert ": running," in (run / "report" / "report.html").read_text()
    assert cli(["report", run, "--n-boot", "10"]) == 0
    html = (run / "report" / "report.html").read_text()
    assert ": interrupted (stale:" in html and ": running," not in html
    assert (run / MANIFEST_NAME).read_bytes() == manifest_bytes  # a report changes no byte of the run
    assert cli(["sweep", small_config, "--out", run, "--resume"]) == 0
    sessions = read_manifest(run)["sessions"]
    assert [s["status"] for s in sessions] == ["interrupted", "complete"] and sessions[0]["stale"] is True


# a real full disk: a small tmpfs in a mount namespace ------------------------------------------------------
FULL_DISK = r"""
set -u
mount -t tmpfs -o size=2m kvroute-full-disk "$MNT" || exit 99
cp -a "$RUN" "$MNT/run"
dd if=/dev/zero of="$MNT/fill" bs=4k >/dev/null 2>&1
truncate -s "-$FREE" "$MNT/fill"
"$PY" -m kvroute.cli $ARGS >"$OUT/stdout" 2>"$OUT/stderr"
echo $? >"$OUT/rc"
rm -f "$MNT/fill"
"$PY" -c "import sqlite3, sys; c = sqlite3.connect(sys.argv[1]); print(c.execute('PRAGMA quick_check').fetchone()[0])" \
    "$MNT/run/store.sqlite" >"$OUT/quick_check"
ls -A "$MNT/run" >"$OUT/ls"
cp -a "$MNT/run" "$OUT/run-after"
"""


@pytest.mark.parametrize(("case", "free", "match"), [
    ("export", "0", ("records.csv", STORE_NAME)),  # no room for the CSV (or for reading the WAL store's -shm)
    ("sweep", "8k", ("manifest.json", STORE_NAME)),  # the manifest may fit, the unit's records do not
])
def test_full_disk_keeps_the_store(case, free, match, finished_run, small_config, tmp_path):
    """On a really full file system: one line naming the path, exit 1, the store intact and its records unchanged."""
    mnt, out = tmp_path / "mnt", tmp_path / "out"
    mnt.mkdir()
    out.mkdir()
    args = {"export": f"export {mnt / 'run'} --format csv",
            "sweep": f"sweep {small_config} --out {mnt / 'run'} --resume --press knorm --press tova"}[case]
    env = {**os.environ, "MNT": str(mnt), "RUN": str(finished_run), "OUT": str(out), "PY": sys.executable,
           "FREE": free, "ARGS": args}
    proc = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", FULL_DISK], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    err = (out / "stderr").read_text()
    assert (out / "rc").read_text().strip() == "1", err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.strip()]
    assert lines[-1].startswith("error: ") and "no space left on the device" in lines[-1], err
    assert any(f"{mnt / 'run' / m}:" in lines[-1] for m in match), lines[-1]
    assert (out / "quick_check").read_text().strip() == "ok"
    assert comparable(out / "run-after") == comparable(finished_run)  # no record lost, none half-written
    leftovers = [n for n in (out / "ls").read_text().split() if n.endswith(".tmp") or n == "records.csv"]
    assert leftovers == []  # no temp file, no partial export
    manifest = json.loads((out / "run-after" / MANIFEST_NAME).read_text())
    assert manifest["sessions"][0]["status"] == "complete"  # the earlier session's record is kept


# Ctrl-C in any other command: kvroute's one line and exit 130, never click's "Aborted!" ----------------
def _leaf_commands(group, path=()):
    for name, cmd in group.commands.items():
        if hasattr(cmd, "commands"):  # a group (typer carries its own copy of click)
            yield from _leaf_commands(cmd, (*path, name))
        else:
            yield (*path, name), cmd


def test_every_command_turns_ctrl_c_into_one_interrupted_line(finished_run, monkeypatch, capsys):
    import typer

    from kvroute.cli import app

    leaves = dict(_leaf_commands(typer.main.get_command(app)))
    assert len(leaves) > 10 and {("report",), ("models", "list"), ("tasks", "show")} <= set(leaves)
    unwrapped = [" ".join(p) for p, cmd in leaves.items() if not hasattr(cmd.callback, "__wrapped__")]
    assert unwrapped == []  # every command goes through the one Ctrl-C mechanism

    def interrupt(*_a, **_k):
        raise KeyboardInterrupt

    monkeypatch.setattr("kvroute.analysis.load.load_records", interrupt)
    with pytest.raises(SystemExit) as e:
        main(["report", str(finished_run), "--out", str(finished_run.parent / "never")])
    err = capsys.readouterr().err
    assert e.value.code == 130
    assert "Aborted" not in err and "Traceback" not in err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("interrupted;"), err
    assert not (finished_run.parent / "never").exists()
