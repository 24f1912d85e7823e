from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from kvroute.errors import ConfigError, EngineError
from kvroute.presses.params import Param
from kvroute.presses.scorers.base import ScoreInputs, Scorer
from kvroute.presses.selection.base import (
    FULL,
    SELECTIONS,
    ScoreVariant,
    Selection,
    n_kept,
    scorer_press,
    topk_mask,
)


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


@SELECTIONS.add
@dataclass
class Chunk(Selection):
    """Top-k inside contiguous chunks, each scored on its own (kvpress ChunkPress / FINCH).

    The scorer runs separately on every chunk of ``chunk_length`` tokens (as kvpress's ChunkPress
    does), and each chunk keeps ``max(1, int(len · (1 − α)))`` entries, so the budget is spread
    evenly over the context. A last chunk too short for the scorer joins the previous one (see
    :func:`chunk_bounds`). ``rescore=false`` scores the whole context once and takes the top-k of
    those scores inside each chunk instead (kvpress's FinchPress with ``chunk_length``).
    """

    name: ClassVar[str] = "chunk"
    description: ClassVar[str] = ("Top-k inside contiguous chunks scored separately (kvpress ChunkPress); "
                                  "rescore=false: chunks of the whole-context scores (FinchPress's chunk_length).")
    chunk_length: int = 1024
    rescore: bool = True
    schema: ClassVar[dict[str, Param]] = {"chunk_length": Param(lo=1, why="tokens per chunk")}
    min_last: int = field(default=1, repr=False, compare=False)  # set by the press from its scorer

    @classmethod
    def parameters(cls) -> dict[str, object]:
        return {"chunk_length": 1024, "rescore": True}

    def __post_init__(self) -> None:
        if self.chunk_length < 1:
            raise ConfigError(f"chunk: chunk_length must be a positive integer, got {self.chunk_length}")

    def score_variant(self) -> ScoreVariant:
        return ScoreVariant("chunk", (self.chunk_length, self.min_last)) if self.rescore else FULL

    def fit(self, scorer: Scorer) -> None:
        self.min_last = scorer.min_tokens()  # a tail chunk shorter than the scorer can score joins the one before

    def _bounds(self, num_tokens: int) -> list[tuple[int, int]]:
        return chunk_bounds(num_tokens, self.chunk_length, self.min_last if self.rescore else 1)

    def score_layer(self, scorer: Scorer, x: ScoreInputs, ratio: float) -> torch.Tensor:
        """``[1, Hkv, T]``: the scorer on each chunk on its own (as kvpress's ChunkPress), concatenated."""
        if not self.rescore:
            return scorer.score(x, ratio)
        parts = []
        for i, j in self._bounds(x.keys.shape[2]):
            sl = slice(i, j)
            ev = None
            if x.evidence is not None:
                ev = x.evidence[(x.evidence >= i) & (x.evidence < j)] - i
            xi = ScoreInputs(x.module, x.layer_idx, x.hidden_states[:, sl], x.keys[:, :, sl], x.values[:, :, sl],
                             x.kwargs, x.attentions, ev, x.seed,
                             min(j - i, max(0, x.question_window - (x.keys.shape[2] - j))))
            parts.append(scorer.score(xi, ratio))
        return torch.cat(parts, dim=-1)

    def select(self, scores: torch.Tensor, ratio: float) -> torch.Tensor:
        L, Hkv, T = scores.shape
        n_kept(T, ratio)  # the whole-context budget must be positive
        parts = []
        for i, j in self._bounds(T):
            s = scores[:, :, i:j]
            k = max(1, int(s.shape[-1] * (1 - ratio)))  # kvpress's per-chunk rule (floor of 1 per chunk)
            parts.append(torch.cat([topk_mask(s[layer : layer + 1], k) for layer in range(L)]))
        return torch.cat(parts, dim=-1)

    def kvpress_counterpart(self, scorer: Scorer, ratio: float, question_window: int = 0) -> Any:
        from kvpress import ChunkPress, FinchPress

        if self.rescore:
            return ChunkPress(scorer_press(scorer, ratio, question_window, "ChunkPress"),
                              chunk_length=self.chunk_length)
        inner = scorer.kvpress_press(ratio, question_window)
        if isinstance(inner, FinchPress):  # the one kvpress press that chunks whole-context scores
            if not self.chunk_length > question_window / (1 - ratio):
                raise EngineError(f"kvpress's FinchPress needs chunk_length > window / (1 − ratio) = "
                                  f"{question_window / (1 - ratio):.1f} here (it asserts); kvroute has no such limit")
            inner.chunk_length = self.chunk_length
            return inner
        raise EngineError("chunk[rescore=false] has a kvpress counterpart only for finch (FinchPress's chunk_length)")
