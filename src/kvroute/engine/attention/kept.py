"""Masked attention over each cell's kept context entries only, in one CPU kernel (``csrc/kept_attention.cpp``).

A cell at ratio α keeps (1 − α)·T context entries per KV head, yet PyTorch's fused kernel, given the keep mask as an
additive bias, multiplies the queries with all T keys and drops the masked scores: at α = 0.9 nine tenths of the work,
and most of a long-context decode step. A pruned cache (kvpress's) pays for its kept entries only. This kernel does the
same from the shared context: per (KV head, cell) it reads the kept positions from a CSR list (:func:`kept_index`, built
once per layer of a batch and sliced when cells leave it) and runs an online softmax over them, walking the context in
spans whose keys and values the cells of a work item share in cache, and then goes on over the cells' own suffix (their
question and answer so far, causal) in the same online softmax, so that a forward's attention is one call (joining the
suffix in PyTorch, :func:`kvroute.engine.attention.streaming.with_suffix`, took a third of a decode step's attention
time: small tensor operations, each paid per layer and step). It needs no transient tensor beyond its output (for a
decode step, one partial output per 512-position chunk of the context, at most 64: tens of MB for an 8B model's 64 cells
at 32k tokens, beside gigabytes of context K/V), so it also replaces the gathered and chunked forms where it applies
(:data:`KEPT_MAX_ROWS`).

The kernel is C++ with AVX-512 intrinsics, float32 only, and opt-in: it runs only where it was built ahead of use by
``kvroute kernel build`` (``make kernel``; a C++ compiler and ninja: the ``kernel`` extra,
``pip install 'kvroute[kernel]'``), never inside a run. On the main job's cells (a few hundred context tokens, every
metric) it saved nothing against PyTorch's kernels (benchmarks/results/compare_runs_kernel_off.md), against 19–37% of
a long-context grid's time (benchmarks/results/grid_speed_backends_*.md), so the default path does without it and a
run never pays its build (about 30 s idle, minutes on a busy machine, 1.5 GB of memory). The build goes into
``$KVROUTE_HOME/kernels`` in a child process under kvroute's lock with a timeout, and a build is loaded only when its
recorded checksum matches (:mod:`kvroute.engine.kept_build`). Where it is not built or cannot run (no AVX-512, another
dtype or device, a head size it was not instantiated for) the masked attention uses PyTorch's kernels, with the same
results to float32 rounding (tests/unit/test_kept.py); ``KVROUTE_KEPT_KERNEL=0`` (or another
``decoding.attention_backend``) keeps a built one off. ``benchmarks/attention_kernels.py`` times it beside the other
forms.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import platform
import shutil
import sys
from pathlib import Path
from typing import Any

import torch

from kvroute.cpuinfo import cpu_field
from kvroute.engine.attention.backend import AttentionCall, Availability, Backend, register
from kvroute.engine.attention.context import kept_index, select_index
from kvroute.engine.kept_build import (
    KernelSpec,
    KernelUnavailable,
    NotBuilt,
    build_timeout,
    kernels_folder,
    obtain,
)

log = logging.getLogger(__name__)

__all__ = ["Kept", "build_kernel", "kept_available", "kept_context", "kept_index", "kept_ready",
           "select_index"]  # (the index: context.py)

SOURCE = Path(__file__).parent.parent / "csrc" / "kept_attention.cpp"
#: head sizes the kernel is instantiated for
HEAD_DIMS = (64, 80, 96, 128, 256)
#: the most query rows per (KV head, cell) (GQA group × queries per cell) for which the kernel runs. It reads each
#: kept key once per (KV head, cell) and blocks its products over the rows, so with many rows the gathered form's
#: matrix products catch up: benchmarks/attention_kernels.py (SmolLM2's shapes, 27 cells) has it the fastest form at
#: 512, 2,048 and 8,192 tokens up to 510 rows (at 8,192: 4.7 against 7.2 ms a layer for a decode step, 89 against
#: 165 for 47 queries, 327 against 402 for 170), and level with the gathered form at 512 tokens and 510 rows
KEPT_MAX_ROWS = 512
#: a switch for the tests and benchmarks that run PyTorch's kernels beside it (``KVROUTE_KEPT_KERNEL=0`` is read when a
#: decode's backend is resolved, :func:`kvroute.engine.attention.backend.resolve_backend`, and keeps it off there)
ENABLED = True
CFLAGS = ("-O3", "-march=native", "-fopenmp")
LDFLAGS = ("-fopenmp",)
BUILDING = "kvroute: building the kept-entries attention kernel (once per machine, about 30 s)"


def _cpu_flags() -> str:
    """The CPU's feature flags (Linux), '' where they cannot be read."""
    return cpu_field("flags")


