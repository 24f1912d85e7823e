"""Loading a pulled model from the cache folder vs loading (and dequantising) its GGUF.

Each load runs in a fresh process (so neither side benefits from the other's warm state beyond
the OS page cache, which both share), alternating sides, and the medians are compared.

    python benchmarks/load_speed.py [--model smollm2-135m] [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys

from common import environment, median_spread, run_child, write

CHILD = """
import json, sys, time
t0 = time.perf_counter()
from kvroute.models import load_model
lm = load_model(sys.argv[1], device="cpu")
print(json.dumps({"seconds": time.perf_counter() - t0}))
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    from kvroute.models import ZOO
    from kvroute.models.fetch import gguf_path, pull

    entry = ZOO.get(args.model)
    pull(entry)
    gguf = gguf_path(entry)
    if not gguf.is_file():
        print(f"{gguf} is missing; pull with --force to rebuild it", file=sys.stderr)
        return 1
    run_child(CHILD, args.model)  # warm the page cache for both files once
    run_child(CHILD, str(gguf))
    cache, raw = [], []
    for _ in range(args.repeats):
        cache.append(run_child(CHILD, args.model)["seconds"])
        raw.append(run_child(CHILD, str(gguf))["seconds"])
    ratio = statistics.median(raw) / statistics.median(cache)
    lines = [
        "# Load speed: cache folder vs GGUF",
        "",
        "Command: `python benchmarks/load_speed.py " + f"--model {args.model} --repeats {args.repeats}`",
        f"Environment: {environment()}",
        "",
        "| source | seconds per load (median, range) |",
        "|---|---|",
        f"| cached safetensors folder | {median_spread(cache)} |",
        f"| GGUF (dequantised by transformers) | {median_spread(raw)} |",
        "",
        "Each load is a fresh Python process including kvroute's and transformers' imports.",
        "",
        f"speedup: {ratio:.1f}",
    ]
    write("load_speed", lines)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
