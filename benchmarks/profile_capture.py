"""Where the capture overhead of `context_scaling.py` goes: each scorer alone, at a short and a long context.

Same child process as context_scaling (fresh process per measurement, model loaded, warmed up,
`repeats` timed prefills): a plain prefill, then the prefill with one scorer captured, for each of
the scorers that `capture` runs together. The added seconds per scorer show which costs are fixed
per layer (the same at 512 and 4,096 tokens, hence a large share of a short prefill) and which
grow with the context.

    python benchmarks/profile_capture.py [--model smollm2-135m] [--lengths 512 4096] [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys

from common import environment, run_child, write
from context_scaling import CHILD, LINEAR

NOTE = (
    "Medians of the repeats, each configuration in its own process on a shared machine: expect noise of a few "
    "tenths of a second. Negative numbers compare kvroute's prefill, which keeps K/V as per-layer tensors "
    "instead of filling a DynamicCache, with the plain transformers path."
)
WHY = {
    "expected_attention": "kvpress's score recomputes the pre-RoPE queries, their mean and covariance, and a RoPE "
    "rotation averaged over 512 future positions in every layer"
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--lengths", type=int, nargs="+", default=[512, 4096])
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()

    configs = {"plain": [], **{s: [s] for s in LINEAR}, "all six (capture)": LINEAR}
    res: dict[tuple[int, str], float] = {}
    for n in args.lengths:
        for name, scorers in configs.items():
            out = run_child(CHILD, args.model, str(n), str(args.repeats), ",".join(scorers))
            res[(n, name)] = statistics.median(out["times"])
            print(f"{n:>5} {name:<20} {res[(n, name)]:.2f} s", flush=True)

    head = "| scorer | " + " | ".join(f"{n} tokens: s (added)" for n in args.lengths) + " |"
    lines = [
        "# Profile: capture overhead per scorer",
        "",
        f"Command: `python benchmarks/profile_capture.py --model {args.model} --lengths "
        f"{' '.join(map(str, args.lengths))} --repeats {args.repeats}`",
        f"Environment: {environment()}",
        "Median prefill seconds with one scorer captured (kvpress's own `score` code, called once per layer), "
        "and what it adds to the plain prefill.",
        "",
        head,
        "|---|" + "---|" * len(args.lengths),
    ]
    for name in configs:
        cells = []
        for n in args.lengths:
            t, p = res[(n, name)], res[(n, "plain")]
            cells.append(f"{t:.2f}" if name == "plain" else f"{t:.2f} ({t - p:+.2f} s, {100 * (t / p - 1):+.0f}%)")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    added = {name: [res[(n, name)] - res[(n, "plain")] for n in args.lengths] for name in LINEAR}
    worst = max(added, key=lambda k: statistics.mean(added[k]))
    lines += [
        "",
        NOTE
        + f" The costliest scorer is {worst}"
        + (f" ({WHY[worst]})" if worst in WHY else "")
        + ": it adds "
        + ", ".join(f"{a:+.2f} s at {n}" for a, n in zip(added[worst], args.lengths, strict=True))
        + " tokens. All six together add "
        + ", ".join(f"{res[(n, 'all six (capture)')] - res[(n, 'plain')]:+.2f} s at {n}" for n in args.lengths)
        + " tokens: the capture's cost grows far more slowly than the prefill, so it weighs most on short prefills.",
    ]
    write("profile_capture", lines)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
