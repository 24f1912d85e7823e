"""Helpers shared by the benchmark scripts: environment header, medians, subprocess peak memory, markdown tables."""

from __future__ import annotations

import contextlib
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

RESULTS = Path(__file__).parent / "results"
ROOT = Path(__file__).resolve().parent.parent


@contextlib.contextmanager
def worktree(ref: str | None) -> Iterator[Path | None]:
    """Git revision ``ref`` of this repository checked out into a temporary worktree, for a before/after run: its
    root (put its ``src`` first on ``PYTHONPATH``), removed afterwards (None: no ref)."""
    if ref is None:
        yield None
        return
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp) / "before"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "--quiet", str(tree), ref], check=True)
        try:
            yield tree
        finally:
            done = subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], check=False)
            if done.returncode:
                print(f"could not remove the worktree {tree} (git worktree prune removes it)", file=sys.stderr)


def cpu_name() -> str:
    """The CPU's model name with the architecture (timings differ between machines of the same kind: the model says
    which ran a result), as a run's manifest records it (:func:`kvroute.sweep.manifest.cpu_model`)."""
    from kvroute.sweep.manifest import cpu_model

    model, machine = cpu_model(), platform.machine()
    return model if model == machine else f"{model}, {machine}"


def environment() -> str:
    import torch
    import transformers

    try:
        from importlib.metadata import version

        kvp = version("kvpress")
    except Exception:  # pragma: no cover
        kvp = "?"
    from kvroute import __version__

    return (f"{time.strftime('%Y-%m-%d')}, {os.cpu_count()} CPU cores ({cpu_name()}), torch {torch.__version__} "
            f"({torch.get_num_threads()} threads), transformers {transformers.__version__}, kvpress {kvp}, "
            f"kvroute {__version__}, Python {platform.python_version()}")


def median_spread(xs: list[float]) -> str:
    """``median (min–max, n=k)`` for a list of timings."""
    if len(xs) == 1:
        return f"{xs[0]:.2f}"
    return f"{statistics.median(xs):.2f} ({min(xs):.2f}–{max(xs):.2f}, n={len(xs)})"


def matmul_peak(n: int = 1024, repeats: int = 7) -> float:
    """The FLOP/s of a float32 ``torch.mm`` of two n×n matrices on this machine now, with this process's threads: the
    best of ``repeats`` (after a warm-up), measured in the same run as the benchmark it anchors, so that a fraction of
    it says how much of the machine a benchmark used whatever else ran that day."""
    import torch

    a, b = torch.randn(n, n), torch.randn(n, n)
    torch.mm(a, b)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - t0)
    return 2 * n**3 / best


def peak_fraction(flops: float, seconds: float, peak: float) -> str:
    """One line: the FLOP/s achieved by ``flops`` of forward work in ``seconds``, the matmul ``peak``
    (:func:`matmul_peak`) and the fraction, as ``fraction of peak: X`` (the form every speed benchmark prints)."""
    achieved = flops / seconds
    return (f"achieved {achieved / 1e9:.1f} GFLOP/s (forward FLOPs counted, benchmarks/flops.py) against a float32 "
            f"torch.mm peak of {peak / 1e9:.1f} GFLOP/s measured in this run; fraction of peak: {achieved / peak:.2f}")


def run_child(code: str, *args: str, timeout: float = 3600, env: dict[str, str] | None = None) -> dict:
    """Run ``code`` in a fresh Python (``env``: variables set for it on top of this process's); it must print one
    JSON line last."""
    proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=timeout,
                          env=None if env is None else {**os.environ, **env})
    if proc.returncode != 0:
        raise RuntimeError(f"child failed: {proc.stderr[-2000:]}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    return out


def write(name: str, lines: list[str]) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    p = RESULTS / f"{name}.md"
    p.write_text("\n".join(lines) + "\n")
    return p


#: the environment of a child that measures peaks only (no timings): glibc's mmap threshold fixed at its default
#: 128 KB. Left to itself glibc raises the threshold after a large block is freed, so later tensors of up to 32 MB
#: come from the heap, whose freed fragments stay resident: the peak RSS then depends on the order of allocations
#: (attention_memory's 64-cell decode at 2,048 tokens read 330, 394 and 514 MB in three runs of the same code; with
#: the threshold fixed, 289, 288 and 289 MB). Every block of 128 KB or more is then mapped and returned when freed, so
#: the peak follows the live tensors; it costs time (a mapping and its page faults per block), hence not for
#: children that also time. ``KVROUTE_RETAIN_HEAP=0`` keeps the engine from retaining freed blocks (kvroute.heap),
#: which would undo the fixed threshold inside its runs.
PEAK_ONLY_ENV = {"MALLOC_MMAP_THRESHOLD_": str(128 * 1024), "KVROUTE_RETAIN_HEAP": "0"}


#: the memory probe of the benchmarks' child processes (prepend it to a child's code): ``status("VmRSS")`` /
#: ``status("VmHWM")`` in MB from /proc/self/status, ``reset_peak()`` to restart the peak (VmHWM) count, and
#: ``baseline()``: hand the heap's free pages back to the system (glibc's malloc_trim), then read the resident size and
#: restart the peak count. Without the trim, memory the allocator kept from earlier work (the prefill) is resident but
#: free, the measured code reuses it without growing the RSS, and its peak reads low by as much
#: (tests/unit/test_memory_probe.py: 0.7 MB read for 96 MB allocated).
MEMORY_PROBE = r"""
def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) / 1024

def reset_peak():
    open("/proc/self/clear_refs", "w").write("5")

def baseline():
    import ctypes, gc
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
    base = status("VmRSS")
    reset_peak()
    return base
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
