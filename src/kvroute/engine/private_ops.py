"""PyTorch's private operators that kvroute uses, behind one version check and a probe against the public form.

Two private operators are faster than anything public on a CPU: ``aten._scaled_dot_product_flash_attention_for_cpu``
(the fused attention kernel, which also returns each row's log-sum-exp: the fused attention backend,
:mod:`kvroute.engine.attention.fused`) and ``mkldnn._linear_pointwise`` (oneDNN's matmul for the decode forwards'
linear layers, :mod:`kvroute.engine.linear`). Their names and signatures are not PyTorch's promise, so each is used
only where this PyTorch's version lies in :data:`CHECKED` and a tiny call equals the public operator's result (once
per process); elsewhere the function returns None, the reason is logged once, and the public forms run.
tests/unit/test_private_ops.py checks both ways.
"""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Callable
from typing import Any

import torch

log = logging.getLogger(__name__)

#: the PyTorch versions (major, minor) the private operators were checked on, inclusive: from the oldest PyTorch
#: kvroute supports (pyproject.toml) to the one measured here
CHECKED = ((2, 4), (2, 13))


def torch_version(version: str | None = None) -> tuple[int, int]:
    """(major, minor) of ``version`` (default: this PyTorch's, e.g. "2.13.0+cpu" → (2, 13)); (0, 0) if unreadable."""
    m = re.match(r"(\d+)\.(\d+)", version if version is not None else torch.__version__)
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


def version_checked(version: str | None = None) -> bool:
    """Whether ``version`` (default: this PyTorch's) lies in :data:`CHECKED`."""
    return CHECKED[0] <= torch_version(version) <= CHECKED[1]


def _unchecked(what: str) -> None:
    log.info("%s: PyTorch %s is outside the versions its private operator was checked on (%d.%d–%d.%d); the public "
             "form runs", what, torch.__version__, *CHECKED[0], *CHECKED[1])


@functools.cache
def flash_attention_cpu() -> Callable[..., tuple[torch.Tensor, torch.Tensor]] | None:
    """``(query, key, value, attn_mask=, scale=) → (out, lse)``: PyTorch's fused CPU attention with each row's
    log-sum-exp, or None where this PyTorch has no such operator, is not a checked version, or its output differs
    from the public ``scaled_dot_product_attention`` on a probe."""
    if not version_checked():
        _unchecked("fused CPU attention")
        return None
    try:
        op: Any = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default
    except (AttributeError, RuntimeError):
        return None

    def call(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *, attn_mask: torch.Tensor | None,
             scale: float) -> tuple[torch.Tensor, torch.Tensor]:
        out, lse = op(query, key, value, 0.0, False, attn_mask=attn_mask, scale=scale)
        return out, lse

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, n, 8, generator=g) for n in (3, 5, 5))
    mask = torch.zeros(1, 1, 3, 5).masked_fill_(torch.tensor([True, False, False, True, False]), float("-inf"))
    try:
        out, lse = call(q, k, v, attn_mask=mask, scale=0.3)
        ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.3)
        s = (q @ k.transpose(-1, -2) * 0.3 + mask).logsumexp(-1)
        ok = torch.allclose(out, ref, atol=1e-5) and torch.allclose(lse.reshape(s.shape), s, atol=1e-5)
    except (RuntimeError, TypeError, NotImplementedError) as e:  # a changed signature
        log.info("fused CPU attention: the private operator failed its probe (%s); the public form runs", e)
        return None
    if not ok:
        log.info("fused CPU attention: the private operator's probe differs from the public one; the public form runs")
        return None
    return call


@functools.cache
def onednn_linear() -> Callable[[torch.Tensor, torch.Tensor, torch.Tensor | None], torch.Tensor] | None:
    """``(x, weight, bias) → x·weightᵀ + bias`` through oneDNN's matmul, or None where this PyTorch has no oneDNN
    linear on float32 CPU tensors, is not a checked version, or the probe's product is wrong."""
    if not torch.backends.mkldnn.is_available():
        return None
    if not version_checked():
        _unchecked("oneDNN linear")
        return None
    op: Any = getattr(torch.ops.mkldnn, "_linear_pointwise", None)
    if op is None:
        return None

    def call(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        out: torch.Tensor = op(x, weight, bias, "none", [], "")
        return out

    try:
        x, w, b = torch.ones(2, 3), torch.ones(4, 3), torch.zeros(4)
        ok = bool(torch.equal(call(x, w, b), torch.full((2, 4), 3.0)))
    except (RuntimeError, TypeError, NotImplementedError):  # pragma: no cover - builds without the op's CPU kernel
        return None
    return call if ok else None
