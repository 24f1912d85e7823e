"""Chunked (online-softmax) masked attention equals the one-shot form; the planner chunks only past the budget."""

from __future__ import annotations

import pytest
import torch

from kvroute.engine.attention import MaskedContext
from kvroute.engine.attention.streaming import MIN_CHUNK, context_chunk, one_shot_bytes
from tests.attention_call import masked_forward


@pytest.mark.parametrize("B, Hkv, G, q, s, T, D, chunk", [
    (3, 2, 3, 5, 7, 50, 16, 8),  # GQA, a question forward (q = 5 of s = 7 suffix positions)
    (2, 1, 1, 1, 4, 33, 8, 64),  # one decode step; chunk longer than the context
    (4, 2, 2, 3, 3, 200, 32, 17),  # chunk not dividing T
])
def test_chunked_equals_one_shot_with_the_same_captured_rows(B, Hkv, G, q, s, T, D, chunk):
    g = torch.Generator().manual_seed(B * 100 + T)
    k_ctx, v_ctx = torch.randn(1, Hkv, T, D, generator=g), torch.randn(1, Hkv, T, D, generator=g)
    keep = torch.rand(B, 1, Hkv, T, generator=g) > 0.6  # [B, L=1, Hkv, T]
    keep[0] = False  # a cell that keeps no context entry at all
    query = torch.randn(B, Hkv * G, q, D, generator=g)
    key, value = torch.randn(B, Hkv, s, D, generator=g), torch.randn(B, Hkv, s, D, generator=g)
    seen: dict[str, torch.Tensor] = {}
    one = masked_forward(MaskedContext([k_ctx], [v_ctx], keep, lambda _, r, __: seen.__setitem__("one", r), q - 1,
                                       gather_from=None), query, key, value)
    chunked = masked_forward(MaskedContext([k_ctx], [v_ctx], keep, lambda _, r, __: seen.__setitem__("chunked", r),
                                           q - 1, context_chunk=chunk, gather_from=None), query, key, value)
    assert chunked.shape == one.shape == (B, q, Hkv * G, D)
    assert torch.allclose(chunked, one, atol=1e-5, rtol=0), (chunked - one).abs().max()
    assert torch.allclose(seen["chunked"], seen["one"], atol=1e-6, rtol=0)
    assert torch.allclose(seen["one"].sum(-1), torch.ones(B, Hkv * G))  # rows are distributions


