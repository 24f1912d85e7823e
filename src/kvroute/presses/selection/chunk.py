from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from typing import ClassVar

import torch

from kvroute.errors import ConfigError
from kvroute.presses.selection.base import SELECTIONS, Selection, n_kept, topk_mask


@SELECTIONS.register("chunk")
@dataclass
class Chunk(Selection):
    """Top-k inside contiguous chunks, each scored on its own (kvpress ChunkPress / FINCH).

    The scorer runs separately on every chunk of ``chunk_length`` tokens (as kvpress does), and
    each chunk keeps ``max(1, int(len · (1 − α)))`` entries, so the budget is spread evenly over
    the context.
    """

    name: ClassVar[str] = "chunk"
    description: ClassVar[str] = "Top-k inside contiguous chunks scored separately (kvpress ChunkPress / FINCH)."
    chunk_length: int = 1024

    def __post_init__(self) -> None:
        if self.chunk_length < 1:
            raise ConfigError(f"chunk: chunk_length must be a positive integer, got {self.chunk_length}")

    def score_variant(self) -> Hashable:
        return ("chunk", self.chunk_length)

    def select(self, scores: torch.Tensor, ratio: float) -> torch.Tensor:
        L, Hkv, T = scores.shape
        n_kept(T, ratio)  # the whole-context budget must be positive
        parts = []
        for i in range(0, T, self.chunk_length):
            s = scores[:, :, i : i + self.chunk_length]
            k = max(1, int(s.shape[-1] * (1 - ratio)))  # kvpress's per-chunk rule (floor of 1 per chunk)
            parts.append(torch.cat([topk_mask(s[layer : layer + 1], k) for layer in range(L)]))
        return torch.cat(parts, dim=-1)
