"""Startup time of the commands that load no model: `kvroute presses list` and `kvroute sweep CONFIG --dry-run`.

    python benchmarks/startup.py [--repeats 7] [--label NAME]

Each command runs in a fresh process (`python -m kvroute.cli ...`), `--repeats` times, interleaved with
the others so that machine noise falls on all alike; the table gives the median wall time with its
range, and which heavy libraries the command imported (read from `python -X importtime` in one more
run: kvpress, which patches every attention function of transformers on import, transformers, torch).
Results are appended to results/startup.md under `--label` (e.g. "before" / "after" a change), so
that a before/after pair sits side by side in one file.
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import RESULTS, environment

HEAVY = ("kvpress", "transformers", "torch")
CONFIG = """name = "startup"
models = ["smollm2-135m"]
presses = ["expected_attention", "snapkv", "expected_attention+adakv"]
ratios = [0.0, 0.5, 0.9]
[[tasks]]
family = "base"
n = 4
"""


def commands(config: Path) -> dict[str, list[str]]:
    return {"kvroute presses list": ["presses", "list"],
            "kvroute sweep CONFIG --dry-run": ["sweep", str(config), "--out", str(config.parent / "run"), "--dry-run"]}


def run(args: list[str], *, importtime: bool = False) -> tuple[float, str]:
    cmd = [sys.executable, *(["-X", "importtime"] if importtime else []), "-m", "kvroute.cli", *args]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(args)} failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    return wall, proc.stderr


def imported(stderr: str) -> list[str]:
    """The heavy top-level packages named in ``-X importtime`` output."""
    names = {line.split("|")[-1].strip().split(".")[0] for line in stderr.splitlines() if line.startswith("import time:")}
    return [h for h in HEAVY if h in names]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--label", default="current")
    ap.add_argument("--no-write-results", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "startup.toml"
        config.write_text(CONFIG)
        cmds = commands(config)
        times: dict[str, list[float]] = {name: [] for name in cmds}
        for argv in cmds.values():
            run(argv)  # warm the file cache once
        for _ in range(args.repeats):
            for name, argv in cmds.items():
                times[name].append(run(argv)[0])
        heavy = {name: imported(run(argv, importtime=True)[1]) for name, argv in cmds.items()}
    lines = [f"### {args.label}", "", f"`python benchmarks/startup.py --label {shlex.quote(args.label)}` — {environment()}.", "",
             "| command | wall time, median (range, n) | imports |", "|---|---|---|"]
    for name in cmds:
        xs = times[name]
        lines.append(f"| `{name}` | {statistics.median(xs):.2f} s ({min(xs):.2f}–{max(xs):.2f}, n={len(xs)}) | "
                     f"{', '.join(heavy[name]) or 'none of ' + ', '.join(HEAVY)} |")
    print("\n".join(lines))
    if not args.no_write_results:
        out = RESULTS / "startup.md"
        head = ["# Startup time of model-free commands", "",
                "Fresh process per run, commands interleaved; see `benchmarks/startup.py`.", ""]
        old = out.read_text().rstrip("\n").splitlines() if out.exists() else head[:-1]
        out.write_text("\n".join([*old, "", *lines]) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
