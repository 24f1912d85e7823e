"""Serving constraints: transformations of a press's selection that a paged, head-uniform server imposes.

A press may end in constraints, ``scorer+selection+constraint[...]+...`` (``snapkv+paged[block=16]+uniform``,
``expected_attention+adakv+paged[block=64]``; without a selection, ``per_head`` or the scorer's default):

- ``paged[block=B,agg=mean|max,partial=true]``: keep or drop whole blocks of ``B`` consecutive context
  tokens (a server's pages), per (layer, KV head) unless combined with ``uniform``. A block's score is the
  mean (or max) of its tokens' scores; the context's last block may be shorter than ``B`` and is scored
  over its own tokens.
- ``uniform[agg=sum|max]``: the same tokens (or blocks) for every KV head of a layer, ranked by the scores
  summed (or maxed) over the layer's KV heads.
- ``layer_budget``: every layer keeps the same number of entries (the model-wide total split evenly,
  ``total // L``), for selections that move budget across layers (``global``, ``pyramid``); inside a layer
  the budget is split over heads in proportion to the selection's own split (largest remainder).

**Budget.** The constraint keeps exactly the press's own budget: the selection runs unconstrained, its
kept count per (layer, KV head) ``k[ℓ, h]`` is read off its mask (``int(T · (1 − α))`` for ``per_head``;
AdaKV's and global's uneven counts as they are), and the constraint re-selects that many entries from the
press's own scores, never more. ``uniform`` gives each head of a layer ``sum_h k[ℓ, h] // Hkv`` (the
layer's budget, shared; exact for ``per_head`` and ``adakv``); ``layer_budget`` acts on budgets before any
head sharing, wherever it is written.

**Partial blocks.** When ``k`` is not a whole number of blocks, blocks are filled in score order and the
block where the budget runs out is kept partially — its best tokens (by the token scores, head-summed
under ``uniform``) — as a server's last page is partially filled. ``partial=false`` keeps whole blocks
only and refuses (one line) a ratio whose budget is not a multiple of the block.

**Order.** Constraints apply left to right on the scores: ``paged`` then ``uniform`` sums per-head block
scores over heads, ``uniform`` then ``paged`` aggregates head-summed token scores over the block. With
``agg=mean`` and ``uniform[agg=sum]`` both are linear, so the order does not matter; with ``max`` it does.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from kvroute.errors import ConfigError, EngineError
from kvroute.presses.params import Param
from kvroute.presses.scorers.base import ScoreInputs, Scorer, check_params
from kvroute.presses.selection.base import ScoreVariant, Selection, n_kept, topk_mask
from kvroute.presses.spec import Component, ComponentSpec, parse_component
from kvroute.registry import Registry


class Constraint(Component):
    """A serving constraint: a dataclass whose fields are its parameters (see the module docstring)."""

    name: ClassVar[str]
    description: ClassVar[str] = ""
    schema: ClassVar[dict[str, Param]] = {}


CONSTRAINTS: Registry[type[Constraint]] = Registry("constraint")


@CONSTRAINTS.add
@dataclass(frozen=True)
class Paged(Constraint):
    name: ClassVar[str] = "paged"
    description: ClassVar[str] = ("Keep or drop whole blocks of `block` consecutive tokens (a server's pages), "
                                  "block score = mean|max of its tokens; the last kept block may be partial.")
    schema: ClassVar[dict[str, Param]] = {"block": Param(lo=1, why="tokens per page"),
                                          "agg": Param(choices=("mean", "max"), why="a block's score")}
    block: int = 16
    agg: str = "mean"
    partial: bool = True

    def spec(self) -> ComponentSpec:
        """The block size always written (``paged[block=16]``): a page size is what a reader looks for."""
        rest = super().spec().params
        return ComponentSpec(self.name, tuple(sorted({"block": self.block, **dict(rest)}.items())))


@CONSTRAINTS.add
@dataclass(frozen=True)
class Uniform(Constraint):
    name: ClassVar[str] = "uniform"
    description: ClassVar[str] = ("Head-uniform: the same tokens/blocks for every KV head of a layer, "
                                  "scores aggregated over heads (sum|max); budget: the layer's, shared.")
    schema: ClassVar[dict[str, Param]] = {"agg": Param(choices=("sum", "max"), why="over a layer's KV heads")}
    agg: str = "sum"


@CONSTRAINTS.add
@dataclass(frozen=True)
class LayerBudget(Constraint):
    name: ClassVar[str] = "layer_budget"
    description: ClassVar[str] = ("Equal kept budget per layer (total // L), split over heads as the selection "
                                  "split it; for selections that move budget across layers.")


def build_constraint(spec: ComponentSpec | str) -> Constraint:
    if isinstance(spec, str):
        spec = parse_component(spec, "constraint")
    cls = CONSTRAINTS.get(spec.name)
    return cls(**check_params("constraint", spec.name, spec.kwargs, cls.parameters(), cls.schema))


def _apportion(total: int, weights: torch.Tensor) -> torch.Tensor:
    """``total`` split over ``weights`` (long ``[n]``) by largest remainder (equal split when all are 0)."""
    w = weights.double() if int(weights.sum()) > 0 else torch.ones_like(weights, dtype=torch.double)
    share = w / w.sum() * total
    out = share.floor().long()
    rest = total - int(out.sum())
    if rest > 0:  # the largest remainders first (ties: the lower index)
        order = torch.sort(share - out, descending=True, stable=True).indices[:rest]
        out[order] += 1
    return out


def constrained_budgets(kept: torch.Tensor, constraints: Sequence[Constraint], T: int) -> torch.Tensor:
    """Per-(layer, KV head) budgets ``[L, Hkv]`` (long) under the constraints, from the selection's ``kept``.

    ``layer_budget`` first (each layer ``total // L``, split over heads in the selection's proportions, at
    most ``T`` per head), then ``uniform`` (each head ``sum_h k[ℓ, h] // Hkv``). Never more in total.
    """
    L, Hkv = kept.shape
    k = kept.clone().long()
    if any(isinstance(c, LayerBudget) for c in constraints):
        per_layer = int(k.sum()) // L
        k = torch.stack([_apportion(per_layer, k[layer]) for layer in range(L)]).clamp(max=T)
    if any(isinstance(c, Uniform) for c in constraints):
        k = (k.sum(dim=1, keepdim=True) // Hkv).expand(L, Hkv).clone()
    return k


def _block_scores(x: torch.Tensor, block: int, agg: str) -> torch.Tensor:
    """``[..., T]`` token scores → ``[..., nB]`` block scores (the last block may hold ``T % block`` tokens)."""
    T = x.shape[-1]
    nB = -(-T // block)
    pad = nB * block - T
    # [..., T] -> [..., nB, block]; padding is neutral for the aggregation (0 for sums, -inf for max)
    if agg == "max":
        xp = torch.nn.functional.pad(x, (0, pad), value=float("-inf")).unflatten(-1, (nB, block))
        return xp.max(dim=-1).values
    xp = torch.nn.functional.pad(x, (0, pad), value=0.0).unflatten(-1, (nB, block))
    sizes = torch.full((nB,), float(block), dtype=x.dtype, device=x.device)
    sizes[-1] = block - pad
    return xp.sum(dim=-1) / sizes


def _fill(unit: torch.Tensor, tokens: torch.Tensor, k: int, block: int, partial: bool, where: str) -> torch.Tensor:
    """One group's keep mask ``[T]``: blocks in ``unit`` score order until ``k`` tokens are kept.

    ``unit`` ``[nB]`` block scores, ``tokens`` ``[T]`` token scores (which tokens a partial block keeps).
    Whole blocks are taken while they fit; the first block that does not fit keeps its best ``rest`` tokens
    (``partial``), or, without ``partial``, the budget must be met by whole blocks exactly.
    """
    T = tokens.shape[-1]
    keep = torch.zeros(T, dtype=torch.bool, device=tokens.device)
    left = k
    for b in torch.sort(unit, descending=True, stable=True).indices.tolist():
        if left == 0:
            break
        lo, hi = b * block, min((b + 1) * block, T)
        if hi - lo <= left:
            keep[lo:hi] = True
            left -= hi - lo
        elif partial:
            keep[lo + tokens[lo:hi].topk(left).indices] = True
            left = 0
        else:
            raise EngineError(f"{where}: the budget of {k} tokens per head is not a whole number of {block}-token "
                              f"blocks; use partial=true (the last kept block partial) or a ratio that keeps a "
                              f"multiple of {block} of the {T} context tokens")
    return keep


def constrain(scores: torch.Tensor, kept: torch.Tensor, constraints: Sequence[Constraint],
              where: str = "") -> torch.Tensor:
    """Scores ``[L, Hkv, T]`` and the selection's kept counts ``[L, Hkv]`` → the constrained keep mask ``[L, Hkv, T]``.

    Exactly :func:`constrained_budgets` entries per (layer, KV head); see the module docstring for the rules.
    """
    L, Hkv, T = scores.shape
    paged = next((c for c in constraints if isinstance(c, Paged)), None)
    uniform = next((c for c in constraints if isinstance(c, Uniform)), None)
    block = paged.block if paged is not None else 1
    if block > T:
        raise EngineError(f"{where}: a block of {block} tokens is larger than the {T}-token context; use "
                          f"paged[block={T}] or smaller, or a longer context")
    budgets = constrained_budgets(kept, constraints, T)  # [L, Hkv]
    s = scores.float()
    # [L, Hkv or 1, T]: the token scores that decide which tokens a partial block keeps
    tokens = s.sum(dim=1, keepdim=True) if uniform is not None and uniform.agg == "sum" else (
        s.amax(dim=1, keepdim=True) if uniform is not None else s)
    unit = s  # left to right: [L, Hkv, T] -> blocks [L, Hkv, nB] and/or heads [L, 1, ·]
    for c in constraints:
        if isinstance(c, Paged):
            unit = _block_scores(unit, c.block, c.agg)
        elif isinstance(c, Uniform):
            unit = unit.sum(dim=1, keepdim=True) if c.agg == "sum" else unit.amax(dim=1, keepdim=True)
    partial = paged.partial if paged is not None else True
    if paged is None and uniform is not None:  # tokens as units: a plain top-k of the head-aggregated scores
        return torch.stack([topk_mask(tokens[layer, 0], int(budgets[layer, 0])) for layer in range(L)]
                           ).unsqueeze(1).expand(L, Hkv, T).clone()
    out = torch.zeros(L, Hkv, T, dtype=torch.bool, device=scores.device)
    for layer in range(L):
        for h in range(unit.shape[1]):  # Hkv groups, or one per layer under uniform
            out[layer, h] = _fill(unit[layer, h], tokens[layer, h], int(budgets[layer, h]), block, partial, where)
        if unit.shape[1] == 1:
            out[layer] = out[layer, 0]
    return out


@dataclass
class Constrained(Selection):
    """A selection under serving constraints: the base runs unconstrained for its budget, then
    :func:`constrain` re-selects that budget from the press's own scores. Scoring is the base's."""

    name: ClassVar[str] = "constrained"
    base: Selection = field(default=None)  # type: ignore[assignment]
    constraints: tuple[Constraint, ...] = ()

    def __post_init__(self) -> None:
        names = [c.name for c in self.constraints]
        for n in set(names):
            if names.count(n) > 1:
                raise ConfigError(f"constraint {n!r} appears {names.count(n)} times in one press; write it once")
        self.scores_per_ratio = self.base.scores_per_ratio  # type: ignore[misc]
        self.kvpress_fake_keys = self.base.kvpress_fake_keys  # type: ignore[misc]

    def spec(self) -> ComponentSpec:
        return self.base.spec()

    def constraint_specs(self) -> tuple[ComponentSpec, ...]:
        return tuple(c.spec() for c in self.constraints)

    def score_variant(self) -> ScoreVariant:
        return self.base.score_variant()

    def fit(self, scorer: Scorer) -> None:
        self.base.fit(scorer)

    def score_layer(self, scorer: Scorer, x: ScoreInputs, ratio: float) -> torch.Tensor:
        return self.base.score_layer(scorer, x, ratio)

    def check_scorer(self, scorer: Scorer) -> None:
        """The base's checks, then: the constraint re-ranks per-token scores, so a selection whose mask is not
        a ranking of the scorer's per-token scores (extra score streams, iterative per-ratio scoring) is refused."""
        self.base.check_scorer(scorer)
        what = "+".join(str(c.spec()) for c in self.constraints)
        if self.base.aux_scorers():
            raise ConfigError(f"{scorer.name}+{self.base.name} ranks by more than the press's per-token scores "
                              f"({', '.join(self.base.aux_scorers())}); {what} re-ranks per-token scores only: "
                              "use per_head, adakv, chunk, global or pyramid as the selection")
        if self.base.scores_per_ratio:
            raise ConfigError(f"{scorer.name}+{self.base.name} decides its kept tokens iteratively, so its scores "
                              f"are no per-token ranking; {what} needs one: use per_head, adakv, chunk, global or "
                              "pyramid as the selection")

    def aux_scorers(self) -> Mapping[str, Scorer]:
        return self.base.aux_scorers()

    def _where(self) -> str:
        return "+".join([self.base.name, *(str(c.spec()) for c in self.constraints)])

    def select(self, scores: torch.Tensor, ratio: float) -> torch.Tensor:
        T = scores.shape[-1]
        n_kept(T, ratio)  # the same range of ratios as every selection
        kept = self.base.select(scores, ratio).sum(-1)  # [L, Hkv]: the press's own budget
        return constrain(scores, kept, self.constraints, self._where())

    def kvpress_counterpart(self, scorer: Scorer, ratio: float, question_window: int = 0) -> Any:
        """kvpress's ChunkKVPress for ``per_head+paged[block=B]+uniform`` (mean, sum, partial) — equal when the
        context length ``T`` and the ratio make ``int(T·(1−α))`` whole chunks (kvpress keeps
        ``int(⌈T/B⌉·(1−α))`` whole chunks; see the tests); no other constrained press has one."""
        paged = next((c for c in self.constraints if isinstance(c, Paged)), None)
        uniform = next((c for c in self.constraints if isinstance(c, Uniform)), None)
        if (self.base.name == "per_head" and paged is not None and uniform is not None and paged.agg == "mean"
                and uniform.agg == "sum" and len(self.constraints) == 2):
            from kvpress import ChunkKVPress

            from kvroute.presses.selection.base import scorer_press

            return ChunkKVPress(scorer_press(scorer, ratio, question_window, "ChunkKVPress"), chunk_length=paged.block)
        raise EngineError(f"{self._where()}: kvpress has no press that selects this way (only per_head+paged+uniform "
                          "with mean and sum has one, ChunkKVPress, where the ratio keeps whole chunks)")


def constrained(base: Selection, specs: Sequence[ComponentSpec]) -> Selection:
    """``base`` under the constraints ``specs`` (``base`` itself when there are none)."""
    if not specs:
        return base
    return Constrained(base, tuple(build_constraint(s) for s in specs))
