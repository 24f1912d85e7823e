"""Freed memory retained for reuse (kvroute.heap) against glibc's default, side by side, on one machine.

    python benchmarks/heap_reuse.py [--families base,hops,long_context2000] [--repeats 2]

Two parts, both with the embedded default model (Qwen2.5-0.5B, float32, this process's threads):

- one operator on the shapes that pay most: SiLU of an MLP activation (37 cells × 50 tokens × 4,864: 34 MiB out)
  and the logit lens's log-softmax of 220 rows over the vocabulary (127 MiB out), each output a fresh tensor,
  outside and inside :func:`kvroute.heap.retained` (median of 7);
- a demo subset (the demo's sweep config, its task families filtered to ``--families``; each family one instance, as
  at ``kvroute demo --scale 0.1``) as a child process per run with ``KVROUTE_RETAIN_HEAP=0`` (glibc's default) or
  unset (retained), in the order off, on, on, off, … (``--repeats`` each): median wall time of the sweep, the peak
  resident memory of each child (VmHWM), and the two settings' records compared field by field (the arithmetic must
  not change: ``identical`` means every field equal, floats to 1e-9 relative, timings aside).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from common import MEMORY_PROBE, environment, median_spread, run_child, write  # noqa: E402
from compare_runs import differences, records  # noqa: E402

MODEL = "qwen2.5-0.5b"
WORK = Path("/tmp/kvroute-heap-reuse")

CHILD = MEMORY_PROBE + r"""
import json, sys, time
from pathlib import Path
from kvroute.demo import demo_config
from kvroute.sweep import run_sweep, sweep_config_from_mapping
model, families, out = sys.argv[1], sys.argv[2].split(","), Path(sys.argv[3])
mapping = demo_config([model], scale=0.1)
mapping["tasks"] = [t for t in mapping["tasks"] if f"{t['family']}{t.get('target_tokens', '')}" in families]
t0 = time.perf_counter()
run_sweep(sweep_config_from_mapping(mapping, source="heap_reuse"), out)
print(json.dumps({"seconds": time.perf_counter() - t0, "peak_mb": status("VmHWM")}))
"""


def operator_times(model: torch.nn.Module) -> list[str]:
    """Median times of the two operators outside and inside a retaining block, one table row each."""
    from kvroute import heap

    vocab = model.get_output_embeddings().weight.shape[0]
    act = torch.randn(37, 50, model.config.intermediate_size)
    logits = torch.randn(220, vocab)
    ops = {f"SiLU, 37 × 50 × {act.shape[-1]:,} ({act.numel() * 4 >> 20} MiB)": lambda: torch.nn.functional.silu(act),
           f"log-softmax, 220 × {vocab:,} ({logits.numel() * 4 >> 20} MiB)": lambda: torch.log_softmax(logits, -1)}
    lines = ["| operator | glibc's default, ms | retained, ms | ratio |", "|---|---|---|---|"]
    with torch.no_grad():
        for name, op in ops.items():
            ms = {}
            for on in (False, True):
                with heap.retained("cpu", enabled=on):
                    op()
                    ts = []
                    for _ in range(7):
                        t0 = time.perf_counter()
                        op()
                        ts.append(time.perf_counter() - t0)
                ms[on] = statistics.median(ts) * 1e3
            lines.append(f"| {name} | {ms[False]:.1f} | {ms[True]:.1f} | {ms[True] / ms[False]:.2f} |")
    return lines


def compare(a: Path, b: Path) -> tuple[int, list[str]]:
    """How many records two runs share, and the fields that differ between them (timings aside)."""
    ra, rb = records(a), records(b)
    fields = set(differences(ra, rb))
    if set(ra) != set(rb):
        fields.add("(the sets of cells)")
    return len(set(ra) & set(rb)), sorted(fields)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--families", default="base,hops,long_context2000",
                    help="demo task families (long_context with its length) to run, comma-separated")
    ap.add_argument("--repeats", type=int, default=2, help="runs per setting, in the order off, on, on, off, …")
    args = ap.parse_args()

    from kvroute import heap
    from kvroute.models import load_model

    if not heap.available():
        print("this machine's allocator is not glibc's: nothing to compare", file=sys.stderr)
        return 1
    lm = load_model(MODEL, dtype="float32")
    ops = operator_times(lm.model)
    del lm

    shutil.rmtree(WORK, ignore_errors=True)
    order = [setting for i in range(args.repeats) for setting in ((False, True) if i % 2 == 0 else (True, False))]
    runs: dict[bool, list[dict]] = {False: [], True: []}
    dirs: dict[bool, Path] = {}
    for i, on in enumerate(order):
        out = WORK / f"{'on' if on else 'off'}-{i}"
        res = run_child(CHILD, MODEL, args.families, str(out), env={"KVROUTE_RETAIN_HEAP": "1" if on else "0"})
        runs[on].append(res)
        dirs.setdefault(on, out)
        print(f"{'retained' if on else 'default '}: {res['seconds']:.1f} s, peak {res['peak_mb']:.0f} MB", flush=True)
    n, differ = compare(dirs[False], dirs[True])
    wall = {on: statistics.median(r["seconds"] for r in runs[on]) for on in runs}
    peak = {on: max(r["peak_mb"] for r in runs[on]) for on in runs}

    cmd = f"python benchmarks/heap_reuse.py --families {args.families} --repeats {args.repeats}"
    lines = [
        "# Freed memory retained for reuse against glibc's default",
        "",
        f"Command: `{cmd}`",
        f"Environment: {environment()}",
        f"Model {MODEL} (float32).",
        "",
        "One operator, its output a fresh tensor each call (median of 7, in one process):",
        "",
        *ops,
        "",
        f"The demo's sweep on the families {args.families} (one instance each, as at `--scale 0.1`), each run a child "
        f"process, in the order {', '.join('retained' if on else 'default' for on in order)}:",
        "",
        "| setting | sweep wall s | peak resident MB |",
        "|---|---|---|",
        f"| glibc's default (`KVROUTE_RETAIN_HEAP=0`) | {median_spread([r['seconds'] for r in runs[False]])} | "
        f"{peak[False]:.0f} |",
        f"| retained (the default) | {median_spread([r['seconds'] for r in runs[True]])} | {peak[True]:.0f} |",
        "",
        f"Retained / default, sweep wall time: {wall[True] / wall[False]:.2f}×; peak resident memory "
        f"{peak[True] - peak[False]:+.0f} MB.",
        f"Records of one run of each, field by field (timings aside): {n} cells, "
        + ("identical." if not differ else f"differ in {', '.join(differ)}."),
    ]
    print(json.dumps({"ratio": wall[True] / wall[False], "peak_delta_mb": peak[True] - peak[False],
                      "identical": not differ}))
    write("heap_reuse", lines)
    return 0 if not differ else 1


if __name__ == "__main__":
    raise SystemExit(main())
