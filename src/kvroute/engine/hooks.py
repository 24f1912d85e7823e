"""Temporary hooks on a model's attention layers, always removed in ``finally``."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from kvroute.models.layers import base_model, decoder_layers, scorer_rotary
from kvroute.models.queries import query_projection

__all__ = ["REUSE_ROWS", "attention_hooks", "base_model", "decoder_layers", "RowReuse"]

_NONE = object()  # an attribute that was not there

#: the fewest rows a call must take for :class:`RowReuse` to answer it from the forward's product
REUSE_ROWS = 256


@contextlib.contextmanager
def attention_hooks(model: nn.Module, hook: Callable[..., Any],
                    q_proj_hook: Callable[..., Any] | None = None) -> Iterator[None]:
    """Register ``hook(module, args, kwargs, output)`` on every attention module; expose ``rotary_emb``.

    ``q_proj_hook(module, args, output)``, when given, is registered on each attention module's query
    projection (``q_proj``, or Phi-3's fused ``qkv_proj``: :func:`kvroute.models.queries.query_projection`), so
    the queries the model computed can be reused instead of recomputed.

    Some kvpress scorers read ``module.rotary_emb`` (kvpress sets it in its own context manager, and leaves it
    there); the rotary kvpress gives them (:func:`~kvroute.models.layers.scorer_rotary`) is attached here for the
    duration, over whatever an earlier kvpress run left, which is put back afterwards: kvroute's scores never depend
    on what ran on the model before.
    """
    base = base_model(model)
    handles: list[RemovableHandle] = []
    attached: list[tuple[Any, Any]] = []  # (attention module, its own ``rotary_emb`` before, or _NONE)
    try:
        rotary = scorer_rotary(model) if hasattr(base, "rotary_emb") else None
        for layer in decoder_layers(model):
            attn: Any = layer.self_attn  # read for its dynamic attributes (rotary_emb)
            if rotary is not None:
                before = getattr(attn, "rotary_emb", _NONE)
                if before is not _NONE:  # (a module kvpress assigned is a child module: deleted, then replaced)
                    delattr(attn, "rotary_emb")
                attached.append((attn, before))
                attn.rotary_emb = rotary
            handles.append(attn.register_forward_hook(hook, with_kwargs=True))
            proj = query_projection(attn)
            if q_proj_hook is not None and isinstance(proj, nn.Module):  # (a stand-in callable has no hooks)
                handles.append(proj.register_forward_hook(q_proj_hook))
        yield
    finally:
        for h in handles:
            h.remove()
        for attn, before in attached:
            delattr(attn, "rotary_emb")
            if before is not _NONE:
                attn.rotary_emb = before


def _rows_of(x: torch.Tensor, base: torch.Tensor) -> slice | None:
    """``slice(a, b)`` where ``x`` is rows [a, b) of ``base`` along dim -2 (a view of the same memory, laid out the
    same way, as ``base[:, a:b]``), else None."""
    if (x.dtype != base.dtype or x.device != base.device or x.dim() != base.dim() or x.shape[:-2] != base.shape[:-2]
            or x.shape[-1] != base.shape[-1] or x.stride() != base.stride()
            or x.untyped_storage().data_ptr() != base.untyped_storage().data_ptr()):
        return None
    step, delta = base.stride(-2), x.storage_offset() - base.storage_offset()
    if step <= 0 or delta % step:
        return None
    a = delta // step
    return slice(a, a + x.shape[-2]) if 0 <= a and a + x.shape[-2] <= base.shape[-2] else None


class RowReuse:
    """Answers a linear layer's calls on rows of its forward's input from the forward's product, where that gives the
    same numbers bit for bit.

    For the scorers that recompute a layer's queries from its input (kvpress's ``get_prerope_query_states``, e.g.
    ExpectedAttention's ``q_proj`` over all but the sink tokens: at 7,800 tokens on SmolLM2 about half its scoring
    time). Whether the rows of a product come out the same when fewer rows are multiplied beside them is the BLAS's
    choice (MKL: the same from 16 rows on at SmolLM2's query width; not always at larger inner sizes with two
    threads): so the first call of each shape is multiplied and compared with the forward's rows, and its shape is
    answered from them for the rest of the prefill only where all were equal (the layers share their shapes, so they
    share the BLAS's path). Calls of fewer than ``min_rows`` rows are multiplied: reuse would save nothing there.
    """

    def __init__(self, min_rows: int = REUSE_ROWS) -> None:
        self.min_rows = min_rows
        self.equal: dict[tuple[int, ...], bool] = {}  # a call's shape -> whether its product equalled the forward's

    @contextlib.contextmanager
    def rows(self, linear: nn.Module, inputs: torch.Tensor, outputs: torch.Tensor) -> Iterator[None]:
        """Within the block, ``linear`` called on rows [a, b) of ``inputs`` (a view into them) returns rows [a, b) of
        ``outputs`` (its product of ``inputs``) where :class:`RowReuse` has seen that equal; anything else is
        multiplied as usual."""
        own = vars(linear).get("forward")  # a forward already set on the instance (restored afterwards)
        multiply = linear.forward

        def forward(x: torch.Tensor) -> torch.Tensor:
            rows = _rows_of(x, inputs) if x.dim() >= 2 and x.shape[-2] >= self.min_rows else None
            if rows is None:
                return multiply(x)
            shape = tuple(x.shape)
            if shape not in self.equal:
                y = multiply(x)
                self.equal[shape] = torch.equal(y, outputs[..., rows, :])
                return y
            # a tensor of its own, as a product is
            return outputs[..., rows, :].clone() if self.equal[shape] else multiply(x)

        linear.forward = forward  # type: ignore[method-assign]  # on the instance: undone below
        try:
            yield
        finally:
            if own is None:
                vars(linear).pop("forward", None)
            else:
                linear.forward = own  # type: ignore[method-assign]
