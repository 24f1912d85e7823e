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
(:func:`onednn_by_default`), and ``KVROUTE_ONEDNN_LINEAR=1`` or ``=0`` sets both.

Results are equal to float32 rounding, not bit for bit: the two libraries sum in different orders (as
BLAS itself does between one row and many), so a near-tie between two next tokens could in principle
resolve differently; the engine's equivalence tests and ``benchmarks/equivalence.py`` check the answers.

:func:`onednn_linear` switches a model's float32 ``nn.Linear`` layers on a CPU to it for the duration of
a block (the decode forwards; never the prefill, whose scores must equal the reference's bit for bit) where
:data:`ONEDNN` says so.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Iterator

import torch
from torch import nn

from kvroute.cpuinfo import cpu_field


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
_ENV = os.environ.get("KVROUTE_ONEDNN_LINEAR")
#: whether oneDNN runs the decode forwards' linears (``KVROUTE_ONEDNN_LINEAR=0``: PyTorch's default linear throughout)
ONEDNN = _ENV != "0"
#: whether it also runs the large ones: ``KVROUTE_ONEDNN_LINEAR=1`` yes, ``=0`` no, unset by the CPU's vendor
#: (:func:`onednn_by_default`)
ONEDNN_LARGE = _ENV != "0" if _ENV is not None else onednn_by_default(cpu_field("vendor_id"))


@functools.cache
def onednn_available() -> bool:
    """Whether this PyTorch build runs oneDNN's linear on float32 CPU tensors (tried once, on a tiny input)."""
    op = getattr(torch.ops.mkldnn, "_linear_pointwise", None) if torch.backends.mkldnn.is_available() else None
    if op is None:
        return False
    try:
        x, w, b = torch.ones(2, 3), torch.ones(4, 3), torch.zeros(4)
        return bool(torch.equal(op(x, w, b, "none", [], ""), torch.full((2, 4), 3.0)))
    except (RuntimeError, NotImplementedError):  # pragma: no cover - builds without the op's CPU kernel
        return False


def _forward(module: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    if (x.dtype != torch.float32 or x.device.type != "cpu" or x.numel() == 0
            or (not ONEDNN_LARGE and x.numel() > LARGE_ROWS * x.shape[-1])):
        return nn.functional.linear(x, module.weight, module.bias)
    return torch.ops.mkldnn._linear_pointwise(x, module.weight, module.bias, "none", [], "")


def switched(model: nn.Module) -> list[nn.Linear]:
    """The layers :func:`onednn_linear` switches: plain float32 ``nn.Linear`` on a CPU, without a forward of their
    own set on the instance (a hook library's wrapper is left alone)."""
    return [m for m in model.modules() if type(m) is nn.Linear and m.weight.device.type == "cpu"
            and m.weight.dtype == torch.float32 and "forward" not in vars(m)]


@contextlib.contextmanager
def onednn_linear(model: nn.Module, enabled: bool | None = None) -> Iterator[int]:
    """Within the block, ``model``'s float32 CPU linear layers run through oneDNN; afterwards they are as before.
    Yields how many layers were switched (0 where oneDNN is unavailable, off, or nothing qualifies).
    ``enabled``: None follows :data:`ONEDNN`."""
    on = ONEDNN if enabled is None else enabled
    layers = switched(model) if on and onednn_available() else []
    for m in layers:
        m.forward = functools.partial(_forward, m)  # type: ignore[method-assign]  # (on the instance: undone below)
    try:
        yield len(layers)
    finally:
        for m in layers:
            vars(m).pop("forward", None)
