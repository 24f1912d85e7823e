"""Serving constraints (paged, uniform, layer_budget) on hand-built scores with known masks."""

from __future__ import annotations

import pytest
import torch

from kvroute.errors import ConfigError, EngineError
from kvroute.presses import build_press, parse_press
from kvroute.presses.constraints import CONSTRAINTS, Paged, Uniform, constrain, constrained_budgets
from kvroute.presses.spec import CONSTRAINT_NAMES


def mask_of(press: str, scores: torch.Tensor, ratio: float) -> torch.Tensor:
    return build_press(press).keep_mask(scores, ratio).mask


def rows(*values: list[float]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float)


def test_constraint_names_are_the_registered_ones():
    assert set(CONSTRAINTS.names()) == CONSTRAINT_NAMES


def test_spec_parses_constraints_after_an_optional_selection():
    ps = parse_press("snapkv[window_size=16]+paged[block=16]+uniform")
    assert ps.selection is None and [c.name for c in ps.constraints] == ["paged", "uniform"]
    ps = parse_press("expected_attention+adakv+paged[block=64,agg=max]")
    assert ps.selection is not None and ps.selection.name == "adakv"
    assert dict(ps.constraints[0].params) == {"agg": "max", "block": 64}
    assert build_press("knorm+paged[block=16]+uniform").name == "knorm+per_head+paged[block=16]+uniform"
    assert build_press("knorm+global+layer_budget").name == "knorm+global+layer_budget"


def test_paged_keeps_whole_blocks_per_head():
    # T=8, block 4, ratio 0.5 -> k = 4: head 0 keeps its second block, head 1 its first
    s = rows([1, 1, 1, 1, 5, 5, 5, 5], [9, 9, 9, 9, 2, 2, 2, 2]).unsqueeze(0)  # [1, 2, 8]
    m = mask_of("knorm+paged[block=4]", s, 0.5)
    assert m[0, 0].tolist() == [False] * 4 + [True] * 4
    assert m[0, 1].tolist() == [True] * 4 + [False] * 4


def test_the_last_kept_block_is_partial_with_its_best_tokens():
    # k = int(8 * 0.25) = 6 → the best block whole, then the 2 best tokens of the next one
    s = rows([1, 4, 3, 2, 9, 9, 9, 9]).view(1, 1, 8)
    m = mask_of("knorm+paged[block=4]", s, 0.25)
    assert m[0, 0].tolist() == [False, True, True, False, True, True, True, True]
    with pytest.raises(EngineError, match="not a whole number of 4-token blocks.*partial=true"):
        mask_of("knorm+paged[block=4,partial=false]", s, 0.25)
    assert mask_of("knorm+paged[block=4,partial=false]", s, 0.5)[0, 0].tolist() == [False] * 4 + [True] * 4


def test_block_aggregation_mean_or_max_and_a_short_last_block():
    # T=10, block 4: blocks [0,4) [4,8) [8,10); block means 2.5, 1, 3 (the short block over its 2 tokens);
    # maxes 7, 1, 3. k = int(10 * 0.6) = 6.
    s = rows([7, 1, 1, 1, 1, 1, 1, 1, 3, 3]).view(1, 1, 10)
    mean = mask_of("knorm+paged[block=4]", s, 0.4)[0, 0]  # short block (2) whole, then block 0 whole = 6
    assert mean.tolist() == [True] * 4 + [False] * 4 + [True] * 2
    # k = int(2.5) = 2: by the mean the short block (3) ranks first; a sum (10 for block 0) would keep tokens of block 0
    assert mask_of("knorm+paged[block=4]", s, 0.75)[0, 0].tolist() == [False] * 8 + [True] * 2
    mx = mask_of("knorm+paged[block=4,agg=max]", s, 0.5)[0, 0]  # k = 5: block 0 (max 7) whole, then 1 of block 2
    assert mx.sum() == 5 and mx[:4].all() and mx[8:].sum() == 1 and not mx[4:8].any()


