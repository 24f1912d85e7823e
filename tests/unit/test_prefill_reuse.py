"""The prefill answers a scorer's recomputed queries from the forward's own product (kvroute.engine.hooks.RowReuse),
and only where that gives the same numbers bit for bit."""

import pytest
import torch
from torch import nn

import kvroute.engine.hooks as hooks
from kvroute.engine.hooks import RowReuse, _rows_of
from kvroute.engine.prefill import ScoreRequest, prefill
from kvroute.models.tiny import tiny_model
from kvroute.presses.press import build_press


def test_rows_of_finds_row_slices_and_nothing_else():
    base = torch.randn(1, 10, 4)
    assert _rows_of(base, base) == slice(0, 10)
    assert _rows_of(base[:, 3:7], base) == slice(3, 7)
    assert _rows_of(base[:, -2:], base) == slice(8, 10)
    assert _rows_of(base[:, 3:7].clone(), base) is None  # same numbers, other memory
    assert _rows_of(base[:, 3:7, :2], base) is None  # columns cut
    assert _rows_of(base.transpose(1, 2)[:, :, 1:3], base) is None
    assert _rows_of(base.view(10, 4)[2:5], base) is None  # another layout of the same memory
    assert _rows_of(base[:, 2:5].double(), base) is None
    wide = torch.randn(1, 10, 8)
    assert _rows_of(wide[:, :, :4], base) is None


def _linear():
    torch.manual_seed(0)
    lin = nn.Linear(16, 8, bias=False)
    x = torch.randn(1, 40, 16)
    return lin, x, lin(x)


def test_row_calls_get_the_forwards_rows_after_one_checked_multiply():
    lin, x, y = _linear()
    calls = []
    lin.register_forward_pre_hook(lambda m, a: calls.append(a[0].shape))
    reuse = RowReuse(min_rows=4)
    with torch.no_grad(), reuse.rows(lin, x, y):
        first = lin(x[:, 5:])  # multiplied and compared with the forward's rows
        again = lin(x[:, 5:])
        small = lin(x[:, :3])  # below min_rows: multiplied
        other = lin(torch.randn(1, 35, 16))  # not a view of the input: multiplied
    assert torch.equal(first, y[:, 5:]) and torch.equal(again, y[:, 5:])
    assert again.data_ptr() != y.data_ptr()  # a tensor of its own
    assert reuse.equal == {(1, 35, 16): True}
    assert small.shape == (1, 3, 8) and other.shape == (1, 35, 8)
    assert "forward" not in vars(lin)  # the instance is as before
    assert len(calls) == 4  # the hooks still see every call


def test_a_product_that_differs_is_never_reused():
    lin, x, y = _linear()
    wrong = y + 1e-3  # as if the BLAS summed the forward's rows in another order
    reuse = RowReuse(min_rows=4)
    with torch.no_grad(), reuse.rows(lin, x, wrong):
        a = lin(x[:, 5:])
        b = lin(x[:, 5:])
    assert reuse.equal == {(1, 35, 16): False}
    assert torch.equal(a, y[:, 5:]) and torch.equal(b, y[:, 5:])


def test_a_forward_set_on_the_instance_is_restored():
    lin, x, y = _linear()
    own = lin.forward
    lin.forward = own  # e.g. a hook library's wrapper
    with RowReuse().rows(lin, x, y):
        pass
    assert vars(lin)["forward"] is own


# press -> products of q_proj per prefill with reuse, beyond the forward's one per layer (3 layers, 700 tokens)
RECOMPUTED = {
    "expected_attention": 1,  # all but the 4 sink rows: checked on the first layer, reused on the others
    "snapkv[window_size=300]": 1,  # the last 300 rows
    # chunks of 300, 300, 100 rows (sinks off each): the 296-row shape checked once, the 96-row one below REUSE_ROWS
    "expected_attention+chunk[chunk_length=300]": 1 + 3,
}


@pytest.mark.parametrize("press", sorted(RECOMPUTED))
def test_prefill_scores_are_bitwise_those_without_reuse(press, monkeypatch):
    """A context long enough for reuse: every score as with the queries recomputed (kvpress's own computation)."""
    lm = tiny_model("llama", seed=1, hidden=64)
    ids = torch.randint(5, lm.model.config.vocab_size, (700,), generator=torch.Generator().manual_seed(3))
    req = [ScoreRequest.for_press(build_press(press), 0.5)]
    multiplied = []  # rows of every q_proj product computed
    linear = nn.functional.linear
    weights = {id(layer.self_attn.q_proj.weight) for layer in lm.model.model.layers}

    def counted(x, w, b=None):
        if id(w) in weights:
            multiplied.append(x.shape[-2])
        return linear(x, w, b)

    monkeypatch.setattr(torch.nn.modules.linear.F, "linear", counted)
    with torch.inference_mode():
        ours = prefill(lm.model, ids, req)
        n_reused = len(multiplied)
        multiplied.clear()
        monkeypatch.setattr(hooks, "REUSE_ROWS", 10**9)
        monkeypatch.setattr(RowReuse.__init__, "__defaults__", (10**9,))
        plain = prefill(lm.model, ids, req)
    assert ours.scores.keys() == plain.scores.keys()
    for k in plain.scores:
        assert torch.equal(ours.scores[k], plain.scores[k]), k
    layers = len(lm.model.model.layers)
    assert n_reused == layers + RECOMPUTED[press]
    assert len(multiplied) > n_reused  # without reuse, the scorer multiplies on every layer
