"""The longest context that fits a 64-cell decode: SmolLM2-135M in 24 GB here, an 8B model on 48 and 141 GB GPUs.

From kvroute's memory planner (kvroute.engine.plan: the prefill's peak, the context K/V, each cell's share
of a decoding batch and what each decoded cell keeps), whose counts were checked against measured peaks on an
H200 (benchmarks/results/gpu_check*.md: from 8k context tokens up within 4% below and 13% above, captures on
and off, SmolLM2's and Llama-3-8B's shapes). A projection from that formula, not a measurement at these
lengths: the largest T (to the nearest 256 tokens) at which the weights, the prefill and a 64-cell decode
(one batch, a 50-token question, 24 new tokens) fit the memory with 10% left unplanned, captures off
(answers only) and on (every routing metric).

    python benchmarks/capacity.py
"""

from __future__ import annotations

import sys

from common import write
from paper_plan import MODELS

from kvroute.engine.plan import HEADROOM, MemoryShape, instance_bytes, plan_batch

GiB = 2**30
LLAMA_8B = next(m for m in MODELS if m.name == "Llama-3-8B")  # its published shape, as paper_plan.py counts it
CASES = [  # (label, shape, weight bytes, memory bytes)
    ("SmolLM2-135M, float32, this machine's 24 GiB RAM",
     # (with the kept-entries kernel's index per cell, as on this machine's CPU: kvroute.engine.attention.kept)
     MemoryShape(30, 9, 3, 64, 576, 1536, 49152, 4, kept_index=True), 135e6 * 4, 24 * GiB),
    ("Llama-3-8B, bfloat16, a 48 GB GPU", LLAMA_8B.memory_shape(), LLAMA_8B.weight_bytes, 48e9),
    ("Llama-3-8B, bfloat16, a 141 GB GPU (H200)", LLAMA_8B.memory_shape(), LLAMA_8B.weight_bytes, 141e9),
]
CELLS, QUESTION, NEW = 64, 50, 24


def fits(shape: MemoryShape, weights: float, memory: float, T: int, capture: bool) -> bool:
    free = memory - weights
    if instance_bytes(shape, T=T, q=QUESTION, new=NEW, cells=CELLS, capture=capture) / (1 - HEADROOM) > free:
        return False
    after_prefill = free - shape.context_bytes(T)
    try:
        plan = plan_batch(shape, T=T, q=QUESTION, new=NEW, cells=CELLS, available=int(after_prefill),
                          attention=int(after_prefill * 0.25), capture=capture)
    except Exception:  # noqa: BLE001 - the planner refuses: it does not fit
        return False
    return plan.fits >= CELLS


def largest(shape: MemoryShape, weights: float, memory: float, capture: bool) -> int:
    lo, hi = 0, 1 << 24
    while hi - lo > 256:
        mid = (lo + hi) // 2 // 256 * 256
        lo, hi = (mid, hi) if fits(shape, weights, memory, mid, capture) else (lo, mid)
    return lo


def main() -> int:
    lines = ["# Capacity: the longest context a 64-cell decode fits (a projection from the planner's formula)", "",
             "Command: `python benchmarks/capacity.py`. " + __doc__.split("\n\n")[1].replace("\n", " "), "",
             "| case | captures off (answers only) | captures on (every metric) | context K/V per 1k tokens |",
             "|---|---|---|---|"]
    for label, shape, weights, memory in CASES:
        off, on = largest(shape, weights, memory, False), largest(shape, weights, memory, True)
        lines.append(f"| {label} | {off:,} tokens | {on:,} tokens | {shape.context_bytes(1000) / 2**20:.0f} MiB |")
    lines += ["", "With captures on, what each decoded cell keeps until its records are made (its last prompt "
              "token's attention rows over the whole context, every layer and head, float32) dominates: 64 cells "
              "keep 64 such rows, far more than the one shared context K/V. The prefill of SmolLM2 in float32 on "
              "CUDA went through PyTorch's math attention kernel (quadratic memory: 87 GB at 32k tokens on the "
              "H200), which this formula does not model; on the CPU and in bfloat16 it was linear. These are memory "
              "limits only: SmolLM2-135M's and Llama-3-8B's own context windows are 8,192 tokens (Llama-3.1-8B: "
              "131,072), and kvroute refuses a prompt longer than the model's window."]
    write("capacity", lines)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
