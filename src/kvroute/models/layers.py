"""Where a causal LM keeps its parts: the decoder layers and the transformer under the LM head.

The lowest model-structure helpers, used by the engine's hooks and by scorers that run a forward of
their own (KVzip's replay, kvpress's per-layer presses); they import nothing of kvroute's.
"""

from __future__ import annotations

from typing import Any

from torch import nn


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The decoder layers of a causal LM (``model.model.layers`` or a multimodal language model's)."""
    layers = getattr(base_model(model), "layers", None)
    if layers is None:
        raise TypeError(f"{type(model).__name__} has no decoder layers where kvroute looks (model.model.layers)")
    return list(layers)


def base_model(model: nn.Module) -> nn.Module:
    """The transformer without its LM head (what kvpress prefills with)."""
    base: Any = model.model if hasattr(model, "model") else model
    return getattr(base, "language_model", base)