def test_planner_keeps_one_shot_while_it_fits_and_chunks_past_the_budget():
    need = one_shot_bytes(cells=64, heads=32, queries=50, keys=32_768)
    assert need == 3 * 4 * 64 * 32 * 50 * 32_768  # ~40 GB: an 8B model at 32k tokens, 64 cells
    assert context_chunk(64, 32, 50, 32_768, budget=need) is None
    chunk = context_chunk(64, 32, 50, 32_768, budget=need // 10)
    assert chunk is not None and one_shot_bytes(64, 32, 50, chunk) <= need // 10 < one_shot_bytes(64, 32, 50, chunk + 1)
    assert context_chunk(64, 32, 50, 32_768, budget=1) == MIN_CHUNK


def test_the_additive_keep_mask_is_the_masked_fill_and_follows_the_cells():
    """keep_bias added to scores is exactly masked_fill(~keep, −inf); MaskedContext caches it per layer (and which
    (KV head, cell) pairs keep nothing), drops the caches when keep is replaced and carries them along when cells
    leave the batch (select)."""
    from kvroute.engine.attention.streaming import keep_bias

    g = torch.Generator().manual_seed(5)
    B, L, Hkv, T = 5, 3, 2, 40
    keep = torch.rand(B, L, Hkv, T, generator=g) > 0.5
    keep[1, 2, 0] = False  # cell 1 keeps nothing of layer 2's first KV head
    keep[4, 1, 1] = False

    def empty_of(k: torch.Tensor, layer: int) -> torch.Tensor:  # [Hkv, b, 1]: the pairs that keep nothing
        return torch.stack([torch.tensor([[not bool(k[b, layer, h].any())] for b in range(len(k))])
                            for h in range(Hkv)])
    scores = torch.randn(Hkv, B, 3, T, generator=g)
    k = keep[:, 1].transpose(0, 1).unsqueeze(2)
    assert torch.equal(scores + keep_bias(k, torch.float32), scores.masked_fill(~k, float("-inf")))
    ctx = MaskedContext([torch.zeros(1, Hkv, T, 4)] * L, [torch.zeros(1, Hkv, T, 4)] * L, keep)
    first = ctx.context_bias(1, torch.float32)
    assert ctx.context_bias(1, torch.float32) is first  # cached
    assert torch.equal(first, keep_bias(k, torch.float32))
    assert torch.equal(ctx.context_empty(1), empty_of(keep, 1)) and bool(ctx.context_empty(1).any())
    assert ctx.context_empty(1) is ctx.context_empty(1)  # cached
    alive = torch.tensor([0, 3, 4])
    ctx.select(alive)
    assert torch.equal(ctx.keep, keep[alive])
    assert torch.equal(ctx.context_empty(1), empty_of(keep[alive], 1))
    assert torch.equal(ctx.context_bias(1, torch.float32), keep_bias(keep[alive][:, 1].transpose(0, 1).unsqueeze(2),
                                                                      torch.float32))
    ctx.keep = keep[:2]  # replaced: the cache follows the new masks
    assert torch.equal(ctx.context_empty(2), empty_of(keep[:2], 2)) and bool(ctx.context_empty(2).any())
    assert torch.equal(ctx.context_bias(2, torch.float32), keep_bias(keep[:2, 2].transpose(0, 1).unsqueeze(2),
                                                                      torch.float32))
    assert ctx.context_bias(2, torch.float32).dtype == torch.bfloat16  # two bytes, exact at 0 and −inf
    assert keep_bias(k, torch.float16).dtype == torch.float16
    half = scores.half()
    assert torch.equal(half + keep_bias(k, torch.float16), half.masked_fill(~k, float("-inf")))
    # rows_of: inside, row i is cell rows[i] (repeats allowed) with nothing captured; after, all is as it was
    cached, cached_empty = ctx.context_bias(2, torch.float32), ctx.context_empty(2)
    hook = ctx.on_probs = lambda *a: None
    rows = torch.tensor([1, 1, 0])
    with ctx.rows_of(rows):
        assert torch.equal(ctx.keep, keep[:2][rows]) and ctx.on_probs is None
        assert torch.equal(ctx.context_bias(2, torch.float32), keep_bias(keep[:2][rows][:, 2].transpose(0, 1)
                                                                          .unsqueeze(2), torch.float32))
        assert torch.equal(ctx.context_empty(2), empty_of(keep[:2][rows], 2))
    assert torch.equal(ctx.keep, keep[:2]) and ctx.on_probs is hook
    assert ctx.context_bias(2, torch.float32) is cached and ctx.context_empty(2) is cached_empty


@pytest.mark.parametrize("dtype, q, gather_from", [
    (torch.float32, 1, None),  # a decode step, the whole context (one-shot)
    (torch.float32, 6, None),  # a question forward over the whole context
    (torch.float32, 6, 1),  # the same, gathered (each cell's kept entries only)
    (torch.bfloat16, 1, None),
    (torch.bfloat16, 6, 1),
])
def test_the_fused_kernel_equals_the_explicit_forms(monkeypatch, dtype, q, gather_from):
    """With PyTorch's fused CPU kernel (the context part in one call, the suffix joined through the log-sum-exp) the
    output equals the explicit scores-softmax-values form, for cells that keep everything, nothing, nothing of one
    KV head only, or a different count per head, and the kernel really ran (and did not, when turned off)."""
    from kvroute.engine.attention import streaming

    g = torch.Generator().manual_seed(11 + q)
    B, Hkv, G, s, T, D = 6, 2, 3, q + 4, 70, 16
    keep = torch.zeros(B, 1, Hkv, T, dtype=torch.bool)
    for b, n in enumerate([T, 0, 30, 45, 12, 60]):
        for h in range(Hkv):
            keep[b, 0, h, torch.randperm(T, generator=g)[: n - 5 * h * (b > 1)]] = True
    keep[2, 0, 1] = False  # a cell that keeps nothing of one KV head only
    k_ctx, v_ctx = (torch.randn(1, Hkv, T, D, generator=g).to(dtype) for _ in range(2))
    query = torch.randn(B, Hkv * G, q, D, generator=g).to(dtype)
    key, value = (torch.randn(B, Hkv, s, D, generator=g).to(dtype) for _ in range(2))
    calls = []
    kernel = streaming.flash_attention_cpu()
    monkeypatch.setattr(streaming, "flash_attention_cpu", lambda: lambda *a, **k: calls.append(1) or kernel(*a, **k))
    outs = {}
    for fused in (False, True):
        monkeypatch.setattr(streaming, "FUSED", fused)
        calls.clear()
        outs[fused] = masked_forward(MaskedContext([k_ctx], [v_ctx], keep, gather_from=gather_from), query, key, value)
        assert bool(calls) == fused
        assert outs[fused].dtype == dtype and bool(torch.isfinite(outs[fused]).all())
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    assert torch.allclose(outs[True].float(), outs[False].float(), atol=tol, rtol=0), \
        (outs[True].float() - outs[False].float()).abs().max()
