"""Captured forwards on the fast backends give the cells that the explicit path gives (kvroute.engine.decode).

Every capture a cell can ask for (the last prompt token's attention rows and hidden states, generated-token masses on
tracked position sets, generated rows and their argmax, the logit lens by ids and by sequences, the gold log-prob,
the question forward's logits), decoded with the ``auto`` rule (captured forwards on the fast backends, the captures
computed beside them) and with fast backends named, against ``attention_backend="reference"`` (every forward explicit,
every capture from its own softmax: the engine's path before): tokens identical, floats within 1e-5 at float32. On
tiny Llama and Qwen2 (head size 16: PyTorch's fused kernel and the gathered form) and a head-64 Llama (the
kept-entries kernel where it builds); a batch of cells with different masks, one keeping a single entry per (layer,
KV head), one keeping nothing, and the full cache. The backend counts show which forwards left the reference.
"""

from __future__ import annotations

import pytest
import torch

from kvroute.engine import DecodeSettings
from kvroute.engine.attention import BACKENDS, ran, ran_since
from kvroute.engine.decode import decode_cells
from kvroute.engine.prefill import prefill
from kvroute.engine.reference import kvpress_prompt_ids
from kvroute.models import tiny_model
from kvroute.presses import KeepMask

CONTEXT = ("Alice Morgan was born in Ferravik in 1987 and works as a glassblower for the Northwind Company. "
           "Her brother lives in Quenby; his manager is Tobias Vell. ") * 3
QUESTION = "Question: where was Alice born? Answer briefly."
NEW = 8


@pytest.fixture(scope="module", params=[("llama", None), ("qwen2", None), ("llama", 64)],
                ids=["llama", "qwen2", "llama-d64"])
def setup(request):
    arch, head_dim = request.param
    lm = tiny_model(arch, seed=0, head_dim=head_dim)
    context, question = kvpress_prompt_ids(lm.tokenizer, CONTEXT, QUESTION)
    pre = prefill(lm.model, context)
    L, Hkv, T = len(pre.keys), pre.keys[0].shape[1], pre.num_tokens
    g = torch.Generator().manual_seed(3)
    single = torch.zeros(L, Hkv, T, dtype=torch.bool)
    single[..., 5] = True  # one entry of every (layer, KV head)
    masks = [KeepMask.full(L, Hkv, T), KeepMask(torch.rand(L, Hkv, T, generator=g) < 0.5, "half", 0.5),
             KeepMask(torch.rand(L, Hkv, T, generator=g) < 0.1, "tenth", 0.9), KeepMask(single, "single", 0.99),
             KeepMask(torch.zeros(L, Hkv, T, dtype=torch.bool), "nothing", 0.999)]
    Q = len(question)
    tok = lm.tokenizer
    kw = dict(gold_ids=tok.encode(" Ferravik", add_special_tokens=False),
              track={"evidence": [3, 5, 11, 40, T - 1], "question": [T + 1, T + Q - 1], "none": []},
              lens_ids=tok.encode(" Ferravik Quenby", add_special_tokens=False),
              lens_seqs=[tok.encode(" Ferravik", add_special_tokens=False), tok.encode(" the Northwind Company",
                                                                                       add_special_tokens=False)])
    return lm, pre, question, masks, kw


def _decode(setup, backend: str, extras: str, draft: list[int] | None = None):
    lm, pre, question, masks, kw = setup
    settings = DecodeSettings(max_new_tokens=NEW, attention_backend=backend, keep_logits=True,
                              argmax=extras == "rows", keep_generated_rows=extras == "rows", draft=draft is not None)
    before = ran()
    outs = decode_cells(lm.model, lm.tokenizer, pre, question, masks, draft=draft, settings=settings, **kw)
    return outs, ran_since(before)


