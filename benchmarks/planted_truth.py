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
    if not args.only:
        lines += mutation_table(all_rows)
        print("\n".join(lines[-12:]), flush=True)
    if not args.no_write_results:
        write("planted_truth", lines)
        (RESULTS / "planted_truth.json").write_text(json.dumps(all_rows, indent=1, default=str) + "\n")
    return 0


def mutation_table(rows: list[dict]) -> list[str]:
    """Each estimator beside its mutant (the ingredient it relies on removed), on the plant that tells them apart:
    the estimator must meet the criterion and the mutant must fail it ("caught")."""
    out = ["## Mutations", "",
           "| estimator | ingredient removed (the mutant) | plant | criterion | estimator | mutant | caught |",
           "|---|---|---|---|---:|---:|---|"]

    seen: dict[str, bool] = {}

    def add(est: str, mut: str, plant: str, crit: str, ok: float | None, bad: float | None, good) -> None:
        caught = ok is not None and bad is not None and good(ok) and not good(bad)
        seen[est] = seen.get(est, False) or caught
        out.append(f"| {est} | {mut} | {plant} | {crit} | {fmt_cell(ok)} | {fmt_cell(bad)} | "
                   f"{'yes' if caught else 'NO'} |")

    by = {}
    for r in rows:
        by.setdefault(r.get("module"), []).append(r)
    for shape in dict.fromkeys(r["shape"] for r in by.get("cliff_shapes", [])):
        get = {r["estimator"]: r for r in by["cliff_shapes"] if r["shape"] == shape and r["n_instances"] == 200}
        if get:
            add("reported α* (cliff table)", "the model-free check (sigmoid's interval alone)", f"{shape}, 200 inst.",
                "coverage ≥ 0.90", get["reported α*"]["coverage"], get["sigmoid α* (alone)"]["coverage"],
                lambda v: v >= 0.9)
    for r in by.get("excess", []):
        if r.get("mutant_rejection_rate") is not None:
            add("safe ratio (exact test)", "exactness (percentile bootstrap bound)",
                f"excess = δ, {r['n_instances']} inst., churn {r['churn']:g}", "false certification ≤ 0.05",
                r["rejection_rate"], r["mutant_rejection_rate"], lambda v: v <= 0.05)
    gl = {(r["estimator"], r["scenario"]): r for r in by.get("ger_link", [])}
    for scen in ("confounded null: hard instances", "confounded null: correlated"):
        if ("within_instance_slope", scen) in gl:
            add("eviction link (within instance)", "instance conditioning (between-instance fit)", scen,
                "'raises H' ≤ 0.05", gl["within_instance_slope", scen]["raises_h_rate"],
                gl["between_instance_slope (mutant)", scen]["raises_h_rate"], lambda v: v <= 0.05)
    for r in by.get("league", []):
        if r.get("safe_rule_reversal") is not None and r["truth"] != "tie":
            add("press league (paired)", "pairing (order by safe ratio, then α*)",
                f"{r['pair']}, {r['n_instances']} inst., churn {r['churn']:g}", "reversal ≤ 0.05",
                r["reversal"], r["safe_rule_reversal"], lambda v: v <= 0.05)
    for r in by.get("league", []):
        if r.get("mutant_rejection_rate") is not None:
            add("press league (sign-flip decision)", "exactness (percentile-bootstrap p)",
                f"symmetric null, {r['n_instances']} inst.", "decided ≤ 0.05", r["rejection_rate"],
                r["mutant_rejection_rate"], lambda v: v <= 0.05)
    for r in by.get("probe", []):
        add("identity probe (whole-procedure interval)", "the procedure inside the bootstrap (fixed credits)",
            f"readout of accuracy 0.65, {r['n_instances']} inst.", "no zero-width interval",
            r["share_zero_width"], r["mutant_share_zero_width"], lambda v: v == 0)
    out += ["", "A mutant is caught where the estimator meets the criterion and the mutant does not; `NO` marks a "
            "plant on which the two cannot be told apart (both meet it, or neither).", "",
            "Mutants caught on at least one plant: " + "; ".join(f"{e}: {'yes' if c else 'NO'}"
                                                                for e, c in seen.items()) + ".", ""]
    return out


if __name__ == "__main__":
    sys.exit(main())
