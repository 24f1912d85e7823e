"""What the routing metrics cost on top of the engine alone, for the same cells.

(a) engine alone: prefill + batched decode, no captures (answers only);
(b) the full cell record: captures (attention rows, hidden states, generated-token masses), the
    teacher-forced gold log-probability, the evidence rollout, and every metric computed;
(c) the same without the representation metric (its logit lens: every layer's hidden state through the
    unembedding, at the last prompt token and along each answer candidate), to show what the lens costs.
Repeats alternate a, b and c; the final line is `overhead: X%` (median b over median a, minus 1).

    python benchmarks/metrics_overhead.py [--model smollm2-135m] [--instances 4] [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from common import environment, median_spread, write

PRESSES = ["snapkv", "expected_attention+adakv", "streaming_llm"]
RATIOS = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--instances", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    from kvroute.engine import Cell, Engine
    from kvroute.models import load_model
    from kvroute.runner import RunSettings, run_instance
    from kvroute.tasks import TaskSpec, build_prompt, generate_tasks

    lm = load_model(args.model, dtype="float32")
    tasks = generate_tasks(TaskSpec("base", n=args.instances, seed=5, target_tokens=args.tokens), lm.tokenizer)
    settings = RunSettings(max_new_tokens=24)
    no_lens = RunSettings(max_new_tokens=24, metrics=tuple(m for m in settings.metrics if m != "representation"))
    assert "lens" in settings.needs and "lens" not in no_lens.needs
    bare = Engine(lm, settings.decode_settings().__class__(max_new_tokens=24, capture=False))
    full = Engine(lm, settings.decode_settings())
    cells = [Cell(p, r) for p in PRESSES for r in RATIOS]
    prompts = [build_prompt(lm.tokenizer, t) for t in tasks]
    bare.run(prompts[0], cells[:2]).raise_for_errors()
    run_instance(full, tasks[0], cells[:2], settings=settings)
    ta, tb, tc = [], [], []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        for p in prompts:
            bare.run(p, cells).raise_for_errors()
        ta.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        for t in tasks:
            run_instance(full, t, cells, settings=settings)
        tb.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        for t in tasks:
            run_instance(full, t, cells, settings=no_lens)
        tc.append(time.perf_counter() - t0)
    over = 100 * (statistics.median(tb) / statistics.median(ta) - 1)
    over_c = 100 * (statistics.median(tc) / statistics.median(ta) - 1)
    lines = [
        "# Metrics overhead: full cell records vs the engine alone",
        "",
        f"Command: `python benchmarks/metrics_overhead.py --model {args.model} --instances {args.instances} "
        f"--tokens {args.tokens} --repeats {args.repeats}`",
        f"Environment: {environment()}",
        f"{args.instances} `base` instances (~{args.tokens} context tokens), {len(cells)} cells each "
        f"({', '.join(PRESSES)} × 9 ratios), max_new_tokens=24.",
        "",
        "| path | seconds (median, range) |",
        "|---|---|",
        f"| engine alone (answers only) | {median_spread(ta)} |",
        f"| with captures, gold log-prob, rollout and all metrics | {median_spread(tb)} |",
        f"| the same without the representation metric (no logit lens) | {median_spread(tc)} |",
        "",
        f"Without the logit lens the overhead is {over_c:.0f}%: the lens is "
        f"{statistics.median(tb) - statistics.median(tc):.1f} s of the "
        f"{statistics.median(tb) - statistics.median(ta):.1f} s the metrics add.",
        "",
        f"overhead: {over:.0f}%",
    ]
    write("metrics_overhead", lines)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
