"""Planted truth: does every estimator the report uses recover known parameters, with honest intervals?

    python benchmarks/planted_truth.py                    # 200 simulated data sets per row (the committed run)
    python benchmarks/planted_truth.py --sets 40          # quicker
    python benchmarks/planted_truth.py --only cliff ger_link

Each row of the table is one estimator on one planted truth (kvroute.analysis.planted): the mean
estimate over the simulated data sets and the share of those sets whose 95% interval covers the
truth. The tests (tests/unit/test_planted_*.py) assert the same on fewer sets, loosely.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from common import RESULTS, environment, fmt_cell, write

from kvroute.analysis.planted import MODULES, all_coverage


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sets", type=int, default=200, help="simulated data sets per row (default 200)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--only", nargs="*", choices=MODULES, help="only these estimator families")
    ap.add_argument("--no-write-results", action="store_true", help="print only; leave results/ alone")
    args = ap.parse_args()
    env = environment()
    lines = ["# Planted truth: recovery and 95% interval coverage", "",
             f"`python benchmarks/planted_truth.py --sets {args.sets}` — {env}.", "",
             "Each row simulates data sets with a known parameter (kvroute.analysis.planted), runs the estimator the "
             "report uses and counts how often its 95% interval covers the truth. The target is coverage ≥ 0.90; "
             "a row below it is a limit of that estimator at that truth, stated rather than hidden.", ""]
    all_rows = []
    for name in args.only or MODULES:
        t0 = time.perf_counter()
        rows = all_coverage(n_sets=args.sets, seed=args.seed, only=(name,))
        dt = time.perf_counter() - t0
        all_rows += rows
        keys = ["estimator", "parameter", "truth", "n_sets", "mean_estimate", "coverage"]
        extra = [k for k in dict.fromkeys(k for r in rows for k in r) if k not in keys + ["module", "note"]]
        cols = keys + extra + ["note"]
        lines += [f"## {name} ({dt:.0f} s)", "", "| " + " | ".join(cols) + " |",
                  "|" + "|".join("---" if c in ("estimator", "parameter", "note") else "---:" for c in cols) + "|"]
        lines += ["| " + " | ".join(fmt_cell(r.get(c)) for c in cols) + " |" for r in rows]
        low = [r for r in rows if isinstance(r.get("coverage"), float) and r["coverage"] < 0.9]
        lines += ["", f"{len(rows)} rows, {len(low)} with coverage below 0.90"
                  + (": " + "; ".join(f"{r['estimator']} at {r['parameter']} = {fmt_cell(r['truth'])} "
                                      f"({fmt_cell(r['coverage'])})" for r in low) if low else "") + ".", ""]
        print("\n".join(lines[-len(rows) - 5:]), flush=True)
    if not args.no_write_results:
        write("planted_truth", lines)
        (RESULTS / "planted_truth.json").write_text(json.dumps(all_rows, indent=1, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
