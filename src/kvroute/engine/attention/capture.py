"""What a masked attention forward captures, handed to the context's observers beside the backend that computed it.

A forward captures for the query indices :meth:`MaskedContext.captured` names, in two kinds an observer registers for
on the context: whole probability rows (``on_probs``: the last prompt token's rows, a generated token's rows for its
argmax or ``keep_generated_rows``) and the probability each row puts on a few position sets (``on_masses``: the
generated tokens' tracked masses). The ``reference`` backend hands both from its own softmax; after any other backend,
:func:`deliver` computes them on their own from the queries, the keys and the keep mask, so the backend never
materialises the other queries' probabilities:

- a whole row with :func:`~kvroute.engine.attention.streaming.probability_rows` (one query's scores over all T + s
  keys and their softmax);
- a mass, where the backend returned its rows' log-sum-exp (:attr:`Backend.lse`: ``kept``, ``fused``), with
  :func:`~kvroute.engine.attention.streaming.probability_at`: the scores at the tracked positions only, against that
  normaliser; else from the whole row.

Both equal the reference's to float32 rounding (tests/unit/test_attention_backends.py, tests/integration/
test_captures.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from kvroute.engine.attention.streaming import probability_at, probability_rows

if TYPE_CHECKING:
    from kvroute.engine.attention.backend import AttentionCall


def masses_of(rows: torch.Tensor, sets: tuple[torch.Tensor, ...]) -> torch.Tensor:
    """``rows`` ``[B, H, K]`` (probabilities over the K = T + s keys) → the mass on each position set ``[B, H, n]``."""
    return torch.stack([rows.index_select(-1, idx).sum(-1) for idx in sets], dim=-1)


def deliver(call: AttentionCall, index: int, *, rows: torch.Tensor | None = None,
            lse: torch.Tensor | None = None) -> None:
    """Hand query ``index``'s captures of ``call`` to its context's observers. ``rows`` ``[B, H, T + s]``: the
    probability rows where the backend has them (the reference's softmax); ``lse`` ``[Hkv, B, G·q]``: its rows'
    log-sum-exp where the backend returned it. What is missing is computed here (see the module's docstring)."""
    ctx = call.ctx
    if rows is None and (ctx.on_probs is not None or lse is None):
        rows = probability_rows(call.qg, call.k_ctx, call.bias(), call.key, q=call.q, index=index, scale=call.scale,
                                own=call.own)  # [B, H, T + s]
    if ctx.on_probs is not None:
        assert rows is not None
        ctx.on_probs(call.layer, rows, index)
    if ctx.on_masses is None:
        return
    sets = ctx.mass_sets
    B, H = call.qg.shape[0], call.qg.shape[1] * call.G
    if not sets:
        masses = call.qg.new_zeros(B, H, 0, dtype=torch.float32)
    elif rows is not None:
        masses = masses_of(rows, sets)
    else:
        assert lse is not None
        at = probability_at(call.qg, call.k_ctx, call.bias(), call.key, lse, torch.cat(sets), q=call.q, index=index,
                            scale=call.scale, own=call.own)  # [B, H, P]: every set's positions, end to end
        masses = torch.stack([part.sum(-1) for part in at.split([len(s) for s in sets], dim=-1)], dim=-1)
    ctx.on_masses(call.layer, masses, index)  # [B, H, n]
