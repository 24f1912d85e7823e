"""Every registered selection strategy, read from the registry: shape, ratio 0, and the budget it promises.

A selection registered later is in these tests the moment it is registered; ``BUDGETS`` must say how
many entries it keeps (the test fails for a selection without an entry), so none can land without
its budget being checked on scores drawn here. Scores come from each selection's own
``score_layer`` (block rescores subsets), with a key-norm scorer on random tensors and random value
norms for the CriticalKV selections' auxiliary score.
"""

from dataclasses import dataclass
from typing import ClassVar

import pytest
import torch

from kvroute.presses import SELECTIONS, build_selection
from kvroute.presses.scorers.base import ScoreInputs, Scorer
from kvroute.presses.selection.chunk import chunk_bounds
from kvroute.presses.selection.pyramid import pyramid_budgets

L, HKV, T, D, HIDDEN = 3, 2, 48, 8, 16
RATIOS = (0.1, 0.25, 0.5, 0.75, 0.9)


@dataclass
class KeyNorm(Scorer):
    name: ClassVar[str] = "test_keynorm"

    def score(self, x, ratio):
        return -x.keys.norm(dim=-1)  # [1, Hkv, T]


def _k(ratio):
    return int(T * (1 - ratio))


def per_head(m, spec, ratio):
    assert (m.sum(-1) == _k(ratio)).all()


def cross_head(m, spec, ratio):  # the layer's budget Hkv·k, shared between heads
    assert (m.sum((1, 2)) == HKV * _k(ratio)).all()


def chunked(m, spec, ratio):
    sel = build_selection(spec)
    want = sum(max(1, int((j - i) * (1 - ratio))) for i, j in chunk_bounds(T, sel.chunk_length))
    assert (m.sum(-1) == want).all()


def whole_chunks(m, spec, ratio):
    n = build_selection(spec).chunk_length
    assert torch.equal(m, m[:, :1].expand_as(m))  # the same tokens in every head
    for layer in m[:, 0]:
        kept = layer.view(-1, n) if T % n == 0 else None
        assert kept is not None and bool((kept.all(-1) | ~kept.any(-1)).all())  # chunks kept whole or not at all
        assert int(layer.sum()) == n * max(1, int((T // n) * (1 - ratio)))


def pyramid(m, spec, ratio):
    sel = build_selection(spec)
    want = pyramid_budgets(T, L, ratio, sel.window_size, sel.beta)
    assert m.sum(-1).tolist() == [[b] * HKV for b in want]


def model_wide(m, spec, ratio):
    if build_selection(spec).per_layer:
        assert (m.sum((1, 2)) == HKV * T - int(HKV * T * ratio)).all()
    else:
        assert int(m.sum()) == L * HKV * T - int(L * HKV * T * ratio)


def shared(m, spec, ratio):
    per_head(m, spec, ratio)
    assert torch.equal(m, m[:, :1].expand_as(m))


# name -> (specs to draw, the budget check)
BUDGETS = {
    "per_head": (("per_head",), per_head),
    "adakv": (("adakv", "adakv[alpha_safeguard=0.6]"), cross_head),
    "routes": (("routes", "routes[coverage=1.0]"), cross_head),
    "shared": (("shared",), shared),
    "chunk": (("chunk[chunk_length=10]", "chunk[chunk_length=16,rescore=false]"), chunked),
    "chunkkv": (("chunkkv[chunk_length=8]", "chunkkv[chunk_length=12]"), whole_chunks),
    "block": (("block[block_size=8]", "block[block_size=100]"), per_head),
    "criticalkv": (("criticalkv", "criticalkv[first_stage_ratio=0]", "criticalkv[first_stage_ratio=1]"), per_head),
    "critical_adakv": (("critical_adakv", "critical_adakv[alpha_safeguard=1.0]"), cross_head),
    "pyramid": (("pyramid[window_size=4]", "pyramid"), pyramid),
    "global": (("global", "global[per_layer=true]"), model_wide),
    "entropy_chunkkv": (("entropy_chunkkv", "entropy_chunkkv[chunk_length=7,low_entropy_chunk_length=2]"), shared),
}


def test_every_registered_selection_has_a_budget_check():
    assert set(SELECTIONS.names()) == set(BUDGETS), (
        "a new selection strategy needs an entry in BUDGETS: the specs to draw and the number of entries it keeps")


def _masks(spec, ratio, seed=0):
    g = torch.Generator().manual_seed(seed)
    keys = torch.randn(L, 1, HKV, T, D, generator=g)
    hidden = torch.randn(L, 1, T, HIDDEN, generator=g)
    sel = build_selection(spec)
    scorer = KeyNorm()
    scores = torch.cat([sel.score_layer(scorer, ScoreInputs(None, i, hidden[i], keys[i], keys[i], {}), ratio)
                        for i in range(L)])  # [L, Hkv, T]
    aux = {name: torch.rand(L, HKV, T, generator=g) + 0.1 for name in sel.aux_scorers()}
    mask = sel.select_aux(scores, ratio, aux) if aux else sel.select(scores, ratio)
    return sel, mask


@pytest.mark.parametrize("name", sorted(BUDGETS))
def test_selection_shape_ratio_zero_and_budget(name):
    specs, check = BUDGETS[name]
    for spec in specs:
        assert build_selection(spec).name == name
        sel, full = _masks(spec, 0.0)
        assert full.dtype == torch.bool and full.shape == (L, HKV, T), spec
        assert bool(full.all()), f"{spec}: ratio 0 must keep everything"
        for ratio in RATIOS:
            _, m = _masks(spec, ratio)
            assert m.dtype == torch.bool and m.shape == (L, HKV, T), (spec, ratio)
            check(m, spec, ratio)
            assert torch.equal(m, _masks(spec, ratio)[1]), f"{spec}: not deterministic"


def test_block_with_one_block_is_per_head_top_k():
    """A block as long as the context: one step rescores every token in order, i.e. plain per-head top-k."""
    for ratio in RATIOS:
        assert torch.equal(_masks("block[block_size=1000]", ratio)[1], _masks("per_head", ratio)[1]), ratio


def test_criticalkv_with_all_of_the_budget_in_stage_one_is_per_head_top_k():
    g = torch.Generator().manual_seed(3)
    s = torch.rand(L, HKV, T, generator=g)
    crit = build_selection("criticalkv[first_stage_ratio=1]").select_aux(s, 0.5, {"value_norm": torch.rand(L, HKV, T)})
    assert torch.equal(crit, build_selection("per_head").select(s, 0.5))


def test_criticalkv_stage_two_ranks_by_value_weighted_scores():
    s = torch.tensor([[[1.0, 0.9, 0.8, 0.1]]])  # [1, 1, 4]
    norms = torch.tensor([[[1.0, 0.1, 0.1, 100.0]]])  # token 3's value moves the output most
    keep = build_selection("criticalkv[first_stage_ratio=0.5]").select_aux(s, 0.5, {"value_norm": norms})
    assert keep[0, 0].tolist() == [True, False, False, True]  # stage 1: token 0; stage 2: token 3 (0.1·100)


def test_global_takes_more_from_the_layer_that_scores_low():
    s = torch.stack([torch.full((HKV, T), 5.0), torch.full((HKV, T), 1.0)]) + torch.rand(2, HKV, T) * 0.01
    m = build_selection("global").select(s, 0.5)
    assert bool(m[0].all()) and not bool(m[1].any())  # the whole half evicted from layer 1
