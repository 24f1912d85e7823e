"""The gathered masked attention (each cell over its kept entries only) equals the one-shot form, captures included;
cells are grouped by kept count and groups split to fit the budget, by cells and then by query rows."""

from __future__ import annotations

import pytest
import torch

from kvroute.engine.attention import MaskedContext
from kvroute.engine.attention.gather import gathered_bytes, gathered_context_attention, kept_groups
from tests.attention_call import masked_forward


def _keep(B: int, Hkv: int, T: int, g: torch.Generator) -> torch.Tensor:
    """[B, 1, Hkv, T]: cells at several ratios with exact per-head budgets (as a scorer press), one cell keeping
    everything, one keeping nothing, one with a different count per head (as AdaKV)."""
    keep = torch.zeros(B, 1, Hkv, T, dtype=torch.bool)
    for b in range(B):
        for h in range(Hkv):
            n = [T, 0, T // 3 + 7 * h][b] if b < 3 else int(T * (1 - 0.1 * (1 + b % 9)))
            keep[b, 0, h, torch.randperm(T, generator=g)[:n]] = True
    return keep


@pytest.mark.parametrize("B, Hkv, G, q, s, T, D, own", [
    (6, 2, 3, 5, 7, 50, 16, False),  # GQA, a question forward (q = 5 of s = 7 suffix positions)
    (12, 1, 1, 4, 4, 33, 8, False),  # no GQA, the whole suffix is the question
    (5, 2, 2, 6, 9, 200, 32, True),  # a draft forward: some suffix slots rejected
])
def test_gathered_equals_one_shot_with_the_same_captured_rows(B, Hkv, G, q, s, T, D, own):
    g = torch.Generator().manual_seed(B * 100 + T)
    k_ctx, v_ctx = torch.randn(1, Hkv, T, D, generator=g), torch.randn(1, Hkv, T, D, generator=g)
    keep = _keep(B, Hkv, T, g)
    query = torch.randn(B, Hkv * G, q, D, generator=g)
    key, value = torch.randn(B, Hkv, s, D, generator=g), torch.randn(B, Hkv, s, D, generator=g)
    suffix_keep = None
    if own:
        suffix_keep = torch.ones(B, s, dtype=torch.bool)
        suffix_keep[:, 1:3] = torch.rand(B, 2, generator=g) > 0.5
    seen: dict[str, torch.Tensor] = {}

    def ctx(name: str, gather_from: int | None, budget: int | None = None) -> MaskedContext:
        return MaskedContext([k_ctx], [v_ctx], keep, lambda _, r, __: seen.__setitem__(name, r), q - 1,
                             suffix_keep=suffix_keep, gather_from=gather_from, budget=budget)

    one = masked_forward(ctx("one", None), query, key, value)
    below, at = masked_forward(ctx("below", q + 1), query, key, value), masked_forward(ctx("at", q), query, key, value)
    assert not below.equal(at)
    gathered = masked_forward(ctx("gathered", q), query, key, value)
    one_cell = gathered_bytes(1, Hkv, G * q, T, s, D, 4)
    split = masked_forward(ctx("split", q, budget=one_cell), query, key, value)  # every group split to one cell
    kv = gathered_bytes(1, Hkv, 0, T, s, D, 4)
    rows = masked_forward(ctx("rows", q, budget=kv + (one_cell - kv) // 3), query, key, value)  # cells in row slices
    assert gathered.shape == one.shape == (B, q, Hkv * G, D)
    torch.testing.assert_close(gathered, one, atol=1e-5, rtol=0)
    torch.testing.assert_close(split, gathered, atol=1e-6, rtol=0)
    torch.testing.assert_close(rows, gathered, atol=1e-6, rtol=0)
    torch.testing.assert_close(seen["gathered"], seen["one"], atol=1e-6, rtol=0)
    assert torch.allclose(seen["one"].sum(-1), torch.ones(B, Hkv * G))  # rows are distributions


def test_gathered_attention_reads_only_kept_entries():
    """Poisoning every masked context entry (keys and values) changes nothing: the kept entries alone decide."""
    g = torch.Generator().manual_seed(3)
    B, Hkv, G, q, T, D = 4, 2, 2, 5, 40, 8
    k_ctx, v_ctx = torch.randn(Hkv, T, D, generator=g), torch.randn(Hkv, T, D, generator=g)
    keep = _keep(B, Hkv, T, g)[:, 0].transpose(0, 1).unsqueeze(2)  # [Hkv, B, 1, T]
    keep[:, 0] = keep[:, 3]  # no cell keeps the whole context
    qg = torch.randn(B, Hkv, G * q, D, generator=g)
    key, value = torch.randn(B, Hkv, q, D, generator=g), torch.randn(B, Hkv, q, D, generator=g)
    out = gathered_context_attention(qg, k_ctx, v_ctx, keep, key, value, q=q, scale=D**-0.5)
    # an entry masked for every cell of its KV head is read by nobody: NaN there must not reach the output
    nobody = ~keep[:, :, 0].any(1)  # [Hkv, T]
    assert nobody.any()
    k_bad, v_bad = k_ctx.clone(), v_ctx.clone()
    k_bad[nobody], v_bad[nobody] = float("nan"), float("nan")
    poisoned = gathered_context_attention(qg, k_bad, v_bad, keep, key, value, q=q, scale=D**-0.5)
    assert torch.equal(poisoned, out)


def test_kept_groups_pad_at_most_the_share():
    counts = [2000, 1000, 1900, 1790, 0, 1000, 950, 10]
    groups = kept_groups(counts, share=0.9)
    assert sorted(b for grp in groups for b in grp) == list(range(len(counts)))
    for grp in groups:
        assert all(counts[b] >= 0.9 * counts[grp[0]] for b in grp)
        assert counts[grp[0]] == max(counts[b] for b in grp)
    assert groups == [[0, 2], [3], [1, 5, 6], [7], [4]]


@pytest.mark.parametrize("budget, cells, rows", [
    (None, 7, 300),  # no budget: one slice
    (10**12, 7, 300),  # all fit
    ("two", 2, 300),  # two cells' worth: slices of two cells
    ("one-third", 1, 100),  # a third of one cell's rows (beside its gathered K/V): one cell, rows in thirds
    (1, 1, 1),  # nothing fits: one row of one cell
])
def test_slices_split_cells_then_rows(budget, cells, rows):
    from kvroute.engine.attention.gather import _slices
    args = (300, 1000, 20, 4, 64, 4)  # R, width, s, Hkv, D, dtype bytes
    one = gathered_bytes(1, 4, 300, 1000, 20, 64, 4)
    kv = gathered_bytes(1, 4, 0, 1000, 20, 64, 4)
    b = {"two": 2 * one + 1, "one-third": kv + (one - kv) // 3}.get(budget, budget)  # type: ignore[arg-type]
    assert _slices(7, *args, b) == (cells, rows)
    step, r = _slices(7, *args, b)
    if b is not None and b >= kv + (one - kv) // 300:  # a slice fits the budget wherever one row does
        assert gathered_bytes(step, 4, r, 1000, 20, 64, 4) <= b
