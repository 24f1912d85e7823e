"""Calling the masked attention function directly, as a layer would (one layer, index 0), for the unit tests."""

from types import SimpleNamespace

from kvroute.engine.attention import MaskedContext, _masked_attention_forward, _state


def masked_forward(ctx: MaskedContext, query, key, value):
    """The attention output ``[B, q, H, D]`` of layer 0 under ``ctx``."""
    _state.ctx = ctx
    try:
        return _masked_attention_forward(SimpleNamespace(layer_idx=0), query, key, value, None)[0]
    finally:
        _state.ctx = None
