from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import ClassVar

import torch

from kvroute.errors import ConfigError
from kvroute.presses.params import Param
from kvroute.presses.selection.base import SELECTIONS, Selection, n_kept, topk_mask


def chunk_bounds(num_tokens: int, chunk_length: int, min_last: int = 1) -> list[tuple[int, int]]:
    """``[start, end)`` of each chunk; a last chunk shorter than ``min_last`` joins the previous one.

    kvpress's ChunkPress asserts when the last chunk is too short for its scorer (e.g. SnapKV's
    window, Expected Attention's sinks); kvroute merges it into the previous chunk instead. When every
    chunk is long enough, the chunks are exactly kvpress's.
    """
    bounds = [(i, min(i + chunk_length, num_tokens)) for i in range(0, num_tokens, chunk_length)]
    if len(bounds) > 1 and bounds[-1][1] - bounds[-1][0] < min_last:
        last = bounds.pop()
        bounds[-1] = (bounds[-1][0], last[1])
    return bounds


@SELECTIONS.register("chunk")
@dataclass
class Chunk(Selection):
    """Top-k inside contiguous chunks, each scored on its own (kvpress ChunkPress / FINCH).

    The scorer runs separately on every chunk of ``chunk_length`` tokens (as kvpress does), and
    each chunk keeps ``max(1, int(len · (1 − α)))`` entries, so the budget is spread evenly over
    the context. A last chunk too short for the scorer joins the previous one (see :func:`chunk_bounds`).
    """

    name: ClassVar[str] = "chunk"
    description: ClassVar[str] = "Top-k inside contiguous chunks scored separately (kvpress ChunkPress / FINCH)."
    chunk_length: int = 1024
    schema: ClassVar[dict[str, Param]] = {"chunk_length": Param(lo=1, why="tokens per chunk")}
    min_last: int = field(default=1, repr=False, compare=False)  # set by the press from its scorer

    @classmethod
    def parameters(cls) -> dict[str, object]:
        return {"chunk_length": 1024}

    def __post_init__(self) -> None:
        if self.chunk_length < 1:
            raise ConfigError(f"chunk: chunk_length must be a positive integer, got {self.chunk_length}")

    def score_variant(self) -> Hashable:
        return ("chunk", self.chunk_length, self.min_last)

    def select(self, scores: torch.Tensor, ratio: float) -> torch.Tensor:
        L, Hkv, T = scores.shape
        n_kept(T, ratio)  # the whole-context budget must be positive
        parts = []
        for i, j in chunk_bounds(T, self.chunk_length, self.min_last):
            s = scores[:, :, i:j]
            k = max(1, int(s.shape[-1] * (1 - ratio)))  # kvpress's per-chunk rule (floor of 1 per chunk)
            parts.append(torch.cat([topk_mask(s[layer : layer + 1], k) for layer in range(L)]))
        return torch.cat(parts, dim=-1)
