"""`make bench`: run every benchmark and rewrite benchmarks/RESULTS.md from their outputs.

    python benchmarks/run_all.py                 # all of them
    python benchmarks/run_all.py grid_speed      # only these (RESULTS.md still collects every result)
    python benchmarks/run_all.py --collect       # run nothing, only rewrite RESULTS.md from results/

RESULTS.md collects each benchmark's results/NAME.md, then its runs on other models (results/NAME_MODEL.md,
written by `python benchmarks/NAME.py --model MODEL`, which `make bench` does not run).
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).parent
ORDER = ["load_speed", "equivalence", "grid_speed", "draft_speed", "profile_grid", "metrics_overhead", "cell_batching",
         "context_scaling", "attention_kernels", "linear_backend", "attention_memory", "capacity",
         "profile_capture",
         "bookkeeping", "planted_truth", "mask_controls", "restore_controls", "paper_plan", "startup"]
#: collected into RESULTS.md but never run by `make bench`: they need a CUDA device (see each script's doc)
DEVICE_ONLY = ["gpu_check"]
#: collected into RESULTS.md, run by hand: 85 min of study sweeps on 2 cores here, and the main job run twice
#: (`make demo` before and after a change, about 40 min; see each script's doc)
BY_HAND = ["cliff_study", "demo_speed"]


def main() -> int:
    failed = []
    collect_only = sys.argv[1:] == ["--collect"]
    chosen = [] if collect_only else (sys.argv[1:] or ORDER)
    unknown = [n for n in chosen if n not in ORDER]
    if unknown:
        print(f"unknown benchmark(s) {', '.join(unknown)}; choose from {', '.join(ORDER)}", file=sys.stderr)
        return 2
    for name in chosen:
        script = HERE / f"{name}.py"
        if not script.exists():
            continue
        print(f"== {name}", flush=True)
        t0 = time.perf_counter()
        rc = subprocess.call([sys.executable, str(script)], cwd=HERE)
        print(f"== {name}: exit {rc} in {time.perf_counter() - t0:.0f} s", flush=True)
        if rc:
            failed.append(name)
    parts = ["# kvroute benchmarks", "",
             "Rewritten by `make bench` (each section also by its own script). Times are medians of repeated, "
             "side-by-side runs on a shared 2-core machine: compare ratios, not absolute seconds.", ""]
    for name in ORDER + BY_HAND + DEVICE_ONLY:
        for f in [HERE / "results" / f"{name}.md", *sorted((HERE / "results").glob(f"{name}_*.md"))]:
            if f.exists():
                parts += ["#" + f.read_text().strip(), ""]
    (HERE / "RESULTS.md").write_text("\n".join(parts))
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
