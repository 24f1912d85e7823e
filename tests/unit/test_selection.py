"""Selection strategies on hand-built score tensors (no model)."""

import pytest
import torch

from kvroute.errors import ConfigError, EngineError
from kvroute.presses import build_selection
from kvroute.presses.selection.adakv import adakv_layer
from kvroute.presses.selection.base import FULL, ScoreVariant
from kvroute.presses.selection.pyramid import pyramid_budgets
from kvroute.presses.selection.routes import routes_layer


def test_per_head_keeps_each_heads_top_k():
    s = torch.tensor([[[5.0, 1, 4, 2, 3], [1.0, 5, 2, 4, 3]]])  # [1, 2, 5]
    m = build_selection("per_head").select(s, 0.6)  # k = int(5 * 0.4) = 2
    assert m.tolist() == [[[True, False, True, False, False], [False, True, False, True, False]]]


def test_adakv_shares_the_budget_across_heads_with_a_safeguard():
    s = torch.tensor([[10.0, 9, 8, 7], [0.1, 0.2, 0.3, 0.4]])  # head 0 dominates
    keep = adakv_layer(s.unsqueeze(0), k=2, alpha_safeguard=0.5)[0]  # budget 4, safeguard 1 each
    assert int(keep.sum()) == 4
    assert keep[1].tolist() == [False, False, False, True]  # only its safeguarded best
    assert keep[0].tolist() == [True, True, True, False]


def test_routes_covers_tokens_adakv_evicts_everywhere():
    # both heads love tokens 0-2; token 3 is second choice of head 1 only; token 4 nobody's
    s = torch.tensor([[9.0, 8, 7, 1, 0], [9.0, 8, 7, 6.5, 0]])
    ada = adakv_layer(s.unsqueeze(0), k=2, alpha_safeguard=0.0)[0]
    rts = routes_layer(s, k=2, alpha_safeguard=0.0, coverage=1.0)
    assert int(ada.sum()) == int(rts.sum()) == 4  # same budget
    assert ada.any(0).sum() == 2  # AdaKV spends it twice on tokens 0 and 1
    assert rts.any(0).sum() == 4  # routes keeps four distinct tokens, each once
    assert rts[1, 3]  # token 3 sits in the head that scores it highest


def test_routes_with_zero_coverage_is_adakv_budget():
    g = torch.Generator().manual_seed(0)
    s = torch.rand(3, 20, generator=g)
    rts = routes_layer(s, k=5, alpha_safeguard=0.2, coverage=0.0)
    ada = adakv_layer(s.unsqueeze(0), k=5, alpha_safeguard=0.2)[0]
    assert torch.equal(rts, ada)


def test_shared_keeps_the_same_tokens_in_every_head():
    g = torch.Generator().manual_seed(1)
    m = build_selection("shared").select(torch.rand(2, 3, 10, generator=g), 0.5)
    assert torch.equal(m, m[:, :1].expand_as(m))
    assert bool((m.sum(-1) == 5).all())


def test_chunk_keeps_inside_each_chunk():
    s = torch.arange(12.0).view(1, 1, 12)
    m = build_selection("chunk[chunk_length=4]").select(s, 0.5)
    assert m[0, 0].tolist() == [False, False, True, True] * 3


def test_pyramid_budgets_sum_to_the_uniform_total_and_decrease():
    b = pyramid_budgets(1000, 8, 0.5, window_size=64, beta=20)
    assert b == sorted(b, reverse=True) and b[0] > b[-1]
    assert abs(sum(b) - 8 * 500) <= 8
    assert pyramid_budgets(50, 4, 0.5) == [25] * 4  # too short for a pyramid: uniform


@pytest.mark.parametrize("spec,msg", [("adakv[alpha_safeguard=2]", "alpha_safeguard"),
                                      ("chunk[chunk_length=0]", "chunk_length"),
                                      ("routes[coverage=1.5]", "coverage")])
def test_bad_parameters(spec, msg):
    with pytest.raises(ConfigError, match=msg):
        build_selection(spec)


def test_zero_budget_is_refused():
    with pytest.raises(EngineError, match="keeps 0 of 10"):
        build_selection("per_head").select(torch.rand(1, 1, 10), 0.95)


def test_chunk_bounds_merge_a_tail_too_short_for_the_scorer():
    from kvroute.presses.selection.chunk import chunk_bounds

    assert chunk_bounds(10, 4) == [(0, 4), (4, 8), (8, 10)]  # kvpress's chunks when every chunk is scorable
    assert chunk_bounds(10, 4, min_last=3) == [(0, 4), (4, 10)]
    assert chunk_bounds(3, 4, min_last=5) == [(0, 3)]  # a single chunk is the scorer's own precondition


def test_press_tells_chunk_its_scorers_minimum():
    from kvroute.presses import build_press

    p = build_press("expected_attention+chunk[chunk_length=128]")
    assert p.selection.score_variant() == ScoreVariant("chunk", (128, 5))  # n_sink=4: kvpress needs more than 4
    assert p.name == "expected_attention+chunk[chunk_length=128]"
    assert build_press("expected_attention+chunk[rescore=false]").selection.score_variant() == FULL
    assert build_press("knorm+block[block_size=8]").selection.score_variant() == ScoreVariant("block", (8,))


def test_equal_presses_share_one_score_request_and_others_do_not():
    from kvroute.engine.prefill import ScoreRequest
    from kvroute.presses import build_press

    a = ScoreRequest.for_press(build_press("expected_attention"), 0.5)
    assert a.key == ScoreRequest.for_press(build_press("expected_attention+adakv"), 0.9).key  # both whole-context
    assert a.key != ScoreRequest.for_press(build_press("expected_attention+chunk[chunk_length=64]"), 0.5).key
    assert a.key.ratio is None  # expected attention does not read the ratio
    c = ScoreRequest.for_press(build_press("compactor"), 0.5)  # blending = the ratio: scored per ratio
    assert c.key.ratio == 0.5 and c.key != ScoreRequest.for_press(build_press("compactor"), 0.9).key