def test_uniform_keeps_the_head_summed_top_k_in_every_head():
    # per head the tops differ; summed over heads token 2 (3+3) and token 0 (5+0) lead
    s = rows([5, 0, 3, 1], [0, 4, 3, 1]).unsqueeze(0)  # [1, 2, 4], sums 5, 4, 6, 2
    m = mask_of("knorm+uniform", s, 0.5)
    assert m[0, 0].tolist() == m[0, 1].tolist() == [True, False, True, False]
    mx = mask_of("knorm+uniform[agg=max]", s, 0.5)  # maxes 5, 4, 3, 1
    assert mx[0, 0].tolist() == [True, True, False, False]


def test_paged_uniform_sums_block_scores_over_heads():
    # blocks of 2: head 0 prefers block 1, head 1 block 0 by more → head-uniform keeps block 0 everywhere
    s = rows([1, 1, 2, 2, 0, 0], [6, 6, 0, 0, 0, 0]).unsqueeze(0)
    m = mask_of("knorm+paged[block=2]+uniform", s, 0.5)  # k = 3: block 0 whole + best token of block 1
    assert m[0, 0].tolist() == m[0, 1].tolist()
    assert m[0, 0, :2].all() and m[0, 0, 2:4].sum() == 1 and not m[0, 0, 4:].any()


def test_order_does_not_matter_for_mean_and_sum_but_does_for_max():
    g = torch.Generator().manual_seed(0)
    s = torch.rand(3, 4, 64, generator=g)
    for r in (0.3, 0.5, 0.8):
        assert torch.equal(mask_of("knorm+paged[block=8]+uniform", s, r), mask_of("knorm+uniform+paged[block=8]", s, r))
    # max over the block, then summed over heads (2 + 2 = 4 for block 1) vs max of the head sums (3 for block 0)
    t = rows([3, 0, 2, 0], [0, 0, 0, 2]).unsqueeze(0)  # blocks of 2; head sums [3, 0, 2, 2]
    paged_first = mask_of("knorm+paged[block=2,agg=max]+uniform", t, 0.5)[0, 0].tolist()
    uniform_first = mask_of("knorm+uniform+paged[block=2,agg=max]", t, 0.5)[0, 0].tolist()
    assert paged_first == [False, False, True, True] and uniform_first == [True, True, False, False]


@pytest.mark.parametrize("press", ["knorm+paged[block=16]", "knorm+paged[block=7]+uniform", "knorm+uniform",
                                   "knorm+adakv+paged[block=16]", "knorm+adakv+uniform", "knorm+chunk+paged[block=5]",
                                   "knorm+adakv+paged[block=16,agg=max]+uniform"])
