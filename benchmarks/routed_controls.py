"""Mask-level control for routed reachability on a real model: the full cache, then oracle, random
and anti_oracle at matched ratios, and a placebo. A calibrated reachability must be high for oracle
(evidence kept), low for anti_oracle (evidence evicted first) and in between for random; at the full
cache it must read reachable where the model answers. The placebo rows move each instance's
evidence spans, by one shift, to another stretch of its document (clear of the evidence and every
answer mention) and drop its answer spans (the evidence positions hold the answer tokens too), then
read the full cache and random again: nothing singles that stretch out, so the share called
reachable there is the test's false-positive rate on real attention (nominal 0.05). Each instance gets
``--placebos`` such stretches, each with its own seed (so its own random mask and null draw); the
rate's interval is an instance bootstrap (the cells of one instance are not independent). Their accuracy
is the real answer's (the text is unchanged); their GER is undefined (no answer span).
The pooled test (``routed_reachable_pooled``) and the uncalibrated rule are printed beside it.

    python benchmarks/routed_controls.py [--model smollm2-135m] [--family base] [--instances 24]
        [--target-tokens 320] [--placebos 3] [--ratio 0.9 --ratio 0.95] [--tasks FILE.jsonl]

A ``base`` passage of three sentences (~35 tokens) has no room for the 19 disjoint copies of its
evidence the test needs, so generated instances are padded to ``--target-tokens`` (0: unpadded, and
every cell reads undecided).
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import random
import statistics
import sys
import time
from pathlib import Path

from common import environment, write

PRESSES = ["oracle[base=knorm]", "random", "anti_oracle[base=knorm]"]


def placebo(inst, rng: random.Random):
    """``inst`` with its evidence spans moved, by one shift, to another stretch of its context that overlaps
    neither the evidence nor any answer mention, and no answer spans (None when the context has no room).
    A prompt's evidence positions are the tokens of the evidence *and* answer spans, so a placebo that kept
    the answer spans would still hold the real answer tokens (and win the test for that reason)."""
    spans = [tuple(s) for s in inst.evidence_spans]
    if not spans:
        return None
    banned = [*spans, *(tuple(s) for s in inst.answer_spans)]
    lo, hi = min(a for a, _ in spans), max(b for _, b in spans)
    shifts = [d for d in range(-lo, len(inst.context) - hi + 1, 7)
              if all(b + d <= x or a + d >= y for a, b in spans for x, y in banned)]
    if not shifts:
        return None
    d = rng.choice(shifts)
    return dataclasses.replace(inst, evidence_spans=tuple((a + d, b + d) for a, b in spans), answer_spans=())


def cluster_interval(groups: list[list[bool]], *, seed: int, n_boot: int = 2000) -> tuple[float, float]:
    """95% percentile interval of the pooled share of True, resampling whole groups (instances)."""
    rng = random.Random(seed)
    shares = []
    for _ in range(n_boot):
        draw = [rng.choice(groups) for _ in groups]
        n = sum(len(g) for g in draw)
        shares.append(sum(sum(g) for g in draw) / n if n else 0.0)
    shares.sort()
    return shares[int(0.025 * n_boot)], shares[int(0.975 * n_boot) - 1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--family", default="base")
    ap.add_argument("--tasks", default=None, help="a task file (JSONL) instead of generated --family instances")
    ap.add_argument("--instances", type=int, default=24)
    ap.add_argument("--ratio", type=float, action="append", default=None)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--target-tokens", type=int, default=320, help="pad generated contexts to ~this many tokens")
    ap.add_argument("--placebos", type=int, default=3, help="placebo stretches per instance (each its own seed)")
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
        spec = TaskSpec(args.family, n=args.instances, seed=args.seed, target_tokens=args.target_tokens or None)
        tasks = generate_tasks(spec, lm.tokenizer)
    settings = RunSettings(max_new_tokens=8, metrics=("retention", "accessibility", "routes", "utilization"))
    engine = Engine(lm, settings.decode_settings())
    cells = [Cell("none", 0.0)] + [Cell(p, r) for p in PRESSES for r in ratios]
    placebo_cells = [Cell("none", 0.0)] + [Cell("random", r) for r in ratios]
    rows: dict[tuple[str, float], list[dict]] = {(c.press, c.ratio): [] for c in cells}
    rows.update({("placebo: " + c.press, c.ratio): [] for c in placebo_cells})
    rng = random.Random(args.seed)
    t0 = time.perf_counter()
    n_placebo = 0
    for inst in tasks:
        if inst.unanswerable:
            continue
        for rec in run_instance(engine, inst, cells, settings=settings, seed=args.seed):
            rows[(rec["press"], rec["ratio"])].append(rec)
        drew = False
        for k in range(args.placebos):
            fake = placebo(inst, rng)
            if fake is None:
                break
            drew = True
            for rec in run_instance(engine, fake, placebo_cells, settings=settings, seed=args.seed + 1 + k):
                rows[("placebo: " + rec["press"], rec["ratio"])].append({**rec, "source_id": inst.id})
        n_placebo += drew
    secs = time.perf_counter() - t0

    def mean(xs: list) -> str:
        xs = [float(x) for x in xs if x is not None]
        return f"{statistics.fmean(xs):.2f}" if xs else "—"

    cmd = " ".join(["python benchmarks/routed_controls.py", *sys.argv[1:]])
    lines = [f"# Routed reachability controls ({args.model}, {args.tasks or args.family}, "
             f"{len(rows[('none', 0.0)])} instances)", "", f"`{cmd}` — {environment()}", "",
             "`routed` is the layer-max test (`routed_reachable`), `pooled` the former pooled test, "
             "`uncalibrated` the first rule; `routed | correct` the layer-max share among the cells answered "
             "correctly; `layer (kind)` the most frequent winning column. Placebo rows: the evidence spans "
             "moved to another stretch of the document, so their `routed` share is the false-positive rate.", "",
             "| press | ratio | cells | accuracy | GER | direct | routed | routed \\| correct | pooled "
             "| uncalibrated | median z | median p | layer (kind) | undecided |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for (press, ratio), rs in rows.items():
        zs = [r["routed_z"] for r in rs if r.get("routed_z") is not None]
        ps = [r["routed_p"] for r in rs if r.get("routed_p") is not None]
        won = collections.Counter(f"{r['routed_layer']} ({r['routed_kind']})" for r in rs if r.get("routed_layer"))
        ok = [r for r in rs if r["outcome"] == "correct"]
        lines.append(f"| {press} | {ratio} | {len(rs)} | {mean([r['outcome'] == 'correct' for r in rs])} | "
                     f"{mean([r['ger'] for r in rs])} | {mean([r['reachable'] for r in rs])} | "
                     f"{mean([r['routed_reachable'] for r in rs])} | {mean([r['routed_reachable'] for r in ok])} | "
                     f"{mean([r['routed_reachable_pooled'] for r in rs])} | "
                     f"{mean([r['routed_reachable_uncalibrated'] for r in rs])} | "
                     f"{statistics.median(zs) if zs else float('nan'):.2f} | "
                     f"{statistics.median(ps) if ps else float('nan'):.3f} | "
                     f"{won.most_common(1)[0][0] if won else '—'} | "
                     f"{sum(r['routed_reachable'] is None for r in rs)} |")
    by_inst: dict[str, list[bool]] = collections.defaultdict(list)
    for k, rs in rows.items():
        if k[0].startswith("placebo"):
            for r in rs:
                if r["routed_reachable"] is not None:
                    by_inst[r["source_id"]].append(bool(r["routed_reachable"]))
    fp = [x for xs in by_inst.values() for x in xs]
    if fp:
        rate = sum(fp) / len(fp)
        lo, hi = cluster_interval(list(by_inst.values()), seed=args.seed)
        lines += ["", f"False-positive rate on real attention (placebo rows, {len(fp)} cells of {n_placebo} instances, "
                  f"{args.placebos} stretches each): {sum(fp)}/{len(fp)} = {rate:.3f}, 95% instance-bootstrap interval "
                  f"[{lo:.3f}, {hi:.3f}], against the nominal 0.05."]
    lines += ["", f"{secs:.0f} s for {len(tasks)} instances × {len(cells)} cells "
                  f"(+ {len(placebo_cells)} placebo cells)."]
    print("\n".join(lines))
    write(f"routed_controls_{Path(args.tasks).stem if args.tasks else args.family}", lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
