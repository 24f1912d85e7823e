"""KeepMask: which context KV entries survive, per (layer, KV head, token).

The KeepMask is the hand-off between selection and everything downstream: the engine decodes
under it, and the routing metrics read it directly, so nothing has to reverse-engineer which
tokens a press dropped.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True, eq=False)
class KeepMask:
    """``mask[ℓ, h, t]`` is True when context token t is kept for KV head h of layer ℓ.

    Shape ``[L, Hkv, T]`` (bool). Query heads of a GQA group share their KV head's row.
    """

    mask: torch.Tensor  # bool [L, Hkv, T]
    press: str = "none"
    ratio: float = 0.0

    def __post_init__(self) -> None:
        if self.mask.dtype != torch.bool or self.mask.dim() != 3:
            raise ValueError("KeepMask needs a bool [L, Hkv, T] tensor, "
                             f"got {self.mask.dtype} {tuple(self.mask.shape)}")

    @classmethod
    def full(cls, num_layers: int, num_kv_heads: int, num_tokens: int, device: torch.device | str = "cpu") -> KeepMask:
        """Keep everything (ratio 0, the uncompressed cache)."""
        return cls(torch.ones(num_layers, num_kv_heads, num_tokens, dtype=torch.bool, device=device), "none", 0.0)

    @property
    def shape(self) -> tuple[int, int, int]:
        L, Hkv, T = self.mask.shape
        return L, Hkv, T

    @property
    def kept_per_head(self) -> torch.Tensor:
        """Number of kept context entries per (layer, KV head): long ``[L, Hkv]``."""
        return self.mask.sum(-1)

    @property
    def kept_fraction(self) -> float:
        """Realised share of context entries kept over all (layer, KV head)."""
        return float(self.mask.float().mean())

    def for_query_heads(self, group_size: int) -> torch.Tensor:
        """``[L, H, T]``: each KV head's row repeated for the ``group_size`` query heads of its group."""
        # [L, Hkv, T] -> [L, Hkv * G, T]; query head h uses KV head h // G (transformers' repeat_kv order)
        return self.mask.repeat_interleave(group_size, dim=1)