@functools.cache
def _avx512() -> bool:
    """Whether this CPU has AVX-512 (the kernel's instructions)."""
    return "avx512f" in _cpu_flags().split()


def _build_name(flags: str) -> str:
    """The extension's name: the source, the CPU's flags, the compiler flags and the versions of PyTorch and Python
    hashed in, so that a build for another CPU, PyTorch or Python (a shared home directory) is never loaded."""
    seen = (flags, torch.__version__, platform.machine(), sys.implementation.cache_tag, *CFLAGS, *LDFLAGS)
    digest = hashlib.sha1(SOURCE.read_bytes() + "|".join(seen).encode())
    return f"kvroute_kept_{digest.hexdigest()[:12]}"


def _can_build(have_ninja: bool) -> None:
    """Raises :class:`KernelUnavailable` where no build can run here (before the "building" line)."""
    if not have_ninja:
        raise KernelUnavailable("ninja, the build tool, is not installed (pip install 'kvroute[kernel]' adds it)")
    compiler = os.environ.get("CXX") or "c++"  # the compiler PyTorch's build calls
    if shutil.which(compiler) is None:
        raise KernelUnavailable(f"no C++ compiler ({compiler}) was found")


def _announce() -> None:
    from kvroute.console import err_console

    err_console.print(BUILDING, soft_wrap=True, markup=False, highlight=False)


def _spec() -> KernelSpec:
    return KernelSpec(_build_name(_cpu_flags()), (str(SOURCE),), CFLAGS, LDFLAGS)


def build_kernel() -> Any:
    """Build the kernel on this machine if no verified build is there yet, and load it (the explicit step,
    ``kvroute kernel build``; about half a minute idle). Raises :class:`KernelUnavailable` with why, in one line,
    where it cannot be built or loaded here. The build and the checks before each load:
    :mod:`kvroute.engine.kept_build`."""
    if not ENABLED:
        raise KernelUnavailable("it is switched off in this process (kept.ENABLED)")
    if not _avx512():
        raise KernelUnavailable("this CPU has no AVX-512, the kernel's instructions")
    from torch.utils.cpp_extension import is_ninja_available

    path = os.environ.get("PATH", "")
    try:
        try:
            import ninja  # the build tool, from the ``ninja`` wheel (the ``kernel`` extra): need not be on PATH

            os.environ["PATH"] = str(ninja.BIN_DIR) + os.pathsep + path  # the build process inherits it
        except ImportError:
            pass
        have_ninja = is_ninja_available()  # the wheel's or a system one on PATH
        try:
            module = obtain(_spec(), kernels_folder(), timeout=build_timeout(),
                            can_build=lambda: _can_build(have_ninja), announce=_announce)
        except KernelUnavailable:
            raise
        except Exception as e:  # noqa: BLE001 - any build or load failure, in one line
            raise KernelUnavailable(f"{type(e).__name__}: {e}") from e
    finally:
        os.environ["PATH"] = path
    kernel.cache_clear()  # the next forward loads the build
    return module


@functools.cache
def kernel() -> Any | None:
    """The compiled kernel module where a verified build of it is on this machine (``kvroute kernel build`` makes
    one), else None: it is never built here, inside a run. Why it is not loaded is logged once, in one line (at info
    level where it was simply never built: PyTorch's kernels are the default)."""
    if not ENABLED:
        return None
    if not _avx512():
        log.info("kept-entries attention kernel: this CPU has no AVX-512; PyTorch's kernels run")
        return None
    try:
        return obtain(_spec(), kernels_folder(), timeout=build_timeout(), can_build=_no_build, announce=_no_build,
                      build=False)
    except NotBuilt:
        log.info("kept-entries attention kernel not built on this machine (`kvroute kernel build` builds it); "
                 "PyTorch's kernels run")
    except Exception as e:  # noqa: BLE001 - any load failure: the PyTorch kernels still give the results
        why = str(e) if isinstance(e, KernelUnavailable) else f"{type(e).__name__}: {e}"
        log.warning("kept-entries attention kernel unavailable (%s); PyTorch's kernels run", " ".join(why.split()))
    return None


