"""Freed memory kept for reuse while the engine computes on a CPU (glibc's allocator, Linux).

Every forward allocates fresh tensors for its intermediates: the MLP's ``[rows, intermediate]`` activations, the
unembedding's ``[rows, vocabulary]`` logits, KVzip's attention maps. glibc serves a request above its mmap threshold
(128 KiB, rising with use to at most 32 MiB) with a new mapping, which the kernel backs page by page as it is first
written and which ``free`` unmaps at once; a request of 32 MiB or more always takes this path. SiLU of a 34 MiB
tensor (37 cells × 50 tokens × 4,864, Qwen2.5-0.5B's MLP) so took 14.9 ms with a fresh mapping and 3.3 ms reusing a
freed block on the 2-core AMD EPYC measured here (``benchmarks/heap_reuse.py``).

Within :func:`retained`, glibc takes no new mappings and gives nothing back to the system, so freed blocks are reused
in place; leaving the outermost block returns the free memory to the system (``malloc_trim``). The engine retains
for one ``Engine.run`` (one instance: its prefill and every cell) and a ticket search, and hands the free memory back
(:func:`release`) when the decode starts, between decode batches, before each scorer's own forwards and after each
KVzip replay pass, where the next tensors differ in shape. Not for a whole sweep: held across instances, blocks
freed in one instance's shapes serve the next one's badly, and in a trial with three demo instances held as one
block the peak resident memory rose by gigabytes (``benchmarks/heap_reuse.py``: +460 MB per instance as it is). The
arithmetic is untouched: only where tensors live changes
(tests/unit/test_heap.py compares the engine's outputs both ways). The memory planner does not count what glibc holds
free as available (a freed block serves only requests that fit in it). Elsewhere (not Linux with glibc, or
``KVROUTE_RETAIN_HEAP=0``, read when a block starts) the block does nothing.

glibc offers no way back to its dynamic thresholds once one is set: after the first block its mmap threshold stays
where it had risen to, and its trim threshold is 128 KiB, glibc's default.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import logging
import os
import platform
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeVar

import torch

log = logging.getLogger(__name__)

# mallopt's parameters (malloc.h) and glibc's defaults for the two changed
M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4
DEFAULT_TRIM_THRESHOLD, DEFAULT_MMAP_MAX = 128 * 1024, 65536
#: retained: trim only when this much is free at the top of the heap (mallopt takes an int: 2 GiB)
NO_TRIM = 2**31 - 1
#: override of :func:`heap_rule` for tests and benchmarks (None: the rule decides)
RETAIN: bool | None = None

_lock = threading.Lock()
_depth = 0


@functools.cache
def _libc() -> ctypes.CDLL | None:
    """glibc with ``mallopt`` and ``malloc_trim``, or None."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        for name in ("mallopt", "malloc_trim"):
            getattr(libc, name)
    except (OSError, AttributeError) as e:
        log.info("glibc's allocator controls are not available (%s); freed memory is not retained", e)
        return None
    libc.mallopt.argtypes, libc.mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    libc.malloc_trim.argtypes, libc.malloc_trim.restype = [ctypes.c_size_t], ctypes.c_int
    return libc


def heap_rule(env: Mapping[str, str] | None = None) -> bool:
    """Whether a block retains freed memory: yes unless ``KVROUTE_RETAIN_HEAP=0`` (read now); :data:`RETAIN` overrides
    it where set."""
    if RETAIN is not None:
        return RETAIN
    return (os.environ if env is None else env).get("KVROUTE_RETAIN_HEAP") != "0"


def available() -> bool:
    """Whether this process can retain freed memory (Linux with glibc)."""
    return _libc() is not None


def describe() -> str:
    """How the engine's blocks treat freed memory in this process, for a session's manifest entry."""
    if not available():
        return "system allocator (no glibc allocator controls here)"
    return "retained for reuse" if heap_rule() else "system allocator (KVROUTE_RETAIN_HEAP=0)"


def active() -> bool:
    """Whether freed memory is being retained now (inside a :func:`retained` block that took effect)."""
    return _depth > 0


@contextlib.contextmanager
def retained(device: torch.device | str = "cpu", enabled: bool | None = None) -> Iterator[bool]:
    """Within the block (nested blocks join the outermost), freed memory stays in the process for reuse; leaving the
    outermost block returns it to the system. Yields whether retention is on. ``device``: where the computing runs
    (on another than the CPU the block does nothing); ``enabled``: None follows :func:`heap_rule`."""
    global _depth
    libc = _libc()
    cpu = torch.device(device).type == "cpu"
    with _lock:
        on = _depth > 0 or (cpu and libc is not None and (heap_rule() if enabled is None else enabled))
        if on:
            if _depth == 0 and libc is not None:
                libc.mallopt(M_MMAP_MAX, 0)
                libc.mallopt(M_TRIM_THRESHOLD, NO_TRIM)
            _depth += 1
    try:
        yield on
    finally:
        if on:
            with _lock:
                _depth -= 1
                if _depth == 0 and libc is not None:
                    libc.mallopt(M_MMAP_MAX, DEFAULT_MMAP_MAX)
                    libc.mallopt(M_TRIM_THRESHOLD, DEFAULT_TRIM_THRESHOLD)
                    libc.malloc_trim(0)


def release() -> None:
    """Within a block, hand the free memory back to the system now (``malloc_trim``), keeping the block: between
    phases whose tensors differ in shape (the prefill's and the decode's), where blocks freed by one would serve the
    next badly and the memory planner is about to read what is free."""
    libc = _libc()
    if active() and libc is not None:
        libc.malloc_trim(0)


F = TypeVar("F", bound=Callable[..., Any])


def retaining(device_of: Callable[[Any], torch.device]) -> Callable[[F], F]:
    """A decorator: the function runs inside :func:`retained` on ``device_of(first argument)`` (a method's ``self``,
    or the loaded model it is given)."""
    def wrap(fn: F) -> F:
        @functools.wraps(fn)
        def run(first: Any, *args: Any, **kwargs: Any) -> Any:
            with retained(device_of(first)):
                return fn(first, *args, **kwargs)
        return run  # type: ignore[return-value]
    return wrap
