from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from kvroute.errors import ConfigError
from kvroute.presses.params import Param
from kvroute.presses.scorers.base import Scorer
from kvroute.presses.selection.base import SELECTIONS, Selection, n_kept, scorer_press

_EPS = 1e-8  # kvpress's EPSILON in the entropy


def _entropy(p_scores: torch.Tensor, n: int) -> torch.Tensor:
    """Normalised entropy (in [0, 1]) of each row of non-negative token scores ``[..., n]``."""
    p = p_scores / (p_scores.sum(dim=-1, keepdim=True) + _EPS)
    h = -(p * (p + _EPS).log()).sum(dim=-1)
    return (h / math.log(n)).clamp(0.0, 1.0)


def entropy_chunkkv_layer(scores: torch.Tensor, chunk_length: int, low_length: int, ratio: float) -> torch.Tensor:
    """One layer ``[1, Hkv, T]`` → keep mask, as kvpress's ``EntropyGatedChunkKVPress.compress``.

    Chunks ranked by mean head-summed score are kept greedily; a chunk scoring at or above the
    median with entropy below the median keeps only its top ``low_length`` tokens; the budget left
    then goes to the best remaining tokens, so exactly ``max(1, int(T · (1 − α)))`` tokens are kept,
    the same in every head.
    """
    _, Hkv, T = scores.shape
    s = scores.sum(dim=1)[0].float()  # [T]
    budget = max(1, int(T * (1 - ratio)))
    n_full, rest = divmod(T, chunk_length)
    bounds = [(i * chunk_length, min((i + 1) * chunk_length, T)) for i in range(math.ceil(T / chunk_length))]
    tok = s[: n_full * chunk_length].view(n_full, chunk_length)
    chunk_scores = tok.mean(dim=1)
    entropy = _entropy(tok - tok.amin(dim=1, keepdim=True).clamp(max=0.0), chunk_length)
    if rest > 0:  # the partial last chunk on its own
        tail = s[n_full * chunk_length:]
        chunk_scores = torch.cat([chunk_scores, tail.mean().unsqueeze(0)])
        if rest == 1:
            tail_h = torch.zeros(1, device=s.device)
        else:
            if (tail < 0).any():
                tail = tail - tail.min().clamp(max=0.0)
            tail_h = _entropy(tail, rest).unsqueeze(0)
        entropy = torch.cat([entropy, tail_h])
    high = (chunk_scores >= chunk_scores.median()).tolist()
    spiky = (entropy < entropy.median()).tolist()
    keep = torch.zeros(T, dtype=torch.bool, device=s.device)
    for c in torch.argsort(chunk_scores, descending=True).tolist():
        if budget <= 0:
            break
        start, end = bounds[c]
        k = min(end - start, budget)
        if high[c] and spiky[c]:
            k = min(k, low_length)
        if k == end - start:
            keep[start:end] = True
        else:
            keep[torch.topk(s[start:end], k).indices + start] = True
        budget -= k
    if budget > 0:  # top up with the best tokens not kept yet
        left = (~keep).nonzero(as_tuple=False).squeeze(-1)
        if left.numel() > 0:
            keep[left[torch.topk(s[left], min(budget, left.numel())).indices]] = True
    return keep.expand(1, Hkv, T).clone()


@SELECTIONS.add
@dataclass
class EntropyChunkKV(Selection):
    """ChunkKV gated by entropy (kvpress EntropyGatedChunkKVPress): spiky important chunks keep only their best tokens.

    Chunks of ``chunk_length`` tokens in order of mean score; an important (score ≥ median) but spiky
    (entropy < median) chunk keeps only ``low_entropy_chunk_length`` tokens and the freed budget goes to
    further chunks; exactly ``max(1, int(T · (1 − α)))`` tokens are kept, the same in every head.
    """

    name: ClassVar[str] = "entropy_chunkkv"
    description: ClassVar[str] = ("ChunkKV whose important but spiky chunks keep only their best tokens "
                                  "(kvpress EntropyGatedChunkKVPress).")
    chunk_length: int = 10
    low_entropy_chunk_length: int = 4
    schema: ClassVar[dict[str, Param]] = {"chunk_length": Param(lo=2, why="tokens per chunk"),
                                          "low_entropy_chunk_length": Param(lo=1, why="tokens a spiky chunk keeps")}

    def __post_init__(self) -> None:
        if not self.chunk_length > self.low_entropy_chunk_length >= 1:
            raise ConfigError(f"entropy_chunkkv: needs chunk_length > low_entropy_chunk_length >= 1, got "
                              f"{self.chunk_length} and {self.low_entropy_chunk_length}")

    def select(self, scores: torch.Tensor, ratio: float) -> torch.Tensor:
        L, Hkv, T = scores.shape
        n_kept(T, ratio)
        if ratio == 0:
            return torch.ones_like(scores, dtype=torch.bool)
        return torch.cat([entropy_chunkkv_layer(scores[layer : layer + 1], self.chunk_length,
                                                self.low_entropy_chunk_length, ratio) for layer in range(L)])

    def kvpress_counterpart(self, scorer: Scorer, ratio: float, question_window: int = 0) -> Any:
        from kvpress import EntropyGatedChunkKVPress

        return EntropyGatedChunkKVPress(scorer_press(scorer, ratio, question_window, "EntropyGatedChunkKVPress"),
                                        chunk_length=self.chunk_length,
                                        low_entropy_chunk_length=self.low_entropy_chunk_length)
