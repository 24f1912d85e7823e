"""Restoration maps on a real model: where the answer must be kept for a failing cell to repair (issue 48).

A sweep of `base` instances (~320 tokens, 2 distractors, none unanswerable) at α = 0.9 with two presses finds
the failures compression causes (the full cache answers correctly, the press's cell does not). For the first
``--failures`` of each press, a restoration map (kvroute.restore_map): the answer restored in one (layer, KV
head) slot at a time, the effect on the gold log-probability normalised so 0 = compressed and 1 = full cache,
and the greedy minimal repairing set. Then, per press: the averaged map with 95% instance-bootstrap intervals
per slot, the minimal sets' sizes (median, range), their agreement across instances (mean pairwise Jaccard
against a permutation null), the map's controls, and the cost: the map's cells per second against the sweep's
ordinary cells, and the time of one full map on each model of ``--cost-models``.

    python benchmarks/restore_map.py [--model qwen2.5-0.5b] [--n 40] [--failures 24] \\
        [--cost-models smollm2-135m,qwen2.5-0.5b]
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import pandas as pd
from common import environment, md_table, write

PRESSES = ("snapkv", "expected_attention")
RATIO = 0.9


def config(model: str, n: int, seed: int) -> dict:
    return {"name": "restore-map", "models": [model],
            "tasks": [{"family": "base", "difficulty": 1, "n": n, "seed": seed, "target_tokens": 320,
                       "distractors": 2, "unanswerable_share": 0.0}],
            "presses": list(PRESSES), "ratios": [0.0, RATIO], "regimes": ["agnostic"], "seeds": [seed],
            "metrics": ["utilization"], "decoding": {"max_new_tokens": 16, "answer_prefix": "Answer:"}}


def failures(df: pd.DataFrame, press: str) -> list[str]:
    """Instances whose full cache is correct and whose ``press`` cell at RATIO is not, in the store's order."""
    full = df[df["press"] == "none"].set_index("instance_id")["outcome"]
    cells = df[(df["press"] == press) & (df["ratio"] == RATIO)]
    return [i for i, o in zip(cells["instance_id"], cells["outcome"], strict=True)
            if o != "correct" and full.get(i) == "correct"]


def heat(avg: pd.DataFrame) -> list[str]:
    """The averaged map as a Markdown table: one row per layer, one column per KV head (mean [low, high])."""
    Hkv = int(avg["kv_head"].max()) + 1
    head = "| layer | " + " | ".join(f"kv{h}" for h in range(Hkv)) + " |"
    lines = [head, "|" + "---|" * (Hkv + 1)]
    for layer, g in avg.groupby("layer", sort=True):
        cells = [f"{r.effect:+.2f} [{r.low:+.2f}, {r.high:+.2f}]" + (" **" if r.low > 0 else "")
                 for r in g.sort_values("kv_head").itertuples()]
        lines.append(f"| {layer} | " + " | ".join(cells) + " |")
    return lines


def rate(df: pd.DataFrame) -> tuple[float, int, float]:
    """(cells per second, cells, seconds) of records: cells over the seconds of the engine calls that computed them
    (prefill + decode, recorded on each record of a call: one call per distinct (instance, press, timing))."""
    calls = df.drop_duplicates(["instance_id", "seconds_prefill", "seconds_decode"])
    seconds = float((calls["seconds_prefill"] + calls["seconds_decode"]).sum())
    return (len(df) / seconds if seconds > 0 else math.nan), len(df), seconds


def cost_lines(sweep: pd.DataFrame, store: Path) -> list[str]:
    """The map's cells per second against the sweep's ordinary cells, both from their stores' recorded timings."""
    from kvroute.sweep.store import iter_records

    maps = pd.DataFrame(list(iter_records(store)))
    o, m = rate(sweep), rate(maps)
    return [f"Ordinary cells (the sweep: the full cache and {len(PRESSES)} presses per instance): {o[0]:.3f} cells/s "
            f"({o[1]} cells in {o[2]:.0f} s of prefill + decode). Map cells (every cell in the map store: slots, "
            f"controls, minimal-set prefixes): {m[0]:.3f} cells/s ({m[1]} cells in {m[2]:.0f} s), "
            f"{m[0] / o[0]:.1f}× the ordinary rate — both as recorded when computed, at different times of a shared "
            "machine; the side-by-side timings below are the ones to compare.",
            "", "Map timings per engine call (one prefill + the batched decode of its cells):", "",
            *md_table([{"instance": r.instance_id, "press": r.press, "cells": int(n),
                        "seconds": round(float(r.seconds_prefill + r.seconds_decode), 1)}
                       for r, n in _calls(maps)], [(c, c) for c in ("instance", "press", "cells", "seconds")],
                      digits=1)]