def test_exactly_the_press_own_budget_per_head(press):
    g = torch.Generator().manual_seed(1)
    s = torch.rand(4, 3, 100, generator=g)
    base = build_press(press.split("+paged")[0].split("+uniform")[0])
    for r in (0.1, 0.33, 0.5, 0.77, 0.9, 0.95):
        want = base.keep_mask(s, r).mask.sum(-1)  # [L, Hkv]
        got = mask_of(press, s, r)
        if "uniform" in press:
            want = (want.sum(1, keepdim=True) // 3).expand(4, 3)
            assert (got == got[:, :1]).all()  # the same tokens in every head
        assert torch.equal(got.sum(-1), want)
        assert int(want[0, 0]) <= int(100 * (1 - r)) or "adakv" in press


def test_layer_budget_equalises_layers_and_keeps_the_head_split():
    kept = torch.tensor([[6, 2], [1, 1], [3, 3]])  # total 16 over 3 layers -> 5 per layer
    b = constrained_budgets(kept, [build_selection_constraint("layer_budget")], T=10)
    assert b.sum(1).tolist() == [5, 5, 5]
    assert b.tolist() == [[4, 1], [3, 2], [3, 2]]  # largest remainder; a tie goes to the lower head
    g = torch.Generator().manual_seed(2)
    s = torch.rand(3, 2, 40, generator=g) * torch.tensor([10.0, 1.0, 0.1]).view(3, 1, 1)  # layer 0 dominates globally
    m = mask_of("knorm+global+layer_budget", s, 0.7)
    total = int(mask_of("knorm+global", s, 0.7).sum())
    assert m.sum((1, 2)).tolist() == [total // 3] * 3
    assert torch.equal(mask_of("knorm+adakv+layer_budget", s, 0.7), mask_of("knorm+adakv", s, 0.7))  # already equal


def build_selection_constraint(name: str):
    from kvroute.presses.constraints import build_constraint

    return build_constraint(name)


def test_a_block_aligned_head_uniform_mask_is_left_as_it_is():
    g = torch.Generator().manual_seed(3)
    s = torch.rand(3, 4, 96, generator=g)  # six 16-token blocks
    for r in (0.25, 0.5, 0.7, 0.9):
        chunk = mask_of("knorm+chunkkv[chunk_length=16]", s, r)
        assert torch.equal(mask_of("knorm+chunkkv[chunk_length=16]+paged[block=16]+uniform", s, r), chunk)


def test_oracle_with_max_keeps_every_evidence_block():
    g = torch.Generator().manual_seed(4)
    s = torch.rand(2, 3, 128, generator=g)
    evidence = [5, 40, 41, 100]
    s[..., evidence] += (s.max() - s.min()).item() + 1.0  # the oracle's shift (kvroute.presses.scorers.oracle)
    m = mask_of("knorm+paged[block=16,agg=max]", s, 0.7)  # k = 38: the three evidence blocks (48) do not all fit
    blocks = m.view(2, 3, 8, 16).any(-1)
    assert blocks[..., 0].all() and blocks[..., 2].all()  # the two best blocks whole
    m = mask_of("knorm+paged[block=16,agg=max]", s, 0.6)  # k = 51 ≥ 48: every evidence token's block whole
    assert m.view(2, 3, 8, 16)[..., [0, 2, 6], :].all()


def test_kvpress_chunkkv_coincides_only_where_the_ratio_keeps_whole_chunks():
    g = torch.Generator().manual_seed(5)
    s = torch.rand(2, 3, 64, generator=g)
    for r in (0.25, 0.5, 0.75):  # 4 chunks: int(4 · (1 − α)) · 16 = int(64 · (1 − α))
        assert torch.equal(mask_of("knorm+paged[block=16]+uniform", s, r),
                           mask_of("knorm+chunkkv[chunk_length=16]", s, r))
    # α = 0.9: kvpress keeps max(1, int(4 · 0.1)) = 1 whole chunk (16 tokens), the budget is int(6.4) = 6
    assert mask_of("knorm+chunkkv[chunk_length=16]", s, 0.9).sum(-1).unique().tolist() == [16]
    assert mask_of("knorm+paged[block=16]+uniform", s, 0.9).sum(-1).unique().tolist() == [6]


def test_bad_input_gives_one_line_each():
    s = torch.rand(1, 2, 40)
    with pytest.raises(EngineError, match="a block of 64 tokens is larger than the 40-token context"):
        mask_of("knorm+paged[block=64]", s, 0.5)
    with pytest.raises(ConfigError, match="ranks by more than the press's per-token scores"):
        build_press("knorm+criticalkv+paged[block=16]")
    with pytest.raises(ConfigError, match="iteratively"):
        build_press("knorm+block+uniform")
    with pytest.raises(ConfigError, match="appears 2 times"):
        build_press("knorm+paged[block=16]+paged[block=64]")
    with pytest.raises(ConfigError, match="only serving constraints may"):
        parse_press("knorm+adakv+chunk")
    with pytest.raises(ConfigError, match="agg must be one of mean, max"):
        build_press("knorm+paged[agg=median]")
    with pytest.raises(ConfigError, match="block must be an integer >= 1"):
        build_press("knorm+paged[block=0]")


def test_constrain_on_plain_tensors_matches_the_press():
    g = torch.Generator().manual_seed(6)
    s = torch.rand(2, 2, 50, generator=g)
    kept = torch.full((2, 2), 20)
    m = constrain(s, kept, [Paged(block=8), Uniform()])
    assert torch.equal(m, mask_of("knorm+paged[block=8]+uniform", s, 0.6))
