"""What the server costs: each press unconstrained against its paged and head-uniform variants, paired.

    python benchmarks/serving_cost.py                          # SmolLM2-135M, 48 base instances
    python benchmarks/serving_cost.py --model qwen2.5-0.5b     # the demo's model

A paged server (vLLM, SGLang) keeps or drops whole blocks of consecutive tokens, usually the same blocks
for every head of a layer; kvpress's presses and kvroute's keep masks evict per head and per token. For
each press the script sweeps the unconstrained press and four constrained variants (paged 16, paged 64,
head-uniform, paged 16 + head-uniform: ``kvroute.presses.constraints``) over the demo's ratios on the
same instances, reads the records back through ``kvroute.analysis.serving`` (paired differences
constrained − unconstrained: Δ safe range / Δα* by the press league's paired rule, ΔH at each ratio,
ΔGER, with instance-bootstrap intervals) and writes results/serving_cost[_MODEL].md with the finding
sentences the analysis writes. The sweep is resumable (``--run-dir``) and runs in
``--shards`` sweeps (task seeds seed, seed + 1, …) that may run side by side: ``--shard k``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from common import RESULTS, environment

PRESSES = ("expected_attention", "expected_attention+adakv", "snapkv[window_size=16]", "knorm")
VARIANTS = ("", "+paged[block=16]", "+paged[block=64]", "+uniform", "+paged[block=16]+uniform")
#: the demo's ratios (kvroute.demo.DEMO_RATIOS)
RATIOS = (0.0, 0.5, 0.7, 0.8, 0.85, 0.9, 0.95)


def presses() -> list[str]:
    return [p + v for p in PRESSES for v in VARIANTS]


def config(model: str, n: int, task_seed: int, dtype: str | None = None) -> dict:
    return {"name": "serving-cost", "models": [model if dtype is None else {"name": model, "dtype": dtype}],
            # padded to ~320 tokens: five 64-token pages, twenty 16-token ones
            "tasks": [{"family": "base", "difficulty": 1, "n": n, "seed": task_seed, "target_tokens": 320,
                       "distractors": 2, "unanswerable_share": 0.0}],
            "presses": presses(), "ratios": list(RATIOS), "regimes": ["agnostic"], "seeds": [0],
            # what the section reads: the answer (hallucination) and retention (GER); no attention capture
            "metrics": ["retention", "utilization"],
            "decoding": {"max_new_tokens": 16, "batch_size": 64, "answer_prefix": "Answer:"}}


def run(model: str, n: int, task_seed: int, run_dir: Path, dtype: str | None = None) -> tuple[float, str]:
    from kvroute.sweep import run_sweep, sweep_config_from_mapping

    cfg = sweep_config_from_mapping(config(model, n, task_seed, dtype), source="benchmarks/serving_cost.py")
    t0 = time.perf_counter()
    outcome = run_sweep(cfg, run_dir, resume=True)
    s = time.perf_counter() - t0
    text = f"sweep {s:.0f} s" + ("" if not outcome.already_done else
                                 f" ({outcome.computed} of {outcome.total_cells} cells computed now)")
    return s, text


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--n", type=int, default=48, help="base instances (default 48), over the shards")
    ap.add_argument("--seed", type=int, default=0, help="task seed of shard 0 (shard k: seed + k)")
    ap.add_argument("--shards", type=int, default=2, help="the instances in this many sweeps, each its own run dir "
                                                           "and task seed (run them side by side with --shard)")
    ap.add_argument("--shard", type=int, default=None, help="run (or resume) this shard's sweep only, write nothing")
    ap.add_argument("--no-sweep", action="store_true", help="read the shards' records as they are")
    ap.add_argument("--run-dir", type=Path, default=Path("/tmp/kvroute-serving-cost"))
    ap.add_argument("--n-boot", type=int, default=1000)
    ap.add_argument("--dtype", default=None, help="the model's dtype (default: float32 on CPU)")
    ap.add_argument("--no-write-results", action="store_true")
    args = ap.parse_args()
    env = environment()
    per_shard = -(-args.n // args.shards)
    dirs = [args.run_dir / args.model / f"shard{k}" for k in range(args.shards)]
    if args.shard is not None:
        run(args.model, per_shard, args.seed + args.shard, dirs[args.shard], args.dtype)
        return 0
    sweep_text = "records read back" if args.no_sweep else "; ".join(
        run(args.model, per_shard, args.seed + k, d, args.dtype)[1] for k, d in enumerate(dirs))
    import pandas as pd

    from kvroute.analysis.load import load_records
    from kvroute.analysis.serving import serving_cost
    from kvroute.report.serving import serving_markdown

    df = pd.concat([load_records(d) for d in dirs if (d / "store.sqlite").exists()], ignore_index=True)
    n_done = df["instance_id"].nunique()
    result = serving_cost(df, n_boot=args.n_boot, seed=args.seed)
    lines = ["# What the server costs: paged and head-uniform constraints", "",
             f"`python benchmarks/serving_cost.py --model {args.model} --n {args.n}` — {env}; {sweep_text}.", "",
             f"{n_done} `base` instances (of {args.n} planned, in {args.shards} shards with task seeds "
             f"{args.seed}..{args.seed + args.shards - 1}; contexts padded to ~320 tokens, 2 distractors), agnostic "
             f"regime, answer prefix `Answer:`, ratios {', '.join(str(r) for r in RATIOS)}. Presses: "
             + ", ".join(f"`{p}`" for p in PRESSES) + "; variants: unconstrained, "
             + ", ".join(f"`{v[1:]}`" for v in VARIANTS[1:]) + ". Each constrained variant keeps exactly the "
             "press's own budget per (layer, KV head) (the last kept page partial where the budget is not a whole "
             "number of pages). Differences are constrained − unconstrained on the same instances, 95% instance "
             "bootstrap intervals.", "", *serving_markdown(result)]
    text = "\n".join(lines) + "\n"
    print(text)
    if not args.no_write_results:
        name = "serving_cost.md" if args.model == "smollm2-135m" else f"serving_cost_{args.model}.md"
        (RESULTS / name).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
