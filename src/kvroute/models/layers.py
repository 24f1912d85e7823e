"""Where a causal LM keeps its parts: the decoder layers and the transformer under the LM head.

The lowest model-structure helpers, used by the engine's hooks and by scorers that run a forward of
their own (KVzip's replay, kvpress's per-layer presses); they import nothing of kvroute's.
"""

from __future__ import annotations

import functools
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


def scorer_rotary(model: nn.Module) -> Any:
    """The rotary embedding kvpress's scorers read as ``module.rotary_emb(x, position_ids)``, for every layer.

    kvpress's hook sets ``layer.self_attn.rotary_emb = language_model.rotary_emb`` on every layer it compresses, and
    its scorers (Expected Attention's averaged RoPE, CAP's anchor) rotate their query statistics with it. Gemma 3
    keeps one rotary module for two layer types (sliding layers: base 10k, global ones: 1M) whose forward needs
    ``layer_type`` (transformers 5.2), which kvpress never passes; on the transformers kvpress 0.5.5 runs Gemma 3 with
    (4.56-4.57) ``rotary_emb`` is the global layers' rotary and the sliding layers' is a separate ``rotary_emb_local``
    that kvpress never reads. So every layer, a compressed sliding layer of Gemma3ForCausalLM included, gets the
    global layers' rotary, as in kvpress (not the base its keys were rotated with). Other models: the model's rotary
    module itself."""
    rotary: Any = base_model(model).rotary_emb
    if not hasattr(rotary, "full_attention_inv_freq"):
        return rotary
    return functools.partial(rotary, layer_type="full_attention")


class DefaultLayerType(nn.Module):
    """A Gemma 3 rotary module whose calls without ``layer_type`` read ``layer_type`` (what kvpress's scorers, which
    pass none, need on the global layers it compresses); calls with one pass it on."""

    def __init__(self, inner: nn.Module, layer_type: str) -> None:
        super().__init__()
        self.inner = inner
        self.layer_type = layer_type

    def forward(self, x: Any, position_ids: Any, layer_type: str | None = None) -> Any:
        return self.inner(x, position_ids, layer_type or self.layer_type)
