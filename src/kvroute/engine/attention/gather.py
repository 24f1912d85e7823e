"""Masked attention over each cell's kept context entries only: what a pruned cache costs, from the shared context.

A cell at ratio α keeps (1 − α)·T context entries per KV head, yet the one-shot and chunked forms of the masked
attention (:mod:`kvroute.engine.attention`, :mod:`kvroute.engine.attention.streaming`) multiply its queries with all T
keys and discard the masked scores: at α = 0.9 nine tenths of the work. :func:`gathered_context_attention` gathers each
cell's kept keys and values per KV head (in position order, as kvpress's pruned cache holds them) and attends over those
alone, so a cell's attention costs what its pruned cache costs. The cells of a forward are grouped by kept count
(:func:`kept_groups`, per layer the largest over the KV heads, so a group pads little; a cell that keeps the whole
context reads the shared keys without a gather). The gathered K/V are transient, one layer and one group at a time,
split by cells and then by query rows so that a slice's tensors stay within the attention budget and
:data:`GATHER_SLICE_BYTES`: the context K/V are still held once, and the transient does not grow with the cells or the
question's length.

The gather copies each kept entry once per forward. A forward with many queries per cell (the question forward,
a long draft) repays it many times over; a decode step's single query does not on a CPU, where the gathered form,
its gather included, took about 4× the one-shot time, and a few queries do not repay the per-group work
(``benchmarks/attention_kernels.py``), so the masked attention gathers from :data:`GATHER_MIN_QUERIES` queries per
cell up. Results agree with the one-shot form to float32 rounding (tests/unit/test_gather.py): the sums run over the
kept entries in the same order, without the masked terms (exact zeros in the one-shot form).

Where the kept-entries kernel runs (:mod:`kvroute.engine.attention.kept`: a CPU with AVX-512 and a compiler, float32),
it does the same without the gather, faster, and takes these forwards over; this form is its fallback.
"""

from __future__ import annotations

import torch

from kvroute.engine.attention.backend import AttentionCall, Backend, register
from kvroute.engine.attention.context import GATHER_MIN_QUERIES
from kvroute.engine.attention.streaming import (
    ONE_SHOT_COPIES,
    fused_available,
    fused_context,
    keep_bias,
    suffix_scores,
    with_suffix,
)

__all__ = ["GATHER_MIN_QUERIES", "GATHER_SLICE_BYTES", "Gathered", "gather_limit", "gathered_bytes",
           "gathered_context_attention", "kept_groups"]  # (GATHER_MIN_QUERIES: context.py, for every backend)

#: a group of cells takes cells whose kept count is at least this share of its largest (padding ≤ 1 − share)
GROUP_SHARE = 0.9
#: the most bytes one gathered slice's transient tensors take, whatever the attention budget (the caller passes the
#: smaller of the two): a larger slice saves no time (a slice of this size is thousands of query rows over the kept
#: keys), and a bound independent of the budget keeps the question forward's transient memory flat in the number of
#: cells and the question's length (benchmarks/attention_memory.py)
GATHER_SLICE_BYTES = 256 * 2**20


def kept_groups(counts: list[int], share: float = GROUP_SHARE) -> list[list[int]]:
    """Cell indices grouped by kept count, largest first: a group takes cells while their count is at least
    ``share`` of its first (so padding to the group's largest wastes at most ``1 - share`` of its work)."""
    order = sorted(range(len(counts)), key=lambda b: -counts[b])
    groups: list[list[int]] = []
    for b in order:
        if groups and counts[b] >= share * counts[groups[-1][0]]:
            groups[-1].append(b)
        else:
            groups.append([b])
    return groups


def gathered_bytes(cells: int, kv_heads: int, rows: int, kept: int, suffix: int, head_dim: int,
                   dtype_bytes: int) -> int:
    """Transient bytes of one group's gathered attention: its kept keys and values (and their indices), and the
    float32 scores, exponentials and probabilities of ``rows`` query rows per KV head over ``kept + suffix`` keys."""
    gathered = cells * kv_heads * kept * (2 * head_dim * dtype_bytes + 8 + 1)
    return gathered + ONE_SHOT_COPIES * 4 * cells * kv_heads * rows * (kept + suffix)


