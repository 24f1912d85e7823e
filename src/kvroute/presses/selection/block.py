from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from kvroute.errors import ConfigError
from kvroute.presses.params import Param
from kvroute.presses.scorers.base import ScoreInputs, Scorer
from kvroute.presses.selection.base import SELECTIONS, ScoreVariant, Selection, n_kept, scorer_press


@SELECTIONS.add
@dataclass
class Block(Selection):
    """Block-wise iterative pruning (kvpress BlockPress, from KeyDiff's block prompt processing).

    The first ``n_kept`` tokens are kept; then block after block of ``block_size`` tokens is added and
    the scorer, run on the kept entries plus the new block only, decides which ``n_kept`` survive.
    Which entries survive therefore depends on the ratio: the prefill scores once per ratio. Scores
    handed to :meth:`select` are 1 for the survivors and 0 elsewhere.
    """

    name: ClassVar[str] = "block"
    description: ClassVar[str] = ("Iterative: add a block of tokens, rescore kept + block, keep the top n_kept "
                                  "(kvpress BlockPress); scored once per ratio.")
    block_size: int = 128
    schema: ClassVar[dict[str, Param]] = {"block_size": Param(lo=1, why="tokens added per step")}
    scores_per_ratio: ClassVar[bool] = True

    def __post_init__(self) -> None:
        if self.block_size < 1:
            raise ConfigError(f"block: block_size must be a positive integer, got {self.block_size}")

    def score_variant(self) -> ScoreVariant:
        return ScoreVariant("block", (self.block_size,))

    def score_layer(self, scorer: Scorer, x: ScoreInputs, ratio: float) -> torch.Tensor:
        """``[1, Hkv, T]``: 1 where an entry survives the blocks at ``ratio``, 0 elsewhere (kvpress's loop)."""
        bsz, Hkv, T, D = x.keys.shape
        block = min(self.block_size, T)
        k = n_kept(T, ratio)
        kept = torch.arange(k, device=x.keys.device).expand(bsz, Hkv, -1)  # [1, Hkv, k]
        # kvpress's reshaping of the hidden states per KV head: [1, Hkv, T, hidden / Hkv]
        states = x.hidden_states.view(bsz, T, Hkv, -1).transpose(1, 2)
        for i in range(k, T, block):
            idx = torch.cat([kept, torch.arange(i, min(i + block, T), device=x.keys.device).expand(bsz, Hkv, -1)],
                            dim=-1)
            sub_states = states.gather(2, idx.unsqueeze(-1).expand(-1, -1, -1, states.shape[-1]))
            sub_states = sub_states.transpose(1, 2).reshape(bsz, -1, x.hidden_states.shape[-1])
            gather = idx.unsqueeze(-1).expand(-1, -1, -1, D)
            xi = ScoreInputs(x.module, x.layer_idx, sub_states, x.keys.gather(2, gather), x.values.gather(2, gather),
                             x.kwargs, x.attentions, None, x.seed)
            kept = idx.gather(-1, scorer.score(xi, ratio).topk(k, dim=-1).indices)
        out = torch.zeros(bsz, Hkv, T, dtype=torch.float32, device=x.keys.device)
        return out.scatter_(-1, kept, 1.0)

    def select(self, scores: torch.Tensor, ratio: float) -> torch.Tensor:
        n_kept(scores.shape[-1], ratio)
        if ratio == 0:
            return torch.ones_like(scores, dtype=torch.bool)
        return scores > 0.5

    def check_scorer(self, scorer: Scorer) -> None:
        super().check_scorer(scorer)
        if scorer.needs_attentions:
            raise ConfigError(f"block rescores subsets of the context; {scorer.name} reads the prefill's attention "
                              "map, which has no such subsets (kvpress's BlockPress refuses it too)")
        if scorer.needs_evidence:
            raise ConfigError(f"block rescores a different subset of the context in every head; {scorer.name} places "
                              "the evidence by position and cannot follow them: use it with per_head, adakv or chunk")

    def kvpress_counterpart(self, scorer: Scorer, ratio: float, question_window: int = 0) -> Any:
        from kvpress import BlockPress

        return BlockPress(scorer_press(scorer, ratio, question_window, "BlockPress"), block_size=self.block_size)
