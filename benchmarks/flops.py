"""Forward FLOPs of a grid of cells: kvroute's one prefill + masked cells vs kvpress's prefill per cell.

The ceiling of kvroute's speedup over a loop of kvpress pipeline calls, counted from the model's
shape (not measured): a forward costs 2·P FLOPs per token for the decoder layers' P parameters, plus
4·H·D per layer for every (query, visible key) pair of attention (Q·Kᵀ and the weighted sum of V),
plus 2·hidden·V_vocab per position whose logits are computed.

- kvpress, per cell: prefill the context (T tokens, causal: T(T+1)/2 pairs), then the question and the
  answer over the pruned cache: each of their q = Q + a tokens sees the kept (1 − r)·T entries and the
  suffix before it.
- kvroute, per instance: one prefill of the context; per cell the same question and answer tokens,
  their attention counted over the kept entries only (what a masked engine that skips masked entries
  pays: kvroute's question forward gathers the kept entries, its decode steps still multiply all T keys;
  `ratio to ceiling` shows what that and everything else costs).

Logits: both sides compute them for the question's last token and each generated token.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Shape:
    """What the FLOP count reads from a model."""

    layer_params: int  # parameters of the decoder layers (all of them)
    layers: int
    heads: int  # query heads
    head_dim: int
    hidden: int
    vocab: int

    @classmethod
    def of(cls, model) -> Shape:  # noqa: ANN001 - a transformers causal LM
        config = getattr(model.config, "text_config", model.config)
        layers = model.model.layers
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        return cls(sum(p.numel() for p in layers.parameters()), len(layers), config.num_attention_heads, head_dim,
                   config.hidden_size, config.vocab_size)


def _pairs_causal(n: int) -> int:
    return n * (n + 1) // 2


def prefill_flops(s: Shape, T: int) -> float:
    return 2 * s.layer_params * T + 4 * s.heads * s.head_dim * s.layers * _pairs_causal(T)


def replay_flops(s: Shape, T: int, passes: Sequence[tuple[int, int, int]], n_sink: int) -> float:
    """KVzip's replay of a prefilled context of ``T`` tokens: per pass (``q`` replay tokens, ``start``, ``end`` of the
    context chunk it reconstructs) a forward of its q tokens through the decoder layers over the T context entries
    and themselves (the base model: no logits), and kvpress's scoring in its attention hook
    (``_compute_cross_attention``): the queries projected again (hidden × H·D per token and layer) and their product
    Q·Kᵀ against the first ``n_sink`` entries, the chunk and the q tokens (half of a pair's 4·H·D)."""
    total = 0.0
    for q, start, end in passes:
        scored = min(n_sink, start) + (end - start) + q
        total += (2 * s.layer_params * q + 4 * s.heads * s.head_dim * s.layers * (q * T + _pairs_causal(q))
                  + 2 * s.layers * q * s.heads * s.head_dim * (s.hidden + scored))
    return total


def cell_flops(s: Shape, kept: int, Q: int, answer: int) -> float:
    """The question and answer tokens of one cell over ``kept`` context entries (logits at the last
    question token and each generated one; the last generated token is not fed back)."""
    q = Q + max(answer - 1, 0)
    pairs = q * kept + _pairs_causal(q)
    return 2 * s.layer_params * q + 4 * s.heads * s.head_dim * s.layers * pairs + 2 * s.hidden * s.vocab * (1 + answer)


@dataclass(frozen=True)
class CellWork:
    ratio: float
    answer_tokens: int  # tokens generated (EOS included when there was one)


def kept_entries(T: int, ratio: float) -> int:
    return int(T * (1 - ratio))  # as kvpress's ScorerPress rounds n_kept


def grid_flops(s: Shape, T: int, Q: int, cells: Sequence[CellWork]) -> tuple[float, float]:
    """(kvroute, kvpress) FLOPs of one instance's grid."""
    cell = [cell_flops(s, kept_entries(T, c.ratio), Q, c.answer_tokens) for c in cells]
    return prefill_flops(s, T) + sum(cell), len(cells) * prefill_flops(s, T) + sum(cell)


def ceiling(s: Shape, instances: Sequence[tuple[int, int, Sequence[CellWork]]]) -> float:
    """kvpress FLOPs over kvroute FLOPs for ``instances`` of (T, Q, cells): the speedup a perfect masked engine
    would reach by counting alone."""
    ours = theirs = 0.0
    for T, Q, cells in instances:
        a, b = grid_flops(s, T, Q, cells)
        ours, theirs = ours + a, theirs + b
    return theirs / ours