def _no_build() -> None:  # pragma: no cover - obtain(build=False) calls neither
    raise AssertionError("a run never builds the kernel")


def kept_applies(device: torch.device, dtype: torch.dtype, head_dim: int) -> bool:
    """Whether the kernel can serve a model on ``device`` in ``dtype`` with heads of ``head_dim`` on this CPU, built or
    not (what ``kvroute kernel build`` would make worth it)."""
    return ENABLED and device.type == "cpu" and dtype == torch.float32 and head_dim in HEAD_DIMS and _avx512()


def kept_ready(device: torch.device, dtype: torch.dtype, head_dim: int) -> bool:
    """Whether the kernel runs for such a model: it applies and is built (the memory planner's question)."""
    return kept_applies(device, dtype, head_dim) and kernel() is not None


def kept_available(query: torch.Tensor, rows: int) -> bool:
    """Whether :func:`kept_context` runs for ``query`` (``[..., D]``) with ``rows`` query rows per (KV head, cell): on
    a CPU, float32, a head size in :data:`HEAD_DIMS`, at most :data:`KEPT_MAX_ROWS` rows, and the kernel built."""
    return rows <= KEPT_MAX_ROWS and kept_ready(query.device, query.dtype, query.shape[-1])


def kept_context(qg: torch.Tensor, k_ctx: torch.Tensor, v_ctx: torch.Tensor, offsets: torch.Tensor,
                 index: torch.Tensor, *, scale: float, key: torch.Tensor | None = None,
                 value: torch.Tensor | None = None, q: int = 1,
                 own: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of ``qg`` ``[B, Hkv, R, D]`` over each (KV head, cell)'s kept rows of ``k_ctx``/``v_ctx``
    ``[Hkv, T, D]`` (CSR ``offsets``/``index``, :func:`kept_index`): the output ``[Hkv, B, R, D]`` and each row's
    log-sum-exp ``[Hkv, B, R]`` (output 0 and log-sum-exp −inf where a pair keeps nothing), for
    :func:`kvroute.engine.attention.streaming.with_suffix`. Check :func:`kept_available` first.

    With the cells' own suffix ``key``/``value`` ``[B, Hkv, s, D]`` (the queries its last ``q`` positions, rows of
    ``qg`` in (group head, query) order) and ``own`` (bool ``[B, s]``, the slots each cell may see; None: all), the
    same online softmax goes on over the suffix, causally, in the kernel: the output is then the whole attention,
    the log-sum-exp its joint normaliser, and nothing is left for ``with_suffix``."""
    mod = kernel()
    assert mod is not None
    out, lse = mod.kept_attention(qg.transpose(0, 1).contiguous(), k_ctx, v_ctx, offsets, index, float(scale), key,
                                  value, own, q)
    return out, lse


@register
class Kept(Backend):
    """The kept-entries kernel: context and suffix in one online softmax over each (KV head, cell)'s kept entries."""

    name = "kept"
    devices = ("cpu",)
    lse = True

    def available(self) -> Availability:
        if not ENABLED:
            return Availability(False, "switched off")
        if not _avx512():
            return Availability(False, "this CPU has no AVX-512")
        if kernel() is None:
            return Availability(False, "not built on this machine (`kvroute kernel build` builds it) or not loadable "
                                       "(see the log)")
        return Availability(True)

    def serves(self, call: AttentionCall) -> bool:
        return call.T > 0 and call.ctx.backend.kept and kept_available(call.qg, call.qg.shape[2])

    def forward(self, call: AttentionCall) -> torch.Tensor:
        return self.attend(call)[0]

    def attend(self, call: AttentionCall) -> tuple[torch.Tensor, torch.Tensor | None]:
        offsets, index = call.ctx.context_index(call.layer)
        # context and suffix in one online softmax: [Hkv, B, G·q, D] and the joint log-sum-exp [Hkv, B, G·q]
        return kept_context(call.qg, call.k_ctx, call.v_ctx, offsets, index, scale=call.scale, key=call.key,
                            value=call.value, q=call.q, own=call.own)
