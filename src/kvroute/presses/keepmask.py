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

    Shape ``[L, Hkv, T]`` (bool). Query heads of a GQA group share their KV head's row. ``layers``: the layers the
    press compresses (None: every layer). The others keep their whole cache (all True), as kvpress leaves Gemma 3's
    sliding-window layers; the keep-mask metrics (kept fraction, GER, reachability) read :attr:`compressed`, those
    layers only, so a ratio means what it means on the layers it applies to.
    """

    mask: torch.Tensor  # bool [L, Hkv, T]
    press: str = "none"
    ratio: float = 0.0
    layers: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if self.mask.dtype != torch.bool or self.mask.dim() != 3:
            raise ValueError("KeepMask needs a bool [L, Hkv, T] tensor, "
                             f"got {self.mask.dtype} {tuple(self.mask.shape)}")
        if self.layers is not None:
            L = self.mask.shape[0]
            if not self.layers or any(not 0 <= i < L for i in self.layers) or list(self.layers) != sorted(
                    set(self.layers)):
                raise ValueError(f"KeepMask layers must be increasing indices into its {L} layers, got {self.layers}")
            if not bool(self.mask[self.left_whole].all()):
                raise ValueError(f"KeepMask evicts entries of layers {self.left_whole}, which it leaves whole")

    @property
    def left_whole(self) -> list[int]:
        """The layers the press does not compress (their rows are all True)."""
        keep = set(range(self.mask.shape[0])) if self.layers is None else set(self.layers)
        return [i for i in range(self.mask.shape[0]) if i not in keep]

    @property
    def compressed(self) -> torch.Tensor:
        """``[L', Hkv, T]``: the rows of the compressed layers (:attr:`layers`; all of :attr:`mask` where None)."""
        if self.layers is None:
            return self.mask
        return self.mask[list(self.layers)]

    def replaced(self, mask: torch.Tensor) -> KeepMask:
        """A KeepMask of the same press, ratio and compressed layers holding ``mask`` (a restoration's: entries only
        ever added, so the layers left whole stay whole)."""
        return KeepMask(mask, self.press, self.ratio, self.layers)

    def with_layers(self, layers: tuple[int, ...] | None) -> KeepMask:
        """This mask with only ``layers`` compressed: every other layer's rows set to True (kept whole)."""
        if layers is None or len(layers) == self.mask.shape[0]:
            return KeepMask(self.mask, self.press, self.ratio) if self.layers is not None else self
        mask = torch.ones_like(self.mask)
        mask[list(layers)] = self.mask[list(layers)]
        return KeepMask(mask, self.press, self.ratio, tuple(layers))

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
        """Realised share of context entries kept over all (compressed layer, KV head)."""
        return float(self.compressed.float().mean())

    def for_query_heads(self, group_size: int) -> torch.Tensor:
        """``[L, H, T]``: each KV head's row repeated for the ``group_size`` query heads of its group."""
        # [L, Hkv, T] -> [L, Hkv * G, T]; query head h uses KV head h // G (transformers' repeat_kv order)
        return self.mask.repeat_interleave(group_size, dim=1)
