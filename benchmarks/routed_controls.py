"""Mask-level control for routed reachability on a real model: oracle, random and anti_oracle at
matched ratios. A calibrated reachability must be high for oracle (evidence kept), low for
anti_oracle (evidence evicted first) and in between for random; the uncalibrated rule is printed
beside it for comparison.

    python benchmarks/routed_controls.py [--model smollm2-135m] [--family base] [--instances 24]
        [--ratio 0.9 --ratio 0.95] [--tasks FILE.jsonl]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from common import environment, write

PRESSES = ["oracle[base=knorm]", "random", "anti_oracle[base=knorm]"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--family", default="base")
    ap.add_argument("--tasks", default=None, help="a task file (JSONL) instead of generated --family instances")
    ap.add_argument("--instances", type=int, default=24)
    ap.add_argument("--ratio", type=float, action="append", default=None)
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args()
    ratios = args.ratio or [0.9, 0.95]
    from kvroute.engine import Cell, Engine
    from kvroute.models import load_model
    from kvroute.runner import RunSettings, run_instance
    from kvroute.tasks import TaskSpec, generate_tasks

    lm = load_model(args.model, dtype="float32")
    if args.tasks:
        from kvroute.tasks.io import load_tasks

        tasks = load_tasks(args.tasks)[: args.instances]
    else:
        tasks = generate_tasks(TaskSpec(args.family, n=args.instances, seed=args.seed), lm.tokenizer)
    settings = RunSettings(max_new_tokens=8, metrics=("retention", "accessibility", "routes", "utilization"))
    engine = Engine(lm, settings.decode_settings())
    cells = [Cell(p, r) for p in PRESSES for r in ratios]
    rows: dict[tuple[str, float], list[dict]] = {(c.press, c.ratio): [] for c in cells}
    t0 = time.perf_counter()
    for inst in tasks:
        if inst.unanswerable:
            continue
        for rec in run_instance(engine, inst, cells, settings=settings, seed=args.seed):
            rows[(rec["press"], rec["ratio"])].append(rec)
    secs = time.perf_counter() - t0

    def mean(xs: list) -> str:
        xs = [float(x) for x in xs if x is not None]
        return f"{statistics.fmean(xs):.2f}" if xs else "—"

    lines = [f"# Routed reachability controls ({args.model}, {args.tasks or args.family}, "
             f"{len(next(iter(rows.values())))} instances)", "", environment(), "",
             "| press | ratio | accuracy | GER | direct | routed (calibrated) | routed (uncalibrated) | "
             "median z | median p | undecided |", "|---|---|---|---|---|---|---|---|---|---|"]
    for (press, ratio), rs in rows.items():
        zs = [r["routed_z"] for r in rs if r.get("routed_z") is not None]
        ps = [r["routed_p"] for r in rs if r.get("routed_p") is not None]
        lines.append(f"| {press} | {ratio} | {mean([r['outcome'] == 'correct' for r in rs])} | {mean([r['ger'] for r in rs])} | "
                     f"{mean([r['reachable'] for r in rs])} | {mean([r['routed_reachable'] for r in rs])} | "
                     f"{mean([r['routed_reachable_uncalibrated'] for r in rs])} | "
                     f"{statistics.median(zs) if zs else float('nan'):.2f} | "
                     f"{statistics.median(ps) if ps else float('nan'):.3f} | "
                     f"{sum(r['routed_reachable'] is None for r in rs)} |")
    lines += ["", f"{secs:.0f} s for {len(tasks)} instances × {len(cells)} cells."]
    print("\n".join(lines))
    write(f"routed_controls_{Path(args.tasks).stem if args.tasks else args.family}", lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
