"""The report's analysis timed: this tree against an earlier commit, on the same run's records, side by side.

    python benchmarks/report_speed.py --run RUN_DIR --before REV [--repeats 2] [--n-boot 1000]

``RUN_DIR`` is a finished run (``kvroute demo --out RUN_DIR``, or the after side that benchmarks/demo_speed.py leaves
in /tmp/kvroute-demo-speed/after). Each side runs :func:`kvroute.analysis.summary.run_analysis` on the run's records
(what ``kvroute report`` does before it draws anything) in a process of its own: the earlier commit from a
``git worktree`` of REV with that tree's ``src`` first on ``PYTHONPATH``, the same virtual environment. Runs are
interleaved (before, after, before, after, …); the table gives each side's median seconds. The two sides' summaries
(the report's ``summary.json``) and every analysis table are compared: ``identical`` means every value equal, floats
to 1e-12 relative (a speed change must not move a finding).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from common import ROOT, environment, median_spread, run_child, worktree, write  # noqa: E402
from compare_runs import largest_difference, same  # noqa: E402

CHILD = r"""
import json, sys, time
from kvroute.analysis.load import load_records
from kvroute.analysis.summary import AnalysisConfig, run_analysis
run, n_boot, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
df = load_records(run)
t0 = time.perf_counter()
res = run_analysis(df, AnalysisConfig(n_boot=n_boot))
seconds = time.perf_counter() - t0
tables = {k: v.to_dict(orient="list") for k, v in res.tables.items() if hasattr(v, "to_dict")}
with open(out, "w") as f:
    json.dump({"summary": res.summary, "tables": tables}, f, default=str)
print(json.dumps({"seconds": seconds, "records": len(df)}))
"""


def analyse(tree: Path, run: Path, n_boot: int, out: Path) -> dict[str, Any]:
    """The analysis of ``run`` by the kvroute of ``tree`` (its ``src`` first on the path), its output in ``out``."""
    env = {"PYTHONPATH": str(tree / "src") + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return run_child(CHILD, str(run), str(n_boot), str(out), env=env)


def compare(a: Any, b: Any, path: str = "") -> list[str]:
    """The places (as paths) where the two analyses' outputs differ beyond 1e-12 relative."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for k in sorted(set(a) | set(b), key=str) for d in compare(a.get(k), b.get(k), f"{path}/{k}")]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b, strict=True)) for d in compare(x, y, f"{path}[{i}]")]
    return [] if same(a, b, rtol=1e-12, atol=1e-15) else [f"{path}: {largest_difference(a, b):.2e}"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", type=Path, required=True, help="a finished run directory (its records are analysed)")
    ap.add_argument("--before", required=True, help="the earlier commit to time beside this tree")
    ap.add_argument("--repeats", type=int, default=2, help="runs of each side, interleaved")
    ap.add_argument("--n-boot", type=int, default=1000, help="bootstrap replicates (the report's default: 1000)")
    args = ap.parse_args()
    if not (args.run / "manifest.json").exists():
        ap.error(f"--run {args.run}: no manifest.json there; give a finished run directory (kvroute demo --out DIR)")
    seconds: dict[str, list[float]] = {"before": [], "after": []}
    records = 0
    with tempfile.TemporaryDirectory() as tmp, worktree(args.before) as tree:
        work = Path(tmp)
        assert tree is not None  # (--before is required)
        for i in range(args.repeats):
            for name, t in (("before", tree), ("after", ROOT)):
                res = analyse(t, args.run, args.n_boot, work / f"{name}{i}.json")
                seconds[name].append(res["seconds"])
                records = res["records"]
                print(f"{name}: {res['seconds']:.1f} s", flush=True)
        diffs = compare(*(json.loads((work / f"{n}0.json").read_text()) for n in ("before", "after")))
    ratio = statistics.median(seconds["after"]) / statistics.median(seconds["before"])
    cmd = (f"python benchmarks/report_speed.py --run {args.run} --before {args.before} --repeats {args.repeats} "
           f"--n-boot {args.n_boot}")
    lines = [
        "# The report's analysis: this tree against an earlier commit, on one run's records",
        "",
        f"Command: `{cmd}`",
        f"Environment: {environment()}",
        f"{records} records, {args.n_boot} bootstrap replicates; each side in a process of its own, runs interleaved.",
        "",
        "| side | seconds (median, range) |",
        "|---|---|",
        f"| before ({args.before}) | {median_spread(seconds['before'])} |",
        f"| after (this tree) | {median_spread(seconds['after'])} |",
        "",
        f"After / before: {ratio:.2f}×.",
        "",
        "Summaries and analysis tables: " + ("identical (every value equal, floats to 1e-12 relative)." if not diffs
                                             else f"{len(diffs)} differences, e.g. " + "; ".join(diffs[:5]) + "."),
        "",
        f"ratio: {ratio:.2f}",
    ]
    write("report_speed", lines)
    print("\n".join(lines))
    return 0 if not diffs else 1


if __name__ == "__main__":
    sys.exit(main())
