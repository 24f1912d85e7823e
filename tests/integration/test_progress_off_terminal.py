"""Progress when stderr is a file (nohup, a batch scheduler, CI): plain lines, not an empty log.

A real `kvroute sweep` of a tiny Qwen2 runs in a subprocess with stderr redirected to a file; the
file must show the sweep's progress as plain lines (done/total, rate, ETA) and no terminal control
codes. ``KVROUTE_PROGRESS_INTERVAL`` sets the seconds between time-driven lines; set very large here,
so every line comes from the 5% rule and the test does not depend on how fast the machine is.
"""

import os
import re
import subprocess
import sys

import pytest

from kvroute.models import save_tiny_model

N_INSTANCES, CELLS_PER_UNIT = 4, 5  # a unit (one prefill) writes its 5 cells at once: 25% of the grid
CONFIG = """
name = "tiny"
models = ["{model}"]
presses = ["knorm", "snapkv+adakv"]
ratios = [0, 0.5, 0.9]

[[tasks]]
family = "base"
n = {n}

[decoding]
max_new_tokens = 2
"""
LINE = re.compile(r"^sweep tiny: (\d+) cells: (\d+)/(\d+) \((\d+)%\), "
                  r"[\d.]+ cells/(s|min), elapsed \d+:\d\d(, ETA \d+:\d\d)?$")


@pytest.fixture(scope="module")
def config_path(tmp_path_factory):
    d = tmp_path_factory.mktemp("progress")
    save_tiny_model(d / "tiny-qwen2", "qwen2", seed=0)
    (d / "sweep.toml").write_text(CONFIG.format(model=d / "tiny-qwen2", n=N_INSTANCES))
    return d / "sweep.toml"


def sweep(config_path, out, log, *args):
    env = {**os.environ, "KVROUTE_PROGRESS_INTERVAL": "100000"}
    env.pop("FORCE_COLOR", None), env.pop("FORCE_TERMINAL", None), env.pop("TTY_COMPATIBLE", None)
    flags = [a for a in args if a == "-v"]
    with open(log, "w") as err:
        proc = subprocess.run([sys.executable, "-m", "kvroute.cli", *flags, "sweep", str(config_path),
                               "--out", str(out), *[a for a in args if a != "-v"]],
                              stdout=subprocess.PIPE, stderr=err, text=True, env=env, timeout=600)
    assert proc.returncode == 0, log.read_text()[-3000:]
    return log.read_text().splitlines()


@pytest.fixture(scope="module")
def first_run(config_path, tmp_path_factory):
    d = tmp_path_factory.mktemp("first_run")
    return d / "run", sweep(config_path, d / "run", d / "stderr.log")


def test_a_sweep_logged_to_a_file_shows_plain_progress_lines(first_run):
    total = N_INSTANCES * CELLS_PER_UNIT
    _, log = first_run
    assert f"sweep tiny: {total} cells: started, {total} to do" in log
    progress = [m for m in map(LINE.match, log) if m]
    done = [int(m.group(2)) for m in progress]
    assert done == [5, 10, 15, 20]  # one line per unit here: each crosses a 5% step
    assert all(int(m.group(3)) == total and int(m.group(4)) == 100 * int(m.group(2)) // total for m in progress)
    assert all(m.group(6) for m in progress[:-1])  # an ETA while cells remain
    assert any(line.startswith(f"sweep tiny: {total} cells: done in") for line in log)
    assert not any("\x1b" in line or "\r" in line for line in log)  # no bar, cursor or colour codes


def test_a_resumed_sweep_counts_stored_cells_without_a_rate_and_verbose_logs_still_come(first_run, config_path,
                                                                                       tmp_path):
    total = N_INSTANCES * CELLS_PER_UNIT
    run, _ = first_run
    log = sweep(config_path, run, tmp_path / "resumed.log", "-v", "--resume")
    assert f"sweep tiny: {total} cells: started, {total} to do" in log
    assert f"sweep tiny: {total} cells: {total}/{total} already done, 0 to do" in log  # what is left, once counted
    assert not [line for line in log if LINE.match(line)]  # nothing computed: no rate, no ETA
    assert any(line.startswith(f"sweep tiny: {total} cells: done in") for line in log)
    assert any("already in the store" in line for line in log)  # -v logging still reaches the file
