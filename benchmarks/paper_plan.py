"""The paper-scale study on GPUs: its config, and a projection of its time and memory (not a measurement).

The design of the paper reproduced with kvroute (``benchmarks/configs/paper_scale.toml``): Llama-3.2-3B,
Llama-3-8B, Qwen2.5-3B/7B/14B; the seven task families; ratios 0.1 … 0.9; both regimes; the paper's two
presses. This script projects what it costs:

- **time** per instance from forward FLOPs (benchmarks/flops.py: one prefill of the context, then each cell's
  question and answer tokens over its kept entries) divided by the effective FLOP rate kvroute reached on the
  measured H200 run of a Llama-3-8B-shaped model (benchmarks/results/gpu_check.json: 27 cells over 8,403
  context tokens); on a 48 GB GPU of the L40S class the H200 time is multiplied by the ratio of their peak bf16
  compute (989 / 362 TFLOP/s: 2.7×) to that of their memory bandwidth (4.8 / 0.864 TB/s: 5.6×), as a range,
  since prefill is compute-bound and decode steps bandwidth-bound;
- **memory** from kvroute's own planner (kvroute.engine.plan, checked against measured H200 peaks within 13%
  from 8k tokens up): the weights, the instance's least need, and how many cells one batch takes on 48 GB;
- **a Ray cluster**: work units (one instance, all its cells) are independent, so G GPUs divide the time by G
  (an assumption: scheduling and model loading are not counted; not measured beyond one process here).

    python benchmarks/paper_plan.py [--instances-per-family 100] [--tokens 1024 4096] [--gpus 8]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

from common import write
from flops import CellWork, Shape, grid_flops

HERE = Path(__file__).parent
FAMILIES = 7
RATIOS = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9]
PRESSES = 2  # expected_attention+chunk, expected_attention+adakv
RESTORES = 3  # each compressed cell also restored: answer, evidence, random
REGIMES = 2
QUESTION = 45  # question-part tokens (chat template, question, answer prefix), as in the measured prompts
ANSWER = 16  # generated tokens per cell
H200 = {"tflops": 989.0, "tbps": 4.8}
GPU48 = {"tflops": 362.0, "tbps": 0.864, "gib": 48.0}


@dataclass(frozen=True)
class Model:
    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    head_dim: int = 128

    @property
    def layer_params(self) -> int:
        attn = self.hidden * self.heads * self.head_dim * 2 + self.hidden * self.kv_heads * self.head_dim * 2
        return self.layers * (attn + 3 * self.hidden * self.intermediate)

    @property
    def weight_bytes(self) -> int:  # bf16, embeddings and unembedding untied
        return 2 * (self.layer_params + 2 * self.vocab * self.hidden)

    def flops_shape(self) -> Shape:
        return Shape(self.layer_params, self.layers, self.heads, self.head_dim, self.hidden, self.vocab)

    def memory_shape(self):  # noqa: ANN201 - kvroute.engine.plan.MemoryShape
        from kvroute.engine.plan import MemoryShape

        return MemoryShape(self.layers, self.heads, self.kv_heads, self.head_dim, self.hidden, self.intermediate,
                           self.vocab, 2)


MODELS = [  # the models' published configs
    Model("Llama-3.2-3B", 28, 3072, 24, 8, 8192, 128256),
    Model("Llama-3-8B", 32, 4096, 32, 8, 14336, 128256),
    Model("Qwen2.5-3B", 36, 2048, 16, 2, 11008, 151936),
    Model("Qwen2.5-7B", 28, 3584, 28, 4, 18944, 152064),
    Model("Qwen2.5-14B", 48, 5120, 40, 8, 13824, 152064),
]


def effective_rate(measured: dict) -> tuple[float, str]:
    """FLOP/s that kvroute reached on the measured H200 grid (as flops.py counts its work)."""
    llama8b = MODELS[1].flops_shape()
    T, seconds = measured["T"], statistics.median(measured["kvroute_s"])
    cells = [CellWork(r, 24) for _ in range(3) for r in RATIOS]
    ours, _ = grid_flops(llama8b, T, QUESTION, cells)
    return ours / seconds, f"{measured['model']}, {T} tokens, 27 cells in {seconds:.2f} s"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--instances-per-family", type=int, default=100)
    ap.add_argument("--tokens", type=int, nargs="+", default=[1024, 4096])
    ap.add_argument("--gpus", type=int, default=8, help="GPUs of the Ray cluster")
    args = ap.parse_args()
    from kvroute.engine.plan import HEADROOM, MAX_BATCH, instance_bytes, plan_batch

    runs = json.loads((HERE / "results" / "gpu_check.json").read_text())["speed"]
    measured = next(r for r in runs if r["model"].startswith("Llama-3-8B"))
    rate, source = effective_rate(measured)
    cells = 1 + PRESSES * len(RATIOS) * (1 + RESTORES)
    instances = FAMILIES * args.instances_per_family * REGIMES
    lo_f, hi_f = H200["tflops"] / GPU48["tflops"], H200["tbps"] / GPU48["tbps"]
    lines = [
        "# Paper-scale plan: projected time and memory (a projection, not a measurement)",
        "",
        f"Command: `python benchmarks/paper_plan.py --instances-per-family {args.instances_per_family} --tokens "
        f"{' '.join(map(str, args.tokens))} --gpus {args.gpus}`; config `benchmarks/configs/paper_scale.toml`.",
        f"Design: {FAMILIES} families × {args.instances_per_family} instances × {REGIMES} regimes = {instances} "
        f"work units per model and context length, each one prefill and {cells} cells (the full cache, {PRESSES} "
        f"presses × {len(RATIOS)} ratios, each also restored {RESTORES} ways), {ANSWER} new tokens, a "
        f"{QUESTION}-token question part.",
        f"Time: forward FLOPs (benchmarks/flops.py) at the effective rate kvroute reached on an H200 "
        f"({rate / 1e12:.0f} TFLOP/s, from benchmarks/results/gpu_check.json: {source}); a 48 GB L40S-class GPU "
        f"takes {lo_f:.1f}–{hi_f:.1f}× as long (peak compute and memory-bandwidth ratios). Memory: kvroute's "
        f"planner (bf16 weights; {HEADROOM:.0%} left unplanned); 'cells per batch' is what one batch takes on 48 GB "
        f"(at most {MAX_BATCH}).",
        "",
        "| model | context tokens | weights GiB | least need beside weights GiB | cells per batch (48 GB) "
        "| s per unit, H200 | s per unit, 48 GB | study h, one H200 | study h, one 48 GB | study h, "
        f"{args.gpus}× 48 GB (Ray) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    total_h200 = total_48 = 0.0
    for m in MODELS:
        for T in args.tokens:
            work = [CellWork(0.0, ANSWER)] + [CellWork(r, ANSWER) for _ in range(PRESSES * (1 + RESTORES))
                                              for r in RATIOS]
            ours, _ = grid_flops(m.flops_shape(), T, QUESTION, work)
            s_h200 = ours / rate
            shape = m.memory_shape()
            need = instance_bytes(shape, T=T, q=QUESTION, new=ANSWER, cells=cells, capture=True, tracks=1)
            free = GPU48["gib"] * 2**30 - m.weight_bytes - shape.context_bytes(T)
            try:
                batch = str(plan_batch(shape, T=T, q=QUESTION, new=ANSWER, cells=cells, available=int(free),
                                       attention=int(free * 0.25), capture=True, tracks=1).batch)
            except Exception as e:  # the planner refuses: say so
                batch = f"does not fit ({type(e).__name__})"
            study_h200 = s_h200 * instances / 3600
            total_h200 += study_h200
            total_48 += study_h200 * hi_f
            lines.append(f"| {m.name} | {T} | {m.weight_bytes / 2**30:.1f} | {need / 2**30:.2f} | {batch} "
                         f"| {s_h200:.2f} | {s_h200 * lo_f:.2f}–{s_h200 * hi_f:.2f} | {study_h200:.2f} "
                         f"| {study_h200 * lo_f:.2f}–{study_h200 * hi_f:.2f} "
                         f"| {study_h200 * lo_f / args.gpus:.2f}–{study_h200 * hi_f / args.gpus:.2f} |")
    lines += ["", f"Whole study (every model and length above): {total_h200:.1f} h on one H200; up to "
              f"{total_48:.1f} h on one 48 GB GPU, {total_48 / args.gpus:.1f} h on {args.gpus} (Ray, linear scaling "
              "assumed). These are lower bounds: time is taken proportional to FLOPs, and a decode step's fixed "
              "latency (kernel launches, Python per layer), which dominates short contexts and small batches, is "
              "not counted; nor are model loading, task generation and the report. Every figure here is a "
              "projection from one measured H200 run and the FLOP and memory counts; run benchmarks/gpu_check.py "
              "on the target GPU to replace the rate with a measurement."]
    write("paper_plan", lines)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
