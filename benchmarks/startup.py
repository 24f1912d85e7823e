"""Startup time of the commands that load no model: `kvroute presses list` and `kvroute sweep CONFIG --dry-run`.

    python benchmarks/startup.py [--before REF] [--repeats 7] [--label NAME]

Each command runs in a fresh process (`python -m kvroute.cli ...`), `--repeats` times, interleaved with
the others so that machine noise falls on all alike; the table gives the median wall time with its
range, and which heavy libraries the command imported (read from `python -X importtime` in one more
run: kvpress, which patches every attention function of transformers on import, transformers, torch).
With `--before REF` the same commands also run from the source of git revision REF (checked out into
a temporary worktree, put first on PYTHONPATH), interleaved with the current source's runs: a
before/after pair measured side by side in one run, with the ratio of the medians. Results are
appended to results/startup.md under `--label`.
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import RESULTS, environment, worktree

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


def run(args: list[str], *, importtime: bool = False, src: Path | None = None) -> tuple[float, str]:
    """Wall time and stderr of ``python -m kvroute.cli ARGS`` (from the source folder ``src`` when given)."""
    cmd = [sys.executable, *(["-X", "importtime"] if importtime else []), "-m", "kvroute.cli", *args]
    env = dict(os.environ)
    if src is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(src), *filter(None, [env.get("PYTHONPATH")])])
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(args)} failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    return wall, proc.stderr


def imported(stderr: str) -> list[str]:
    """The heavy top-level packages named in ``-X importtime`` output."""
    names = {line.split("|")[-1].strip().split(".")[0] for line in stderr.splitlines()
             if line.startswith("import time:")}
    return [h for h in HEAVY if h in names]


def current_revision() -> str:
    """The checkout's revision, ``+changes`` when its working tree differs from it."""
    root = Path(__file__).resolve().parents[1]
    rev = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True)
    return (rev.stdout.strip() or "this tree") + (" +changes" if dirty.stdout.strip() else "")


def row(name: str, xs: list[float], heavy: list[str], extra: str = "") -> str:
    return (f"| `{name}` | {statistics.median(xs):.2f} s ({min(xs):.2f}–{max(xs):.2f}, n={len(xs)}) | "
            f"{', '.join(heavy) or 'none of ' + ', '.join(HEAVY)} |{extra}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", metavar="REF", help="also run the source of this git revision, interleaved")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--label", default="current")
    ap.add_argument("--no-write-results", action="store_true")
    args = ap.parse_args()
    sides = ["before", "after"] if args.before else ["after"]
    with tempfile.TemporaryDirectory() as tmp, worktree(args.before) as before_tree:
        config = Path(tmp) / "startup.toml"
        config.write_text(CONFIG)
        cmds = commands(config)
        src = {"before": None if before_tree is None else before_tree / "src", "after": None}
        times: dict[tuple[str, str], list[float]] = {(side, name): [] for side in sides for name in cmds}
        for side in sides:
            for argv in cmds.values():
                run(argv, src=src[side])  # warm the file cache once
        for _ in range(args.repeats):
            for name, argv in cmds.items():
                for side in sides:
                    times[side, name].append(run(argv, src=src[side])[0])
        heavy = {(side, name): imported(run(argv, importtime=True, src=src[side])[1])
                 for side in sides for name, argv in cmds.items()}
    command = "python benchmarks/startup.py" + (f" --before {shlex.quote(args.before)}" if args.before else "")
    lines = [f"### {args.label}", "", f"`{command} --label {shlex.quote(args.label)}` — {environment()}.", ""]
    if args.before:
        lines += ["| command | source | wall time, median (range, n) | imports | before / after |",
                  "|---|---|---|---|---|"]
        for name in cmds:
            ratio = statistics.median(times["before", name]) / statistics.median(times["after", name])
            lines.append(row(name, times["before", name], heavy["before", name])
                         .replace(" | ", f" | {args.before} | ", 1) + " |")
            lines.append(row(name, times["after", name], heavy["after", name])
                         .replace(" | ", f" | {current_revision()} | ", 1) + f" {ratio:.2f}× |")
    else:
        lines += ["| command | wall time, median (range, n) | imports |", "|---|---|---|"]
        lines += [row(name, times["after", name], heavy["after", name]) for name in cmds]
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
