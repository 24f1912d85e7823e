"""A layer's queries recomputed from its transformers attention module.

The prefill's N×N attention map (observed_attention) and the evidence rollout both need the
queries the layer used; transformers does not return them, so they are rebuilt here exactly as
its Llama-family attention does: ``q_proj``, optional QK-norm, RoPE.
"""

from __future__ import annotations

from typing import Any

import torch


def rotated_queries(module: Any, hidden_states: torch.Tensor,
                    position_embeddings: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """Post-RoPE queries ``[B, H, T, D]`` of attention ``module`` for ``hidden_states`` ``[B, T, hidden]``.

    ``module`` is a transformers attention module (read for ``head_dim``, ``q_proj`` and, when it
    has one, ``q_norm``); ``position_embeddings`` is the layer's ``(cos, sin)``, each ``[B, T, D]``.
    """
    return rotate_queries(module, module.q_proj(hidden_states), position_embeddings)


def rotate_queries(module: Any, projected: torch.Tensor,
                   position_embeddings: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """Post-RoPE queries ``[B, H, T, D]`` from the ``q_proj`` output ``[B, T, H·D]`` (QK-norm, then RoPE)."""
    from transformers.models.llama.modeling_llama import rotate_half  # (transformers: imported on first use)

    B, T, _ = projected.shape
    q = projected.view(B, T, -1, module.head_dim).transpose(1, 2)  # [B, H, T, D]
    if hasattr(module, "q_norm"):  # Qwen3 / Gemma3 QK-norm
        q = module.q_norm(q)
    cos, sin = position_embeddings
    return q * cos.unsqueeze(1) + rotate_half(q) * sin.unsqueeze(1)
