"""The decode forwards' linear layers through oneDNN on a CPU.

A decode step multiplies each weight matrix by a handful of rows (one per cell still decoding), where
PyTorch's default float32 CPU path (BLAS ``sgemm``) runs far below its large-matrix speed. oneDNN's
matmul (``torch.ops.mkldnn._linear_pointwise``, the kernel PyTorch's own CPU compiler emits for linear
layers) reads the same dense weights, no copy; on the 2-core AMD EPYC measured here it was 1.0–2.0× faster
at 1–64 rows (by weight shape), 1.5–2.3× for the unembedding, and a 27-cell decode at 2k context tokens
ran 1.15× faster; on a 2-core Intel Xeon of the same kind oneDNN was 1.2–1.9× faster for Qwen2.5-0.5B's weights
at decode sizes and level or slower for SmolLM2's smaller ones, while the default (Intel's MKL) was 7–14% faster
for a question forward's 1,269 rows on every shape (``benchmarks/linear_backend.py`` times both side by side).
So forwards of up to :data:`LARGE_ROWS` rows take oneDNN, larger ones too except on Intel's CPUs
(:func:`onednn_by_default`), and ``KVROUTE_ONEDNN_LINEAR=1`` or ``=0`` sets both (read when a block starts,
:func:`linear_rule`, never at import). The operator is private to PyTorch: it is reached only through
:func:`kvroute.engine.private_ops.onednn_linear`, which checks the version and probes it.

Results are equal to float32 rounding, not bit for bit: the two libraries sum in different orders (as
BLAS itself does between one row and many), so a near-tie between two next tokens could in principle
resolve differently; the engine's equivalence tests and ``benchmarks/equivalence.py`` check the answers.

:func:`onednn_linear` switches a model's float32 ``nn.Linear`` layers on a CPU to it for the duration of
a block (the decode forwards; never the prefill, whose scores must equal the reference's bit for bit) where
:func:`linear_rule` says so.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Iterator, Mapping

import torch
from torch import nn

from kvroute.cpuinfo import cpu_field
from kvroute.engine import private_ops


def onednn_by_default(vendor: str) -> bool:
    """Whether forwards of many rows (more than :data:`LARGE_ROWS`: a question forward of many cells) take oneDNN on a
    CPU of ``vendor`` (``/proc/cpuinfo``'s ``vendor_id``) when ``KVROUTE_ONEDNN_LINEAR`` is not set: everywhere but on
    Intel's CPUs, where PyTorch's default float32 linear (Intel's MKL, tuned for them) was 7–14% faster at 1,269
    rows on every weight shape of both embedded models, while oneDNN stayed the faster at decode sizes on most of them
    (``benchmarks/linear_backend.py``). A rule, not a timing at run time, so that the choice, and so the decode's
    float32 rounding, is the same at every run on a machine."""
    return vendor != "GenuineIntel"


#: a forward with more rows than this (cells × queries) is large: a question forward, not a decode step
LARGE_ROWS = 256
#: overrides of :func:`linear_rule` for the tests and benchmarks that compare the two (None: the rule decides):
#: whether oneDNN runs the decode forwards' linears, and whether it also runs the large ones
ONEDNN: bool | None = None
ONEDNN_LARGE: bool | None = None


def linear_rule(env: Mapping[str, str] | None = None) -> tuple[bool, bool]:
    """(oneDNN for the decode forwards' linears, oneDNN for the large ones too), read when a block starts:
    ``KVROUTE_ONEDNN_LINEAR=0`` neither, ``=1`` both, unset: the small ones, and the large ones by the CPU's vendor
    (:func:`onednn_by_default`). :data:`ONEDNN` and :data:`ONEDNN_LARGE` override it where set."""
    value = (os.environ if env is None else env).get("KVROUTE_ONEDNN_LINEAR")
    small = value != "0"
    large = value != "0" if value is not None else onednn_by_default(cpu_field("vendor_id"))
    return (small if ONEDNN is None else ONEDNN), (large if ONEDNN_LARGE is None else ONEDNN_LARGE)


def onednn_available() -> bool:
    """Whether this PyTorch build runs oneDNN's linear on float32 CPU tensors (:mod:`kvroute.engine.private_ops`)."""
    return private_ops.onednn_linear() is not None


def _forward(module: nn.Linear, x: torch.Tensor, large: bool = True) -> torch.Tensor:
    op = private_ops.onednn_linear()
    if (op is None or x.dtype != torch.float32 or x.device.type != "cpu" or x.numel() == 0
            or (not large and x.numel() > LARGE_ROWS * x.shape[-1])):
        return nn.functional.linear(x, module.weight, module.bias)
    return op(x, module.weight, module.bias)


def switched(model: nn.Module) -> list[nn.Linear]:
    """The layers :func:`onednn_linear` switches: plain float32 ``nn.Linear`` on a CPU, without a forward of their
    own set on the instance (a hook library's wrapper is left alone)."""
    return [m for m in model.modules() if type(m) is nn.Linear and m.weight.device.type == "cpu"
            and m.weight.dtype == torch.float32 and "forward" not in vars(m)]


@contextlib.contextmanager
def onednn_linear(model: nn.Module, enabled: bool | None = None) -> Iterator[int]:
    """Within the block, ``model``'s float32 CPU linear layers run through oneDNN; afterwards they are as before.
    Yields how many layers were switched (0 where oneDNN is unavailable, off, or nothing qualifies).
    ``enabled``: None follows :func:`linear_rule`."""
    small, large = linear_rule()
    on = small if enabled is None else enabled
    layers = switched(model) if on and onednn_available() else []
    for m in layers:
        m.forward = functools.partial(_forward, m, large=large)  # type: ignore[method-assign]  # (on the instance: undone below)
    try:
        yield len(layers)
    finally:
        for m in layers:
            vars(m).pop("forward", None)
