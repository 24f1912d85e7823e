"""Temporary hooks on a model's attention layers, always removed in ``finally``."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from torch import nn
from torch.utils.hooks import RemovableHandle

from kvroute.models.layers import base_model, decoder_layers

__all__ = ["attention_hooks", "base_model", "decoder_layers"]


@contextlib.contextmanager
def attention_hooks(model: nn.Module, hook: Callable[..., Any],
                    q_proj_hook: Callable[..., Any] | None = None) -> Iterator[None]:
    """Register ``hook(module, args, kwargs, output)`` on every attention module; expose ``rotary_emb``.

    ``q_proj_hook(module, args, output)``, when given, is registered on each attention module's
    ``q_proj``, so the queries the model computed can be reused instead of recomputed.

    Some kvpress scorers read ``module.rotary_emb`` (kvpress sets it in its own context manager);
    it is attached here for the duration and detached afterwards, so no state is left on the model.
    """
    base = base_model(model)
    handles: list[RemovableHandle] = []
    attached: list[Any] = []  # attention modules given a temporary ``rotary_emb``
    try:
        for layer in decoder_layers(model):
            attn: Any = layer.self_attn  # read for its dynamic attributes (rotary_emb)
            if not hasattr(attn, "rotary_emb") and hasattr(base, "rotary_emb"):
                attn.rotary_emb = base.rotary_emb
                attached.append(attn)
            handles.append(attn.register_forward_hook(hook, with_kwargs=True))
            if q_proj_hook is not None:
                handles.append(attn.q_proj.register_forward_hook(q_proj_hook))
        yield
    finally:
        for h in handles:
            h.remove()
        for attn in attached:
            del attn.rotary_emb
