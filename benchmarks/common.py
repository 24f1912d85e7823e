"""Helpers shared by the benchmark scripts: environment header, medians, subprocess peak memory, markdown tables."""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).parent / "results"


def environment() -> str:
    import torch
    import transformers

    try:
        from importlib.metadata import version

        kvp = version("kvpress")
    except Exception:  # pragma: no cover
        kvp = "?"
    from kvroute import __version__

    cpu = platform.processor() or platform.machine()
    return (f"{time.strftime('%Y-%m-%d')}, {os.cpu_count()} CPU cores ({cpu}), torch {torch.__version__} "
            f"({torch.get_num_threads()} threads), transformers {transformers.__version__}, kvpress {kvp}, "
            f"kvroute {__version__}, Python {platform.python_version()}")


def median_spread(xs: list[float]) -> str:
    """``median (min–max, n=k)`` for a list of timings."""
    if len(xs) == 1:
        return f"{xs[0]:.2f}"
    return f"{statistics.median(xs):.2f} ({min(xs):.2f}–{max(xs):.2f}, n={len(xs)})"


def run_child(code: str, *args: str, timeout: float = 3600) -> dict:
    """Run ``code`` in a fresh Python; it must print one JSON line last. Adds ``peak_rss_mb`` of the child."""
    proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"child failed: {proc.stderr[-2000:]}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    return out


def write(name: str, lines: list[str]) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    p = RESULTS / f"{name}.md"
    p.write_text("\n".join(lines) + "\n")
    return p


#: the memory probe of the benchmarks' child processes (prepend it to a child's code): ``status("VmRSS")`` /
#: ``status("VmHWM")`` in MB from /proc/self/status, and ``reset_peak()`` to restart the peak (VmHWM) count
MEMORY_PROBE = r"""
def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) / 1024

def reset_peak():
    open("/proc/self/clear_refs", "w").write("5")
"""


def fmt_cell(v: object, digits: int = 3) -> str:
    """A markdown table cell: "–" for a missing value (None or NaN), yes/no for a bool, ``digits`` decimals."""
    if v is None or (isinstance(v, float) and v != v):
        return "–"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return str(v)


def md_table(rows: list[dict], cols: list[tuple[str, str]], digits: int = 3) -> list[str]:
    """A markdown table of ``rows`` with ``cols`` as (key, header) pairs."""
    out = ["| " + " | ".join(h for _, h in cols) + " |", "|" + "---|" * len(cols)]
    out += ["| " + " | ".join(fmt_cell(r.get(k), digits) for k, _ in cols) + " |" for r in rows]
    return out
