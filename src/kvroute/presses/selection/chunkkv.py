from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from kvroute.errors import ConfigError
from kvroute.presses.params import Param
from kvroute.presses.scorers.base import Scorer
from kvroute.presses.selection.base import SELECTIONS, Selection, n_kept, scorer_press, topk_mask


def chunkkv_layer(scores: torch.Tensor, chunk_length: int, ratio: float) -> torch.Tensor:
    """One layer ``[1, Hkv, T]`` → keep mask, as kvpress's ``ChunkKVPress.compress``.

    Chunk score = the scores summed over KV heads, averaged over the chunk's tokens; the top
    ``max(1, int(n_chunks · (1 − α)))`` chunks are kept whole, in every head. A context shorter than
    one chunk falls back to per-head top-k, as kvpress does.
    """
    _, Hkv, T = scores.shape
    n_full, rest = divmod(T, chunk_length)
    if n_full == 0:
        return topk_mask(scores, max(1, int(T * (1 - ratio))))
    chunk_scores = scores[..., : n_full * chunk_length].sum(dim=1).view(-1, n_full, chunk_length).mean(dim=-1)
    if rest > 0:  # the partial last chunk is a chunk of its own
        chunk_scores = torch.cat([chunk_scores, scores[..., -rest:].sum(dim=1).mean(dim=-1, keepdim=True)], dim=-1)
    n_chunks = max(1, int((n_full + (rest > 0)) * (1 - ratio)))
    keep = torch.zeros(T, dtype=torch.bool, device=scores.device)
    for c in chunk_scores.topk(n_chunks, dim=-1).indices[0].tolist():
        keep[c * chunk_length : min((c + 1) * chunk_length, T)] = True
    return keep.expand(1, Hkv, T).clone()


@SELECTIONS.add
@dataclass
class ChunkKV(Selection):
    """Whole chunks of ``chunk_length`` tokens, the same in every head (kvpress ChunkKVPress, "semantic chunks").

    Chunks are ranked by their mean score summed over KV heads; ``max(1, int(n_chunks · (1 − α)))`` of
    them are kept whole, so the realised share of kept tokens is the ratio rounded to whole chunks.
    """

    name: ClassVar[str] = "chunkkv"
    description: ClassVar[str] = ("Keep whole chunks of tokens, the same in every head, "
                                  "by mean score (kvpress ChunkKVPress).")
    chunk_length: int = 20
    schema: ClassVar[dict[str, Param]] = {"chunk_length": Param(lo=1, why="tokens per chunk")}

    def __post_init__(self) -> None:
        if self.chunk_length < 1:
            raise ConfigError(f"chunkkv: chunk_length must be a positive integer, got {self.chunk_length}")

    def select(self, scores: torch.Tensor, ratio: float) -> torch.Tensor:
        L, Hkv, T = scores.shape
        n_kept(T, ratio)  # the whole-context budget must be positive
        if ratio == 0:
            return torch.ones_like(scores, dtype=torch.bool)
        return torch.cat([chunkkv_layer(scores[layer : layer + 1], self.chunk_length, ratio) for layer in range(L)])

    def kvpress_counterpart(self, scorer: Scorer, ratio: float, question_window: int = 0) -> Any:
        from kvpress import ChunkKVPress

        return ChunkKVPress(scorer_press(scorer, ratio, question_window, "ChunkKVPress"),
                            chunk_length=self.chunk_length)