def _kept_index(keep: torch.Tensor, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``keep`` bool ``[Hkv, b, T]`` → the kept positions of each (KV head, cell) in order, padded to ``width``
    (``[Hkv, b, width]`` int64, padding 0), and which of them are real (``[Hkv, b, width]`` bool)."""
    order = torch.sort(keep.to(torch.uint8), dim=-1, descending=True, stable=True).indices[..., :width]
    return order, keep.gather(-1, order)


def _slices(cells: int, R: int, width: int, s: int, Hkv: int, D: int, dtype_bytes: int,
            budget: int | None) -> tuple[int, int]:
    """How a group of ``cells`` cells keeping ``width`` entries is sliced to fit ``budget``: (cells per slice, query
    rows per slice). Cells first; a single cell whose ``R`` rows do not fit keeps its gathered K/V and takes its
    rows in slices (at least one)."""
    if budget is None:
        return cells, R
    one = gathered_bytes(1, Hkv, R, width, s, D, dtype_bytes)
    if one <= budget:
        return max(1, min(cells, budget // max(one, 1))), R
    kv = gathered_bytes(1, Hkv, 0, width, s, D, dtype_bytes)
    per_row = gathered_bytes(1, Hkv, 1, width, s, D, dtype_bytes) - kv
    return 1, max(1, min(R, (budget - kv) // per_row))


def gathered_context_attention(qg: torch.Tensor, k_ctx: torch.Tensor, v_ctx: torch.Tensor, keep: torch.Tensor,
                               key: torch.Tensor, value: torch.Tensor, *, q: int, scale: float,
                               own: torch.Tensor | None = None, budget: int | None = None,
                               fused: bool | None = None) -> torch.Tensor:
    """The masked attention output ``[Hkv, B, G·q, D]`` (in the query's dtype), each cell over its kept entries.

    Arguments as :func:`kvroute.engine.attention.streaming.chunked_context_attention`: ``qg`` ``[B, Hkv, G·q, D]``
    (each KV
    head's query rows, (g, i) order), ``k_ctx``/``v_ctx`` ``[Hkv, T, D]``, ``keep`` bool ``[Hkv, B, 1, T]``,
    ``key``/``value`` ``[B, Hkv, s, D]`` (the cells' suffix), ``own`` bool ``[B, s]`` (None: every slot). ``budget``:
    bytes one slice's transient tensors may take (:func:`gathered_bytes`); a group over it is split by cells, down to
    one cell, and a cell over it by query rows, down to one row (None: no split). ``fused``: whether a slice may run
    through PyTorch's fused CPU kernel (None: wherever it is available).
    """
    B, Hkv, R, D = qg.shape
    T, s = k_ctx.shape[1], key.shape[2]
    kk = keep[:, :, 0]  # [Hkv, B, T]
    counts = kk.sum(-1).amax(0).tolist()  # [B]: the most entries any KV head of the cell keeps
    s_suf = suffix_scores(qg, key, q, scale, own)  # [Hkv, B, R, s] float32
    out = torch.empty(Hkv, B, R, D, dtype=qg.dtype, device=qg.device)
    fused = fused_available(qg) if fused is None else fused and fused_available(qg)
    heads = torch.arange(Hkv, device=qg.device).view(Hkv, 1, 1) * T
    for group in kept_groups(counts):
        width = counts[group[0]]
        step, rows = _slices(len(group), R, width, s, Hkv, D, k_ctx.element_size(), budget)
        for a in range(0, len(group), step):
            idx = torch.tensor(group[a : a + step], device=qg.device)
            b = len(idx)
            if width == T:  # the whole context: the shared keys, no gather (cells folded into rows)
                valid, gk, vals = kk.index_select(1, idx), None, None  # valid [Hkv, b, T]
            else:
                pos, valid = _kept_index(kk.index_select(1, idx), width)  # [Hkv, b, width]; valid: False on padding
                flat = (pos + heads).flatten()
                gk = k_ctx.reshape(Hkv * T, D).index_select(0, flat).view(Hkv, b, width, D)
                vals = v_ctx.reshape(Hkv * T, D).index_select(0, flat).view(Hkv, b, width, D)
            padded = not bool(valid.all())  # padding (or masked entries of a cell keeping the whole context)
            if padded and vals is not None:  # padded values weigh 0, and must not be inf or NaN
                vals.masked_fill_(~valid.unsqueeze(-1), 0.0)
                if fused and gk is not None:  # the fused kernel adds the mask to the scores: finite keys there too
                    gk.masked_fill_(~valid.unsqueeze(-1), 0.0)
            v_suf = value.index_select(0, idx).transpose(0, 1)  # [Hkv, b, s, D]
            q_sel, s_sel = qg.index_select(0, idx).transpose(0, 1), s_suf.index_select(1, idx)  # [Hkv, b, R, ·]
            if fused and width and gk is not None and vals is not None:
                # one fused kernel per slice over the gathered keys; the suffix joined after (a cell keeping all T
                # reads the shared keys below, where a masked entry's score is replaced, not added to)
                ks, vs = gk.transpose(0, 1), vals.transpose(0, 1)  # [b, Hkv, W, D]
                mask = None
                if padded:  # [b, Hkv, 1, W]: −inf on padding (the kernel takes the mask in the query's dtype)
                    mask = keep_bias(valid, qg.dtype).to(qg.dtype).unsqueeze(2).transpose(0, 1)
                empty = ~valid.any(-1, keepdim=True)  # [Hkv, b, 1]: a KV head of which a cell keeps nothing
                for r0 in range(0, R, rows):
                    r = min(rows, R - r0)
                    o, lse = fused_context(q_sel[:, :, r0 : r0 + r].transpose(0, 1), ks, vs, mask, scale=scale)
                    out[:, idx, r0 : r0 + r] = with_suffix(o.transpose(0, 1), lse.transpose(0, 1), empty,
                                                           s_sel[:, :, r0 : r0 + r], v_suf, qg.dtype)
                continue
            for r0 in range(0, R, rows):
                r = min(rows, R - r0)
                qq = q_sel[:, :, r0 : r0 + r]  # [Hkv, b, r, D]
                if gk is None:
                    sc = torch.bmm(qq.reshape(Hkv, b * r, D), k_ctx.transpose(1, 2)).view(Hkv, b, r, T)
                else:
                    sc = torch.matmul(qq, gk.transpose(2, 3))  # [Hkv, b, r, width]
                sc = sc.float().mul_(scale)
                if padded:
                    sc.masked_fill_(~valid.unsqueeze(2), float("-inf"))
                ss = s_sel[:, :, r0 : r0 + r]  # [Hkv, b, r, s]
                m = ss.amax(-1, keepdim=True)  # finite: every row sees its own position
                if width:
                    m = torch.maximum(m, sc.amax(-1, keepdim=True))
                ec, es = torch.exp(sc.sub_(m)), torch.exp(ss - m)
                total = ec.sum(-1, keepdim=True) + es.sum(-1, keepdim=True)
                pc, ps = ec.div_(total).to(qg.dtype), es.div_(total).to(qg.dtype)
                if vals is None:
                    o = torch.bmm(pc.view(Hkv, b * r, T), v_ctx).view(Hkv, b, r, D)
                else:
                    o = torch.matmul(pc, vals)
                out[:, idx, r0 : r0 + r] = o + torch.matmul(ps, v_suf)
    return out


def gather_limit(budget: int | None) -> int:
    """The most bytes one gathered slice takes: the attention budget, at most :data:`GATHER_SLICE_BYTES`."""
    return GATHER_SLICE_BYTES if budget is None else min(budget, GATHER_SLICE_BYTES)


@register
class Gathered(Backend):
    """Each cell's kept entries gathered per KV head into a dense padded tensor, then attended (any device)."""

    name = "gathered"

    def forward(self, call: AttentionCall) -> torch.Tensor:
        return gathered_context_attention(call.qg, call.k_ctx, call.v_ctx, call.keep, call.key, call.value, q=call.q,
                                          scale=call.scale, own=call.own, budget=gather_limit(call.ctx.budget),
                                          fused=call.ctx.backend.fused)  # [Hkv, B, G·q, D]