def _same(a, b) -> None:
    """``b`` (a fast path) equals ``a`` (the reference path): tokens exactly, floats within 1e-5."""
    close = dict(atol=1e-5, rtol=0)
    assert b.tokens == a.tokens and b.text == a.text
    assert b.gold_logprob == pytest.approx(a.gold_logprob, abs=1e-5)
    torch.testing.assert_close(b.last_attention, a.last_attention, **close)
    torch.testing.assert_close(b.hidden, a.hidden, **close)
    torch.testing.assert_close(b.logits, a.logits, **close)
    assert b.generated_mass.keys() == a.generated_mass.keys() == {"evidence", "question", "none"}
    for k in a.generated_mass:
        assert a.generated_mass[k].shape == (len(a.tokens) - 1, *a.last_attention.shape[:2])
        torch.testing.assert_close(b.generated_mass[k], a.generated_mass[k], **close)
    torch.testing.assert_close(b.lens_logprob, a.lens_logprob, **close)
    assert torch.equal(b.lens_rank, a.lens_rank)
    torch.testing.assert_close(b.lens_seq_logprob, a.lens_seq_logprob, **close)
    assert (a.generated_rows is None) == (b.generated_rows is None)
    assert (a.generated_argmax is None) == (b.generated_argmax is None)
    if a.generated_rows is not None:
        assert len(b.generated_rows) == len(a.generated_rows) == len(a.tokens) - 1  # one per token fed back
        for x, y in zip(a.generated_rows, b.generated_rows, strict=True):  # float16: one rounding step apart at most
            torch.testing.assert_close(y, x, atol=1e-5, rtol=2**-10)
        assert torch.equal(b.generated_argmax, a.generated_argmax)


def _fast_backends(setup) -> list[str]:
    """The fast backends named here: fused (CPU), sdpa (public), kept where it serves the model's head size."""
    lm = setup[0]
    names = ["fused", "sdpa"]
    if BACKENDS.get("kept").available().ok and lm.info.head_dim in (64, 80, 96, 128, 256):
        names.append("kept")
    return [n for n in names if BACKENDS.get(n).available().ok]


@pytest.mark.parametrize("extras", ["masses", "rows"])
def test_captured_cells_on_the_fast_path_equal_the_reference_path(setup, extras):
    """auto and each fast backend named give the reference path's cells for every capture. With tracked masses (and
    no whole generated rows) no forward runs on the reference; with the rows of every generated token asked for,
    only the decode steps do (their own softmax is the rows), never the question forward."""
    ref, counts = _decode(setup, "reference", extras)
    assert set(counts) == {"reference"}
    L = len(setup[1].keys)
    for backend in ["auto", *_fast_backends(setup)]:
        outs, counts = _decode(setup, backend, extras)
        for a, b in zip(ref, outs, strict=True):
            _same(a, b)
        if backend != "auto":
            assert counts.get(backend, 0) > 0, counts
        elif extras == "masses":
            assert "reference" not in counts, counts
        else:  # every decode step (the batch runs until its longest answer), and no other forward
            assert counts.get("reference", 0) == L * (max(len(o.tokens) for o in outs) - 1), counts
    nothing = ref[-1]  # the cell keeping no context entry puts no mass on the context
    assert torch.equal(nothing.generated_mass["evidence"], torch.zeros_like(nothing.generated_mass["evidence"]))


def test_a_drafts_captured_masses_on_the_fast_path_equal_the_reference_path(setup):
    """Draft verification captures the masses of every draft query in one forward: on the fast path as on the
    reference's, for a draft the full cache reproduces and one wrong from its third token."""
    plain, _ = _decode(setup, "reference", "masses")
    own = plain[0].tokens
    for draft in (own, own[:2] + [(own[2] + 1) % 200] + own[3:]):
        ref, _ = _decode(setup, "reference", "masses", draft=draft)
        fast, counts = _decode(setup, "auto", "masses", draft=draft)
        assert "reference" not in counts, counts
        for a, b, c in zip(plain, ref, fast, strict=True):
            _same(a, b)
            _same(a, c)
