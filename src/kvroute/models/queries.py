"""A layer's queries recomputed from its transformers attention module.

The prefill's N×N attention map (observed_attention) and the evidence rollout both need the
queries the layer used; transformers does not return them, so they are rebuilt here exactly as
its attention does: the query projection (``q_proj``, or the query columns of Phi-3's fused
``qkv_proj``, as kvpress's ``get_prerope_query_states`` reads them), optional QK-norm (Qwen3,
Gemma 3), RoPE (over the first ``cos.shape[-1]`` dimensions of a head where the rotary is partial).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


def query_projection(module: Any) -> nn.Module | None:
    """The linear layer whose output holds attention ``module``'s queries: ``q_proj``, or a fused ``qkv_proj``
    (queries first, as Phi-3 lays them out); None where it has neither."""
    proj = getattr(module, "q_proj", None)
    if proj is None:
        proj = getattr(module, "qkv_proj", None)
    return proj if callable(proj) else None  # a module, or any callable standing in for one


def require_query_projection(module: Any) -> nn.Module:
    """:func:`query_projection`, raising :class:`TypeError` where ``module`` has none."""
    proj = query_projection(module)
    if proj is None:
        raise TypeError(f"{type(module).__name__} has neither a q_proj nor a fused qkv_proj")
    return proj


def query_columns(module: Any, projected: torch.Tensor) -> torch.Tensor:
    """The query part ``[B, T, H·D]`` of the query projection's output (all of a ``q_proj``'s; the first H·D columns
    of a fused ``qkv_proj``'s)."""
    heads = module.config.num_attention_heads if hasattr(module, "config") else None
    width = heads * module.head_dim if heads else projected.shape[-1]
    return projected if projected.shape[-1] == width else projected[..., :width]


def rotated_queries(module: Any, hidden_states: torch.Tensor,
                    position_embeddings: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """Post-RoPE queries ``[B, H, T, D]`` of attention ``module`` for ``hidden_states`` ``[B, T, hidden]``.

    ``module`` is a transformers attention module (read for ``head_dim``, its query projection
    (:func:`query_projection`) and, when it has one, ``q_norm``); ``position_embeddings`` is the layer's
    ``(cos, sin)``, each ``[B, T, R]`` (R: the rotary dimensions, D unless partial).
    """
    return rotate_queries(module, require_query_projection(module)(hidden_states), position_embeddings)


def rotate_queries(module: Any, projected: torch.Tensor,
                   position_embeddings: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """Post-RoPE queries ``[B, H, T, D]`` from the query projection's output (``[B, T, H·D]``, or a fused qkv
    projection's ``[B, T, (H + 2·Hkv)·D]``): QK-norm, then RoPE (partial where ``cos`` is narrower than a head)."""
    from transformers.models.llama.modeling_llama import rotate_half  # (transformers: imported on first use)

    projected = query_columns(module, projected)
    B, T, _ = projected.shape
    q = projected.view(B, T, -1, module.head_dim).transpose(1, 2)  # [B, H, T, D]
    if hasattr(module, "q_norm"):  # Qwen3 / Gemma3 QK-norm
        q = module.q_norm(q)
    cos, sin = position_embeddings
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    rot = cos.shape[-1]
    if rot == q.shape[-1]:
        return q * cos + rotate_half(q) * sin
    q_rot, q_pass = q[..., :rot], q[..., rot:]  # partial rotary (Phi-3's partial_rotary_factor)
    return torch.cat([q_rot * cos + rotate_half(q_rot) * sin, q_pass], dim=-1)
