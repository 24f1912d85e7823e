"""Prefill with kvroute's score capture vs a plain transformers prefill, from 512 to 8,192 tokens.

Each (length, configuration) runs in a fresh process: load the model, warm up, reset the peak-RSS
counter (/proc/self/clear_refs; the heap's free pages handed back first, malloc_trim), then time `repeats`
prefills and read the peak RSS (VmHWM). The plain side is what kvpress's pipeline runs before compressing
(`model.model(ids, cache)`, sdpa); kvroute's side is `kvroute.engine.prefill` with the listed scorers captured
in the same pass. The longest plain and capture prefills' forward FLOPs (benchmarks/flops.py) over their median time
are set beside a float32 ``torch.mm`` peak measured in the same run (`fraction of peak`).

    python benchmarks/context_scaling.py [--model smollm2-135m] [--lengths 512 1024 2048 4096 8192]
"""

from __future__ import annotations

import argparse
import statistics
import sys

from common import MEMORY_PROBE, environment, matmul_peak, median_spread, peak_fraction, run_child, write
from flops import Shape, prefill_flops

LINEAR = ["expected_attention", "snapkv", "knorm", "tova", "streaming_llm", "keydiff"]
CONFIGS = {
    "plain": [],
    "capture": LINEAR,
    "capture+routes": LINEAR + ["@routes"],
    "observed_attention": ["observed_attention"],
}

CHILD = MEMORY_PROBE + r"""
import json, sys, time
import torch
from transformers import DynamicCache
from kvroute.models import load_model
from kvroute.engine.prefill import prefill, ScoreRequest
from kvroute.presses import build_press
from kvroute.metrics.accessibility import EvidenceRollout

model_name, n, repeats = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
scorers = [s for s in sys.argv[4].split(",") if s]
lm = load_model(model_name, device="cpu", dtype="float32")
g = torch.Generator().manual_seed(0)
def ids(k):
    return torch.randint(100, lm.tokenizer.vocab_size - 100, (k,), generator=g).tolist()

def requests():
    out = []
    for s in scorers:
        if s.startswith("@"):
            continue
        p = build_press(s); p.scorer.setup(lm.model)
        out.append(ScoreRequest.for_press(p, 0.5))
    return out

def once(x):
    if not scorers:
        with torch.inference_mode():
            lm.model.model(input_ids=torch.tensor([x]), past_key_values=DynamicCache(config=lm.model.config),
                           use_cache=True)
        return
    caps = [EvidenceRollout(list(range(10, 30)), len(x))] if "@routes" in scorers else []
    prefill(lm.model, x, requests(), captures=caps)

once(ids(128))  # longer than SnapKV's 64-token window
base = baseline()
x = ids(n)
times = []
for _ in range(repeats):
    t0 = time.perf_counter(); once(x); times.append(time.perf_counter() - t0)
print(json.dumps({"times": times, "peak_mb": status("VmHWM") - base}))
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--lengths", type=int, nargs="+", default=[512, 1024, 2048, 4096, 8192])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--observed-max", type=int, default=4096, help="longest context for the N×N scorer")
    args = ap.parse_args()
    from kvroute.models import load_model

    shape = Shape.of(load_model(args.model).model)  # pull once, outside the timed children
    peak = matmul_peak()
    res: dict[tuple[str, int], dict] = {}
    for n in args.lengths:
        reps = args.repeats if n <= 2048 else max(2, args.repeats - 1)
        for name, scorers in CONFIGS.items():
            if name == "observed_attention" and n > args.observed_max:
                continue
            res[(name, n)] = run_child(CHILD, args.model, str(n), str(reps), ",".join(scorers))
            r = res[(name, n)]
            print(f"{n:>5} {name:<18} {statistics.median(r['times']):7.2f} s  peak +{r['peak_mb']:.0f} MB", flush=True)
    lines = [
        "# Context scaling: prefill with capture vs a plain prefill",
        "",
        f"Command: `python benchmarks/context_scaling.py --model {args.model} --lengths "
        f"{' '.join(map(str, args.lengths))} --repeats {args.repeats}`",
        f"Environment: {environment()}",
        f"`capture` = one prefill that also scores {', '.join(LINEAR)} (every linear-memory scorer at once); "
        "`capture+routes` adds the evidence rollout used by routed reachability; `observed_attention` needs the "
        "N×N map. Peak = growth of the process's peak RSS over its resident size after loading the model and a warm-up "
        "(the heap's free pages handed back first, malloc_trim).",
        "",
        "| tokens | plain s | capture s | overhead | capture+routes s | overhead | plain peak MB | capture peak MB "
        "| +routes peak MB | observed_attention s / peak MB |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for n in args.lengths:
        p, c, cr = res[("plain", n)], res[("capture", n)], res[("capture+routes", n)]
        mp, mc, mr = (statistics.median(x["times"]) for x in (p, c, cr))
        obs = res.get(("observed_attention", n))
        obs_s = f"{statistics.median(obs['times']):.2f} / {obs['peak_mb']:.0f}" if obs else "—"
        lines.append(f"| {n} | {median_spread(p['times'])} | {median_spread(c['times'])} | {100 * (mc / mp - 1):+.0f}% "
                     f"| {median_spread(cr['times'])} | {100 * (mr / mp - 1):+.0f}% | {p['peak_mb']:.0f} "
                     f"| {c['peak_mb']:.0f} | {cr['peak_mb']:.0f} | {obs_s} |")
    big = args.lengths[-1]
    over = 100 * (statistics.median(res[("capture", big)]["times"])
                  / statistics.median(res[("plain", big)]["times"]) - 1)
    per_len = {n: 100 * (statistics.median(res[("capture", n)]["times"])
                         / statistics.median(res[("plain", n)]["times"]) - 1) for n in args.lengths}
    met = [n for n, o in per_len.items() if o < 15]
    lines += ["", "Goal: capture overhead under 15%. " + (
        f"Met at {', '.join(map(str, met))} tokens; " if met else "Not met at any length; ") + (
        "missed at " + ", ".join(f"{n} ({o:+.0f}%, by {o - 15:.0f} points)" for n, o in per_len.items() if o >= 15)
        + " — see profile_capture for where it goes." if len(met) < len(per_len) else "met at every length.")]
    peak = max(peak, matmul_peak())
    lines += ["", f"plain prefill at {big} tokens: "
              + peak_fraction(prefill_flops(shape, big), statistics.median(res[("plain", big)]["times"]), peak),
              f"capture prefill at {big} tokens: "
              + peak_fraction(prefill_flops(shape, big), statistics.median(res[("capture", big)]["times"]), peak)]
    lines += ["", f"capture overhead at {big} tokens: {over:+.0f}%"]
    write("context_scaling", lines)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
