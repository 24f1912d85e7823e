"""CriticalKV and CriticalAdaKV: two-stage selection that reweights scores by the value projections.

Stage 1 keeps a share ``first_stage_ratio`` of each head's budget by the scorer's own scores; stage
2 ranks the rest by ``(score + ε) · ‖W_O v‖₁`` — how much the entry's value can move the output
(CriticalKV, https://arxiv.org/abs/2502.03805). ``‖W_O v‖₁`` is read in the same prefill by an
auxiliary scorer (:class:`ValueProjectionNorm`), so the press's scores stay ratio-free and one
prefill serves every ratio, where kvpress's ``CriticalKVPress`` rescores per ratio. Both selections
reproduce kvpress's ``CriticalKVPress`` (per-head top-k) and ``CriticalAdaKVPress`` (AdaKV's
cross-head budget) operation for operation, so the masks are the same.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from kvroute.errors import ConfigError, EngineError
from kvroute.presses.params import Param
from kvroute.presses.scorers.base import ScoreInputs, Scorer
from kvroute.presses.scorers.kvpress_adapter import quiet_kvpress
from kvroute.presses.selection.base import SELECTIONS, Selection, n_kept, scorer_press, topk_mask

VALUE_NORM = "value_norm"
log = logging.getLogger(__name__)
_WARNED: set[str] = set()


def _check_vnorm(kind: str, scorer: Scorer) -> None:
    """Expected attention with use_vnorm already weighs by ‖v‖; CriticalKV weighs by ‖W_O v‖ again (kvpress warns)."""
    if (getattr(scorer, "name", "") == "expected_attention" and getattr(scorer, "use_vnorm", False)
            and kind not in _WARNED):
        _WARNED.add(kind)
        log.warning("%s with expected_attention[use_vnorm=true] weighs the values twice; kvpress advises "
                    "expected_attention[use_vnorm=false]+%s", kind, kind)


@dataclass
class ValueProjectionNorm(Scorer):
    """``‖W_O v‖₁`` per KV head ``[1, Hkv, T]``: each query head's output projection of the value, L1 norm,
    averaged over the query heads of a GQA group (kvpress's ``CriticalKVPress.vwl1norm``, same operations).

    Not registered: the CriticalKV selections read it as an auxiliary score.
    """

    name: ClassVar[str] = "value_projection_l1"
    description: ClassVar[str] = "L1 norm of each value through the output projection (CriticalKV's stage 2)."

    def score(self, x: ScoreInputs, ratio: float) -> torch.Tensor:
        from transformers.models.llama.modeling_llama import repeat_kv

        values = x.values
        module: Any = x.module  # a transformers attention module
        bsz, Hkv, T, _ = values.shape
        H = module.config.num_attention_heads
        D = module.head_dim  # Qwen2's config has no head_dim; the module always does
        Wo = module.o_proj.weight.transpose(0, 1).view(H, D, module.config.hidden_size)  # [H, D, hidden]
        V = repeat_kv(values, H // Hkv)  # [1, H, T, D]
        # one query head at a time, as kvpress does (the [H, T, hidden] product at once is large)
        norms = [torch.norm(V[:, h].matmul(Wo[h].unsqueeze(0)), p=1, dim=-1) for h in range(H)]  # H × [1, T]
        return torch.stack(norms, dim=1).view(bsz, Hkv, H // Hkv, T).mean(dim=2)  # [1, Hkv, T]


def _check(kind: str, epsilon: float, first_stage_ratio: float) -> None:
    if not 0.0 <= first_stage_ratio <= 1.0:
        raise ConfigError(f"{kind}: first_stage_ratio must be in [0, 1], got {first_stage_ratio}")
    if epsilon < 0:
        raise ConfigError(f"{kind}: epsilon must be ≥ 0, got {epsilon}")


_SCHEMA = {"epsilon": Param(lo=0, why="added to the scores before the value weighting"),
           "first_stage_ratio": Param(lo=0, hi=1, why="a share of each head's budget")}


def _value_norms(kind: str, aux: Mapping[str, torch.Tensor] | None) -> torch.Tensor:
    if not aux or VALUE_NORM not in aux:
        raise EngineError(f"{kind} needs the value projections scored in the same prefill (run it through the engine)")
    return aux[VALUE_NORM]


@SELECTIONS.add
@dataclass
class CriticalKV(Selection):
    """Per-head top-k in two stages (kvpress CriticalKVPress): a share by the scores, the rest by value-weighted
    scores."""

    name: ClassVar[str] = "criticalkv"
    description: ClassVar[str] = ("Two stages per KV head: first_stage_ratio of the budget by the scores, the rest by "
                                  "(score + ε)·‖W_O v‖₁ (kvpress CriticalKVPress).")
    epsilon: float = 1e-4
    first_stage_ratio: float = 0.5
    schema: ClassVar[dict[str, Param]] = _SCHEMA

    def __post_init__(self) -> None:
        _check(self.name, self.epsilon, self.first_stage_ratio)

    def aux_scorers(self) -> Mapping[str, Scorer]:
        return {VALUE_NORM: ValueProjectionNorm()}

    def check_scorer(self, scorer: Scorer) -> None:
        super().check_scorer(scorer)
        _check_vnorm(self.name, scorer)

    def select(self, scores: torch.Tensor, ratio: float) -> torch.Tensor:
        return self.select_aux(scores, ratio, {})

    def select_aux(self, scores: torch.Tensor, ratio: float, aux: Mapping[str, torch.Tensor]) -> torch.Tensor:
        norms = _value_norms(self.name, aux)  # [L, Hkv, T]
        L, Hkv, T = scores.shape
        k = n_kept(T, ratio)
        out = []
        for layer in range(L):  # kvpress's [1, Hkv, T] per layer, so ties break as there
            s = scores[layer : layer + 1]
            first = int((1 - ratio) * T * self.first_stage_ratio)
            if self.first_stage_ratio > 0:
                first = max(1, first)
            top = torch.topk(s, first, sorted=True, dim=-1).indices
            s = (s + self.epsilon) * norms[layer : layer + 1]
            s.scatter_(-1, top, torch.finfo(s.dtype).max)
            out.append(topk_mask(s, k))
        return torch.cat(out)

    def kvpress_counterpart(self, scorer: Scorer, ratio: float, question_window: int = 0) -> Any:
        from kvpress import CriticalKVPress

        with quiet_kvpress("criticalkv_press"):  # its use_vnorm warning: _check_vnorm, once
            inner = scorer_press(scorer, ratio, question_window, "CriticalKVPress")
            return CriticalKVPress(inner, epsilon=self.epsilon, first_stage_ratio=self.first_stage_ratio)


def critical_adakv_layer(scores: torch.Tensor, norms: torch.Tensor, k: int, alpha_safeguard: float, epsilon: float,
                         first_stage_ratio: float) -> torch.Tensor:
    """One layer ``[1, Hkv, T]`` → keep mask, as kvpress's ``CriticalAdaKVPress.compress``.

    AdaKV's safeguard and cross-head budgets; inside each head's budget, CriticalKV's two stages;
    then the ``Hkv · (T − k)`` lowest entries across heads are evicted.
    """
    bsz, Hkv, T = scores.shape
    big = torch.finfo(scores.dtype).max
    s = scores.clone()
    n_safe = int(k * alpha_safeguard)
    if alpha_safeguard > 0:
        n_safe = max(1, n_safe)
    safe = torch.topk(s, n_safe, dim=-1).indices
    s.scatter_(-1, safe, big)
    # each head's budget: its share of the layer's top Hkv·k entries
    top = torch.topk(s.reshape(bsz, -1), k * Hkv, dim=-1).indices
    budgets = torch.zeros(Hkv, device=s.device, dtype=torch.int64)
    budgets.scatter_add_(0, (top // T).flatten(), torch.ones_like(top.flatten()))
    first = (budgets * first_stage_ratio).to(torch.int64).tolist()  # stage 1 per head
    idx = torch.topk(s, max(first), sorted=True, dim=-1).indices
    for h in range(Hkv):
        s[:, h, :].scatter_(-1, idx[:, h, : first[h]], big)
    s = (s + epsilon) * norms  # stage 2
    idx = torch.topk(s, int(max(budgets)), sorted=True, dim=-1).indices
    for h in range(Hkv):
        s[:, h, :].scatter_(-1, idx[:, h, : budgets[h]], torch.finfo(s.dtype).max)
    keep = torch.ones(bsz, Hkv * T, dtype=torch.bool, device=s.device)
    n_pruned = Hkv * (T - k)
    if n_pruned > 0:
        keep.scatter_(1, torch.topk(-s.reshape(bsz, -1), n_pruned, dim=1).indices, False)
    return keep.view(bsz, Hkv, T)


@SELECTIONS.add
@dataclass
class CriticalAdaKV(Selection):
    """AdaKV's cross-head budgets with CriticalKV's two stages inside each head (kvpress CriticalAdaKVPress)."""

    name: ClassVar[str] = "critical_adakv"
    kvpress_fake_keys: ClassVar[bool] = True
    description: ClassVar[str] = ("AdaKV budgets across KV heads (with safeguard), CriticalKV's two stages inside each "
                                  "head (kvpress CriticalAdaKVPress).")
    alpha_safeguard: float = 0.20
    epsilon: float = 1e-4
    first_stage_ratio: float = 0.5
    schema: ClassVar[dict[str, Param]] = {"alpha_safeguard": Param(lo=0, hi=1, why="a share of each head's budget"),
                                          **_SCHEMA}

    def __post_init__(self) -> None:
        if not 0.0 <= self.alpha_safeguard <= 1.0:
            raise ConfigError(f"critical_adakv: alpha_safeguard must be in [0, 1], got {self.alpha_safeguard}")
        _check(self.name, self.epsilon, self.first_stage_ratio)

    def aux_scorers(self) -> Mapping[str, Scorer]:
        return {VALUE_NORM: ValueProjectionNorm()}

    def check_scorer(self, scorer: Scorer) -> None:
        super().check_scorer(scorer)
        _check_vnorm(self.name, scorer)

    def select(self, scores: torch.Tensor, ratio: float) -> torch.Tensor:
        return self.select_aux(scores, ratio, {})

    def select_aux(self, scores: torch.Tensor, ratio: float, aux: Mapping[str, torch.Tensor]) -> torch.Tensor:
        norms = _value_norms(self.name, aux)  # [L, Hkv, T]
        L, Hkv, T = scores.shape
        k = n_kept(T, ratio)
        return torch.cat([critical_adakv_layer(scores[layer : layer + 1], norms[layer : layer + 1], k,
                                               self.alpha_safeguard, self.epsilon, self.first_stage_ratio)
                          for layer in range(L)])

    def kvpress_counterpart(self, scorer: Scorer, ratio: float, question_window: int = 0) -> Any:
        from kvpress import CriticalAdaKVPress

        with quiet_kvpress("criticalkv_press"):
            inner = scorer_press(scorer, ratio, question_window, "CriticalAdaKVPress")
            return CriticalAdaKVPress(inner, alpha_safeguard=self.alpha_safeguard, epsilon=self.epsilon,
                                      first_stage_ratio=self.first_stage_ratio)