def _calls(df: pd.DataFrame) -> list[tuple[object, int]]:
    """(first record, cells) per engine call, in the store's order."""
    key = ["instance_id", "seconds_prefill", "seconds_decode"]
    return [(next((g[g["press"] != "none"] if (g["press"] != "none").any() else g).itertuples()), len(g))
            for _, g in df.groupby(key, sort=False)]


def one_map_seconds(model: str, seed: int) -> tuple[float, int, str, float, int] | None:
    """Seconds of one full map (no store, minimal set included) on ``model``: its first snapkv failure among 12
    base instances; None when none of them fails. Then, side by side on the same instance and engine, the
    seconds of one ordinary engine call of as many cells (both presses over a ratio grid, no restore):
    (map seconds, map cells, instance id, ordinary seconds, ordinary cells)."""
    from kvroute.engine import Cell, Engine
    from kvroute.models import load_model
    from kvroute.restore_map import restore_map
    from kvroute.runner import run_instance
    from kvroute.settings import RunSettings
    from kvroute.tasks import TaskSpec, generate_tasks

    lm = load_model(model)
    s = RunSettings(max_new_tokens=16, answer_prefix="Answer:", metrics=("utilization",))
    engine = Engine(lm, s.decode_settings())
    spec = TaskSpec("base", n=12, seed=seed, target_tokens=320, distractors=2, unanswerable_share=0.0)
    for inst in generate_tasks(spec, lm.tokenizer):
        full, comp = run_instance(engine, inst, [Cell("none", 0.0), Cell(PRESSES[0], RATIO)], settings=s)
        if full["outcome"] == "correct" and comp["outcome"] != "correct":
            t0 = time.perf_counter()
            m = restore_map(engine, inst, PRESSES[0], RATIO, settings=s)
            t_map = time.perf_counter() - t0
            grid = [round(0.05 + 0.9 * i / max(m.computed // len(PRESSES) - 1, 1), 4)
                    for i in range(max(m.computed // len(PRESSES), 1))]
            cells = [Cell(p, r) for p in PRESSES for r in grid]
            t0 = time.perf_counter()
            run_instance(engine, inst, cells, settings=s)
            return t_map, m.computed, inst.id, time.perf_counter() - t0, len(cells) + 1  # + the full cache
    return None


def main() -> int:  # noqa: C901  (one study, read top to bottom)
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen2.5-0.5b")
    ap.add_argument("--n", type=int, default=40, help="base instances swept to find failures (default 40)")
    ap.add_argument("--failures", type=int, default=24, help="maps per press (default 24)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--n-boot", type=int, default=1000)
    ap.add_argument("--cost-models", default="", help="comma-separated models to time one full map on")
    ap.add_argument("--run-dir", type=Path, default=Path("/tmp/kvroute-restore-map"))
    args = ap.parse_args()
    from kvroute.analysis.load import load_records
    from kvroute.analysis.restore_map import averaged_map, minimal_sizes, p_text, restore_map_finding, set_agreement
    from kvroute.restore_map import MAP_DIR, restore_map_of_run, run_cell
    from kvroute.sweep import run_sweep, sweep_config_from_mapping
    from kvroute.sweep.local import load_engine

    env = environment()
    run = args.run_dir / args.model
    cfg = sweep_config_from_mapping(config(args.model, args.n, args.seed), source="benchmarks/restore_map.py")
    t0 = time.perf_counter()
    run_sweep(cfg, run, resume=True)
    sweep_s = time.perf_counter() - t0
    df = load_records(run)
    n_right = int((df[df["press"] == "none"]["outcome"] == "correct").sum())
    command = (f"python benchmarks/restore_map.py --model {args.model} --n {args.n} --failures {args.failures}"
               + (f" --cost-models {args.cost_models}" if args.cost_models else ""))
    lines = ["# Restoration maps: where the answer must be kept for a failure to repair", "",
             f"`{command}` — {env}; sweep {sweep_s:.0f} s.", "",
             f"{args.n} `base` instances (~320 tokens, 2 distractors), presses {', '.join(PRESSES)} at "
             f"α = {RATIO:g}; the full cache answers {n_right} of {args.n} correctly. Per press, a map for each of "
             f"the first {args.failures} failures (full cache correct, the press's cell not): the answer restored in "
             "one (layer, KV head) slot at a time (effect on the gold log-probability, 0 = compressed, 1 = full "
             "cache), and the greedy minimal repairing set.", ""]
    findings: list[str] = []
    engine = None
    for press in PRESSES:
        fails = failures(df, press)
        chosen = fails[: args.failures]
        maps = []
        for i, iid in enumerate(chosen):
            rc = run_cell(run, iid, f"{press}@{RATIO:g}")
            engine = engine or load_engine(rc.model, rc.settings)
            m = restore_map_of_run(rc, engine=engine)
            maps.append(m)
            print(f"{press} {i + 1}/{len(chosen)} {iid}: {m.computed} cells in {m.seconds:.0f} s, minimal "
                  f"{None if m.minimal is None else len(m.minimal)}", file=sys.stderr, flush=True)
        lines += [f"## {press} at α = {RATIO:g}: {len(fails)} failures, {len(maps)} mapped", ""]
        if not maps:
            lines += ["No failures to map.", ""]
            continue
        L, Hkv = maps[0].effect.shape
        avg = averaged_map(maps, n_boot=args.n_boot, seed=args.seed)
        sizes = minimal_sizes(maps)
        sets = [m.minimal for m in maps if m.failure and m.minimal]
        agree = set_agreement(sets, L * Hkv, seed=args.seed)
        finding = restore_map_finding(press, RATIO, avg, sizes, agree)
        findings.append(finding)
        checks = pd.DataFrame([m.checks for m in maps])
        top = avg.sort_values("effect", ascending=False).head(8)
        lines += [f"**Finding.** {finding}", "",
                  f"Controls over the {len(maps)} maps (each must hold in every map): "
                  + ", ".join(f"{c} {int(checks[c].sum())}/{int(checks[c].notna().sum())}" for c in checks.columns),
                  "", "Averaged map: mean effect [95% instance-bootstrap interval]; ** the interval is above 0.", "",
                  *heat(avg), "", "The 8 slots of largest mean effect:", "",
                  *md_table(top.to_dict("records"), [(c, c) for c in ("layer", "kv_head", "effect", "low", "high",
                                                                      "repair_share", "n")], digits=3), "",
                  "Minimal repairing sets (greedy by effect, verified by the repairing cell):", "",
                  *md_table([{"instance": m.instance_id, "compressed": m.compressed.get("outcome"),
                              "every slot": m.every_slot.get("outcome"),
                              "size": None if m.minimal is None else len(m.minimal),
                              "slots": "—" if m.minimal is None else " ".join(f"{a}.{b}" for a, b in m.minimal)}
                             for m in maps], [(c, c) for c in ("instance", "compressed", "every slot", "size",
                                                               "slots")]), "",
                  f"Agreement: {agree['sets']} sets, mean pairwise Jaccard {agree['jaccard']:.3f}, permutation null "
                  f"{agree['null']:.3f} (95th percentile {agree['null_q95']:.3f}), {p_text(agree['p'])}.", ""]
    lines += ["## Cost", "", *cost_lines(df, run / MAP_DIR), "",
              "One full map per model, timed in this run beside an ordinary engine call on the same instance:", ""]
    for model in [m for m in args.cost_models.split(",") if m]:
        got = one_map_seconds(model, args.seed)
        lines.append(f"- {model}: " + (f"one full map (instance {got[2]}, {PRESSES[0]}@{RATIO:g}, {got[1]} cells with "
                                       f"the minimal set) in {got[0]:.0f} s ({got[1] / got[0]:.2f} cells/s); "
                                       f"side by side, one ordinary call of {got[4]} cells on the same instance "
                                       f"(both presses over a ratio grid) in {got[3]:.0f} s ({got[4] / got[3]:.2f} "
                                       f"cells/s): map cells at {got[1] / got[0] / (got[4] / got[3]):.2f}× the "
                                       "ordinary rate" if got else
                                       "no snapkv failure among 12 base instances to time"))
    lines.append("")
    print("\n".join(lines))
    write("restore_map" if args.model == "qwen2.5-0.5b" else f"restore_map_{args.model}", lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
