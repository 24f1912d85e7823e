"""Cells per second against batch size, and memory per cell: the context cache is shared, not copied.

One prompt (~512 context tokens), a fixed set of cells (press × ratio) decoded with different
`batch_size`s, each configuration in a fresh process. If the context K/V were copied per cell,
peak memory would grow by the context cache size per cell; the table shows it grows only by the
cells' own suffixes and attention rows.

Each row's forward FLOPs (benchmarks/flops.py) over its median time are set beside a float32 ``torch.mm`` peak
measured in the same run (`fraction of peak`).

    python benchmarks/cell_batching.py [--model smollm2-135m] [--tokens 512] [--cells 64]
"""

from __future__ import annotations

import argparse
import statistics
import sys

from common import MEMORY_PROBE, environment, matmul_peak, median_spread, peak_fraction, run_child, write
from flops import CellWork, Shape, grid_flops

CHILD = MEMORY_PROBE + r"""
import json, sys, time
import torch
from kvroute.models import load_model
from kvroute.engine import Engine, Cell, DecodeSettings
from kvroute.tasks import TaskSpec, generate_tasks, build_prompt
model_name, tokens, n_cells, batch, repeats = (sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]),
                                               int(sys.argv[5]))
lm = load_model(model_name, device="cpu", dtype="float32")
inst = generate_tasks(TaskSpec("base", n=1, seed=3, target_tokens=tokens), lm.tokenizer)[0]
prompt = build_prompt(lm.tokenizer, inst)
presses = ["snapkv", "expected_attention", "knorm", "tova"]
ratios = [0.1 + 0.8 * i / 15 for i in range(16)]
cells = [Cell(p, round(r, 4)) for p in presses for r in ratios][:n_cells]
eng = Engine(lm, DecodeSettings(max_new_tokens=16, batch_size=batch, capture=False))
eng.run(prompt, cells[:2]).raise_for_errors()
base = baseline()
times = []
for _ in range(repeats):
    t0 = time.perf_counter()
    res = eng.run(prompt, cells, decode_full=False).raise_for_errors()
    times.append(time.perf_counter() - t0)
L, Hkv, T, D = len(res.prefill.keys), res.prefill.keys[0].shape[1], res.prefill.num_tokens, res.prefill.keys[0].shape[3]
ctx_mb = 2 * L * Hkv * T * D * 4 / 2**20
print(json.dumps({"times": times, "peak_mb": status("VmHWM") - base, "T": T, "ctx_mb": ctx_mb,
                  "tokens": sum(len(o.tokens) for o in res.outputs), "Q": len(prompt.question_ids),
                  "work": [[c.ratio, len(o.tokens)] for c, o in zip(cells, res.outputs)]}))
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--cells", type=int, default=64)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 4, 16, 64])
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    from kvroute.models import load_model

    shape = Shape.of(load_model(args.model).model)
    peak = matmul_peak()
    rows = []
    for b in args.batches:
        r = run_child(CHILD, args.model, str(args.tokens), str(args.cells), str(b), str(args.repeats))
        rows.append((b, r))
        print(f"batch {b:>3}: {args.cells / statistics.median(r['times']):.2f} cells/s, peak +{r['peak_mb']:.0f} MB",
              flush=True)
    ctx_mb, T = rows[0][1]["ctx_mb"], rows[0][1]["T"]
    peak = max(peak, matmul_peak())
    lines = [
        "# Cell batching: throughput and memory against batch size",
        "",
        f"Command: `python benchmarks/cell_batching.py --model {args.model} --tokens {args.tokens} --cells "
        f"{args.cells} --batches {' '.join(map(str, args.batches))} --repeats {args.repeats}`",
        f"Environment: {environment()}",
        f"{args.cells} cells (4 presses × 16 ratios) on one `base` prompt of T={T} context tokens, max_new_tokens=16, "
        f"captures off. The context K/V cache of this prompt is {ctx_mb:.1f} MB: copying it per cell would add "
        f"{ctx_mb:.1f} MB per cell in a batch. Peak memory growth: the process's peak RSS over its resident size after "
        "a warm-up run, the heap's free pages handed back first (malloc_trim).",
        "",
        "| batch size | seconds for all cells (median, range) | cells/s | peak memory growth MB "
        "| per cell in the batch MB | fraction of peak |",
        "|---|---|---|---|---|---|",
    ]
    for b, r in rows:
        med = statistics.median(r["times"])
        flops = grid_flops(shape, r["T"], r["Q"], [CellWork(x, n) for x, n in r["work"]])[0]
        lines.append(f"| {b} | {median_spread(r['times'])} | {args.cells / med:.2f} | {r['peak_mb']:.0f} "
                     f"| {r['peak_mb'] / b:.2f} | {flops / med / peak:.2f} |")
        if b == rows[-1][0]:
            best = peak_fraction(flops, med, peak)
    lines += ["", f"batch {rows[-1][0]}: {best}"]
    lines += ["", f"context cache per copy: {ctx_mb:.1f} MB"]
    write("cell_batching", lines)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
