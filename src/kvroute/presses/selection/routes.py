from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from kvroute.errors import ConfigError
from kvroute.presses.params import Param
from kvroute.presses.selection.base import SELECTIONS, Selection, n_kept


def routes_layer(scores: torch.Tensor, k: int, alpha_safeguard: float, coverage: float) -> torch.Tensor:
    """One layer ``[Hkv, T]`` → keep mask: the AdaKV budget ``Hkv · k``, spent to cover many tokens.

    1. safeguard: each head keeps its own top ``max(1, int(k · α_safe))`` entries (as AdaKV);
    2. coverage: ``int(coverage · remaining budget)`` more entries go to the highest-priority tokens
       that no head keeps yet — priority = the token's best score over heads — each placed in the
       head that scores it highest, so no token some head ranks highly is evicted from every head;
    3. the rest of the budget goes to the highest remaining (head, token) scores across heads (AdaKV).
    """
    Hkv, T = scores.shape
    s = scores.float()
    keep = torch.zeros(Hkv, T, dtype=torch.bool, device=s.device)
    budget = Hkv * k
    n_safe = max(1, int(k * alpha_safeguard)) if alpha_safeguard > 0 else 0
    if n_safe:
        keep.scatter_(1, s.topk(n_safe, dim=-1).indices, True)
    left = budget - int(keep.sum())
    # 2) coverage of tokens not yet kept anywhere, best token first, in its best head
    n_cover = int(coverage * left)
    if n_cover > 0:
        best_score, best_head = s.max(dim=0)  # [T]
        uncovered = ~keep.any(dim=0)
        cand = torch.where(uncovered, best_score, torch.full_like(best_score, float("-inf")))
        n_cover = min(n_cover, int(uncovered.sum()))
        if n_cover > 0:
            tok = cand.topk(n_cover).indices
            keep[best_head[tok], tok] = True
    left = budget - int(keep.sum())
    # 3) AdaKV fill: global top scores among entries not kept yet
    if left > 0:
        rest = s.masked_fill(keep, float("-inf")).flatten()
        keep.view(-1)[rest.topk(left).indices] = True
    return keep


@SELECTIONS.add
@dataclass
class Routes(Selection):
    """Route-preserving selection: AdaKV's budget and safeguard, but maximise coverage across heads.

    At the same budget as ``per_head``/``adakv``, a share ``coverage`` of the entries left after the
    safeguard is spent on keeping *distinct* tokens — the highest-priority tokens that would
    otherwise be evicted from every head — each in the head that scores it highest; the rest is
    allocated as AdaKV does. It tests the claim that compression should preserve routes, not
    per-head token counts.
    """

    name: ClassVar[str] = "routes"
    description: ClassVar[str] = "AdaKV budget + safeguard, spent first on covering distinct high-priority tokens."
    alpha_safeguard: float = 0.20
    coverage: float = 0.5
    schema: ClassVar[dict[str, Param]] = {"alpha_safeguard": Param(lo=0, hi=1, why="a share of each head's budget"),
                                          "coverage": Param(lo=0, hi=1, why="a share of the remaining budget")}

    def __post_init__(self) -> None:
        if not 0.0 <= self.alpha_safeguard <= 1.0:
            raise ConfigError(f"routes: alpha_safeguard must be in [0, 1], got {self.alpha_safeguard}")
        if not 0.0 <= self.coverage <= 1.0:
            raise ConfigError(f"routes: coverage must be in [0, 1], got {self.coverage}")

    def select(self, scores: torch.Tensor, ratio: float) -> torch.Tensor:
        L, Hkv, T = scores.shape
        k = n_kept(T, ratio)
        if ratio == 0:
            return torch.ones_like(scores, dtype=torch.bool)
        return torch.stack([routes_layer(scores[layer], k, self.alpha_safeguard, self.coverage) for layer in range(L)])
