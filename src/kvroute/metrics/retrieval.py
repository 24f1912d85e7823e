"""Retrieval heads (Wu et al. 2024) and the answer's survival in each KV head.

A head *retrieves* when, as the model generates a token that copies one of the answer's context tokens,
its attention is highest on a context position of the answer holding that same token. On a full-cache
cell this metric counts, per (layer, query head), those hits over the copying events (``retrieval_hits``,
``retrieval_events``); summed over a model's instances they give each head's retrieval score, and the
heads scoring at least 0.1 are its retrieval heads (kvroute.analysis.retrieval). On every cell it records
the share of the answer's tokens each (layer, KV head) keeps (``answer_kept_heads``), from which the
analysis reads the answer's survival in the retrieval heads.

The attention producing generated token j is the last prompt token's row for j = 0 and, for j ≥ 1, the
row of the step that fed token j − 1 (``CellOutput.generated_argmax``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from kvroute.metrics.base import CellContext, Metric, register

THRESHOLD = 0.1  # Wu et al.'s retrieval-score cut-off
MIN_EVENTS = 5  # fewer copying events than this: no scores


@dataclass(frozen=True)
class RetrievalHeads:
    heads: list[tuple[int, int]]  # (layer, query head) pairs scoring at least the threshold
    num_heads: int  # query heads per layer
    events: int  # copying events the scores rest on


def select_heads(hits: np.ndarray, events: int, threshold: float = THRESHOLD) -> RetrievalHeads | None:
    """A model's retrieval heads from its summed ``hits [L, H]`` over ``events`` copying events: the heads whose
    score hits / events is at least ``threshold``; None with fewer than :data:`MIN_EVENTS` events."""
    if events < MIN_EVENTS:
        return None
    hits = np.asarray(hits, dtype=float)
    layers, heads = np.nonzero(hits / events >= threshold)
    return RetrievalHeads([(int(a), int(b)) for a, b in zip(layers, heads, strict=True)], int(hits.shape[1]),
                          int(events))


def heads_from_records(records: Iterable[Mapping[str, Any]],
                       threshold: float = THRESHOLD) -> dict[str, RetrievalHeads | None]:
    """Per model with full-cache records carrying this metric: its retrieval heads (None: too few events)."""
    hits: dict[str, np.ndarray] = {}
    events: dict[str, int] = {}
    for r in records:
        h = r.get("retrieval_hits")
        if r.get("press") != "none" or h is None or r.get("status", "ok") != "ok":
            continue
        m = str(r["model"])
        arr = np.asarray(h, dtype=float)
        hits[m] = hits[m] + arr if m in hits else arr
        events[m] = events.get(m, 0) + int(r.get("retrieval_events") or 0)
    return {m: select_heads(hits[m], events[m], threshold) for m in hits}


def retrieval_hits(tokens: list[int], first: torch.Tensor, steps: torch.Tensor | None, context_ids: list[int],
                   answer: list[int]) -> tuple[torch.Tensor, int]:
    """``(hits [L, H], events)``: ``first [L, H]`` the argmax context position producing token 0, ``steps
    [n, L, H]`` those producing tokens 1 … n; an event is a generated token equal to an answer token of the
    context; a head hits when its argmax is an answer position holding that token."""
    answer_set = set(answer)
    copyable = {context_ids[p] for p in answer_set}
    hits = torch.zeros_like(first, dtype=torch.float32)
    events = 0
    ids = torch.as_tensor(context_ids, dtype=torch.long)
    is_answer = torch.zeros(len(context_ids), dtype=torch.bool)
    is_answer[list(answer_set)] = True
    for j, w in enumerate(tokens):
        if w not in copyable:
            continue
        arg = first if j == 0 else (steps[j - 1] if steps is not None and j - 1 < len(steps) else None)
        if arg is None:
            continue
        events += 1
        arg = arg.cpu()
        hits += (is_answer[arg] & (ids[arg] == w)).float()
    return hits, events


@register
class Retrieval(Metric):
    name = "retrieval"
    needs = frozenset({"attention", "argmax"})
    fields = ("answer_kept_heads", "retrieval_hits", "retrieval_events")

    def compute(self, ctx: CellContext) -> dict[str, Any]:
        ans = ctx.context_positions(ctx.prompt.answer_positions)
        out: dict[str, Any] = {"answer_kept_heads": None, "retrieval_hits": None, "retrieval_events": None}
        if ans:
            kept = ctx.mask.mask[:, :, ans].float().mean(-1)  # [L, Hkv]
            out["answer_kept_heads"] = [[float(x) for x in row] for row in kept.tolist()]
        if ctx.mask.ratio == 0 and bool(ctx.mask.mask.all()) and ans and ctx.output.last_attention is not None:
            first = ctx.output.last_attention[..., : ctx.T].argmax(-1)  # [L, H]
            hits, events = retrieval_hits(ctx.output.tokens, first, ctx.output.generated_argmax,
                                          list(ctx.prompt.context_ids), ans)
            out["retrieval_hits"] = [[int(x) for x in row] for row in hits.tolist()]
            out["retrieval_events"] = events
        return out
