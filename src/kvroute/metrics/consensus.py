"""Head consensus at the last prompt token: Consensus(ℓ) and the agreement fraction ρ_ℓ.

Consensus(ℓ) = (number of distinct argmax keys over the query heads of layer ℓ) / (query heads);
low = heads agree = rigid. ρ_ℓ = the largest share of heads sharing one argmax key.

Three variants, named by what they include:

* ``*_nosink`` (the default every analysis reads): argmax over the keys after the first
  ``n_sink`` positions. With the sinks, most heads' argmax is a sink token and the layer profile
  can invert.
* ``*_group_nosink`` (GQA-aware, sink-free): the query heads of one KV group share that group's
  keys, so models with different group sizes are not comparable on the per-head value. Each
  group's attention is averaged over its query heads, the group's argmax is taken (after the
  sinks), and Consensus_group(ℓ) = distinct group argmaxes / KV groups, ρ_group(ℓ) = largest
  share of groups sharing one argmax. With one query head per group it *is* the per-head value.
* ``*_withsink``: the raw argmax over every key, sinks included (kept for comparison only).

Query head ``h`` belongs to KV group ``h // G`` (the layout of ``repeat_kv`` in transformers).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from kvroute.metrics.base import CellContext, Metric, register


def _distinct_and_top(arg: torch.Tensor) -> tuple[list[float], list[float]]:
    """Per layer of argmax indices ``[L, N]``: (distinct / N, largest tie share / N)."""
    L, N = arg.shape
    cons, rho = [], []
    for layer in range(L):
        _, counts = torch.unique(arg[layer], return_counts=True)
        cons.append(counts.numel() / N)
        rho.append(float(counts.max()) / N)
    return cons, rho


def consensus_and_rho(attn_row: torch.Tensor, skip: int = 0) -> tuple[list[float], list[float]]:
    """From rows ``[L, H, K]``: per-layer Consensus(ℓ) and ρ_ℓ over query heads, keys ``skip:``.

    When no key is left after ``skip`` the value is undefined: NaN for every layer.
    """
    L, H, K = attn_row.shape
    if skip >= K:
        return [math.nan] * L, [math.nan] * L
    return _distinct_and_top(attn_row[..., skip:].argmax(-1))  # [L, H]


def group_consensus_and_rho(attn_row: torch.Tensor, group_size: int, skip: int = 0) -> tuple[list[float], list[float]]:
    """GQA-aware Consensus_group(ℓ) and ρ_group(ℓ) from rows ``[L, H, K]``, ``H = Hkv · group_size``.

    Each KV group's attention is the mean over its ``group_size`` query heads; the argmax is over
    keys ``skip:``; distinct argmaxes and the largest shared share are counted over KV groups.
    ``group_size == 1`` gives exactly :func:`consensus_and_rho`.
    """
    L, H, K = attn_row.shape
    if group_size < 1 or H % group_size:
        raise ValueError(f"{H} query heads cannot form KV groups of {group_size}")
    if skip >= K:
        return [math.nan] * L, [math.nan] * L
    grouped = attn_row[..., skip:].float().reshape(L, H // group_size, group_size, K - skip).mean(2)  # [L, Hkv, K']
    return _distinct_and_top(grouped.argmax(-1))  # [L, Hkv]


@register
class Consensus(Metric):
    name = "consensus"
    needs = frozenset({"attention"})
    fields = ("consensus_nosink", "rho_nosink", "consensus_group_nosink", "rho_group_nosink",
              "consensus_withsink", "rho_withsink", "consensus_nosink_mean", "rho_nosink_mean")

    def compute(self, ctx: CellContext) -> dict[str, Any]:
        a = ctx.output.last_attention
        skip = ctx.settings.n_sink
        cw, rw = consensus_and_rho(a)
        cn, rn = consensus_and_rho(a, skip)
        cg, rg = group_consensus_and_rho(a, ctx.group_size, skip)
        return {"consensus_nosink": cn, "rho_nosink": rn, "consensus_group_nosink": cg, "rho_group_nosink": rg,
                "consensus_withsink": cw, "rho_withsink": rw,
                "consensus_nosink_mean": sum(cn) / len(cn), "rho_nosink_mean": sum(rn) / len(rn)}
