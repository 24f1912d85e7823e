"""Every attention backend equals the reference (kvroute.engine.attention): one layer's forward, float32, within 1e-5.

At head sizes 64, 128 and 256, GQA groups of 1, 4 and 8 query heads per KV head, a question forward (20 queries per
cell) and a decode step (one), over a batch whose cells keep nothing, one entry of each KV head, or about half, and a
batch whose cells keep everything. The kept-entries kernel must run where it can be built: without AVX-512 or a
compiler its cases skip, except under CI=true, where a missing kernel is a failure. Also: the ``auto`` rule's choices,
the backend a setting names, the environment overrides, and the names a wrong setting gets.
"""

from __future__ import annotations

import os

import pytest
import torch

from kvroute.engine.attention import (
    BACKENDS,
    AttentionCall,
    MaskedContext,
    choose,
    ran,
    ran_since,
    resolve_backend,
)
from kvroute.engine.attention.kept import kept_applies, kernel
from kvroute.engine.attention.streaming import row_scores
from kvroute.errors import UnknownNameError
from kvroute.settings import ATTENTION_BACKENDS, RunSettings
from tests.attention_call import masked_forward

HEAD_DIMS = (64, 128, 256)
GROUPS = (1, 4, 8)
OTHERS = [n for n in BACKENDS.names() if n != "reference"]


def _call(D: int, G: int, q: int, cells: str, *, on_probs=None, chunk: int | None = 16,
          backend: str = "auto", gather_from: int | None = 16, on_masses=None, sets=(), query: int | None = -1,
          own: torch.Tensor | None = None) -> AttentionCall:
    """One layer's forward of B cells over T = 40 context tokens, 2 KV heads, suffix of q + 3 tokens; ``query``:
    the captured query index (None: every query); ``own`` bool ``[B, q + 3]``: the suffix slots each cell sees."""
    g = torch.Generator().manual_seed(D + 10 * G + q)
    Hkv, T, s = 2, 40, q + 3
    if cells == "sparse":  # keeps nothing; one entry of each KV head; about half
        B = 3
        keep = torch.zeros(B, 1, Hkv, T, dtype=torch.bool)
        keep[1, 0, 0, 7] = keep[1, 0, 1, 30] = True
        keep[2] = torch.rand(1, Hkv, T, generator=g) < 0.5
    else:
        B = 2
        keep = torch.ones(B, 1, Hkv, T, dtype=torch.bool)
    k_ctx, v_ctx = (torch.randn(1, Hkv, T, D, generator=g) for _ in range(2))
    qg = torch.randn(B, Hkv, G * q, D, generator=g) * 2  # [B, Hkv, G·q, D]
    key, value = (torch.randn(B, Hkv, s, D, generator=g) for _ in range(2))
    ctx = MaskedContext([k_ctx], [v_ctx], keep, on_probs, query, context_chunk=chunk, gather_from=gather_from,
                        backend=resolve_backend(backend, env={}), on_masses=on_masses, mass_sets=tuple(sets),
                        suffix_keep=own)
    return AttentionCall(ctx, 0, qg, k_ctx[0], v_ctx[0], key, value, q, D**-0.5, own)


def _needs(name: str) -> None:
    """Skip a backend that cannot run here; the kept-entries kernel must run under CI=true."""
    backend = BACKENDS.get(name)
    why = backend.available()
    if why.ok:
        return
    if name == "kept" and os.environ.get("CI") == "true" and kept_applies(torch.device("cpu"), torch.float32, 64):
        pytest.fail(f"the kept-entries kernel did not run on the CI machine: {why.reason}")
    pytest.skip(f"{name}: {why.reason}")


@pytest.mark.parametrize("cells", ["sparse", "full"])
@pytest.mark.parametrize("q", [20, 1], ids=["question", "decode"])
@pytest.mark.parametrize("G", GROUPS, ids=[f"gqa{g}" for g in GROUPS])
@pytest.mark.parametrize("D", HEAD_DIMS, ids=[f"d{d}" for d in HEAD_DIMS])
@pytest.mark.parametrize("name", OTHERS)
def test_every_backend_equals_the_reference(name, D, G, q, cells):
    _needs(name)
    call = _call(D, G, q, cells)
    backend = BACKENDS.get(name)
    assert backend.serves(call), f"{name} does not serve a float32 CPU forward at head size {D}"
    ours = backend.forward(call)
    ref = BACKENDS.get("reference").forward(call)
    assert ours.shape == ref.shape == (call.qg.shape[1], call.qg.shape[0], G * q, D) and ours.dtype == torch.float32
    err = (ours - ref).abs().max().item()
    assert err <= 1e-5, f"{name} differs from the reference by {err:.2e}"


@pytest.mark.parametrize("name", OTHERS)
def test_a_named_backend_runs_through_the_attention_function_and_is_counted(name):
    """The setting's backend computes the forwards it serves (counted by kvroute.engine.attention.ran), the captured
    rows beside it equal to the reference's own."""
    _needs(name)
    rows: dict[str, torch.Tensor] = {}
    outs = {}
    for which in ("reference", name):
        call = _call(64, 4, 20, "sparse", backend=which,
                     on_probs=lambda _layer, r, _i, which=which: rows.__setitem__(which, r))
        before = ran()
        query = call.qg.reshape(call.qg.shape[0], -1, 20, 64)  # [B, H, q, D]
        outs[which] = masked_forward(call.ctx, query, call.key, call.value)
        assert ran_since(before) == {which: 1}
    torch.testing.assert_close(outs[name], outs["reference"], atol=1e-5, rtol=0)
    torch.testing.assert_close(rows[name], rows["reference"], atol=1e-6, rtol=0)


def test_the_auto_rule():
    """auto: the kept-entries kernel wherever it serves a forward, else gathered for the question, chunked where the
    planner chunks, fused for a one-shot forward; the reference only for a one-shot forward that captures the whole
    row of every query it has (or where nothing else serves). Captured rows of some queries and tracked masses run
    on the fast backend. KVROUTE_KEPT_KERNEL=0 and KVROUTE_FUSED_ATTENTION=0 take theirs out."""
    has_kept = BACKENDS.get("kept").available().ok
    capture = lambda *_: None  # noqa: E731
    fast = "kept" if has_kept else "fused"
    assert choose(_call(64, 4, 1, "sparse", chunk=None)).name == fast
    assert choose(_call(64, 4, 1, "sparse", chunk=None, on_probs=capture)).name == "reference"  # the step's row
    assert choose(_call(64, 4, 1, "sparse", chunk=None, on_masses=capture)).name == fast  # its tracked masses
    assert choose(_call(64, 4, 1, "sparse", chunk=None, on_probs=capture, on_masses=capture)).name == "reference"
    assert choose(_call(64, 4, 20, "sparse", chunk=None)).name == ("kept" if has_kept else "gathered")
    assert choose(_call(64, 4, 20, "sparse", chunk=None, on_probs=capture)).name == ("kept" if has_kept else "gathered")
    # a one-shot question forward that captures its last query's row: the fast backend, the row beside it
    assert choose(_call(64, 4, 20, "sparse", chunk=None, gather_from=None, on_probs=capture)).name == fast
    # every query's row (a draft forward's rows for the argmax): the reference; their masses only: the fast backend
    every = _call(64, 4, 20, "sparse", chunk=None, gather_from=None, on_probs=capture, query=None)
    assert choose(every).name == "reference"
    every.ctx.on_probs, every.ctx.on_masses = None, capture
    assert choose(every).name == fast
    assert choose(_call(64, 4, 1, "sparse", chunk=16, on_probs=capture)).name == ("kept" if has_kept else "chunked")
    call = _call(64, 4, 1, "sparse", chunk=None)
    call.ctx.backend = resolve_backend(env={"KVROUTE_KEPT_KERNEL": "0"})
    assert choose(call).name == "fused"
    call.ctx.backend = resolve_backend(env={"KVROUTE_KEPT_KERNEL": "0", "KVROUTE_FUSED_ATTENTION": "0"})
    assert choose(call).name == "reference"
    call.ctx.backend = resolve_backend("sdpa", env={})
    assert choose(call).name == "sdpa"
    call.ctx.backend = resolve_backend("kept", env={"KVROUTE_KEPT_KERNEL": "0"})  # named but off: the rule's choice
    assert choose(call).name == "fused"


def test_a_wrong_backend_name_gets_the_closest_and_the_settings_know_every_backend():
    with pytest.raises(UnknownNameError, match="sdpa"):
        resolve_backend("sdp")
    with pytest.raises(Exception, match="did you mean 'gathered'"):
        RunSettings(attention_backend="gatherd")
    assert set(ATTENTION_BACKENDS) == {"auto", *BACKENDS.names()}
    for name in BACKENDS.names():
        assert BACKENDS.get(name).name == name and BACKENDS.get(name).devices


def test_the_kept_kernel_is_built_here_when_it_applies():
    """The kernel's cases above must not all skip where it applies: under CI=true a missing build fails."""
    if not kept_applies(torch.device("cpu"), torch.float32, 64):
        pytest.skip("no AVX-512 here: the kept-entries kernel does not apply")
    if kernel() is None and os.environ.get("CI") == "true":
        pytest.fail("the kept-entries kernel did not build on the CI machine")


def _sets(q: int) -> tuple[torch.Tensor, ...]:
    """Tracked position sets over the T + s = 40 + q + 3 keys: context positions (kept by some cells, not by others;
    one twice, counted twice as an index_select does), suffix positions (the last one after every query but the last:
    probability 0 for them) with a context one, and an empty set."""
    T, s = 40, q + 3
    return (torch.tensor([0, 7, 30, 39, 7]), torch.tensor([T, T + s - 1, 12]), torch.tensor([], dtype=torch.long))


def _own(cells: str, q: int) -> torch.Tensor | None:
    """``"sparse-own"``: cell 0 and cell 2 do not see suffix slots 1 and 0 (slots before every query: each row still
    sees its own position, as a draft's rejected slots leave it)."""
    if cells != "sparse-own":
        return None
    own = torch.ones(3, q + 3, dtype=torch.bool)
    own[0, 1] = own[2, 0] = False
    return own


@pytest.mark.parametrize("kinds", ["rows", "masses", "both"])
@pytest.mark.parametrize("cells", ["sparse", "full", "sparse-own"])
@pytest.mark.parametrize("q, query", [(20, -1), (20, 0), (20, None), (1, -1)],
                         ids=["question-last", "question-first", "question-every", "decode"])
@pytest.mark.parametrize("name", ["auto", *OTHERS])
def test_captures_beside_a_backend_equal_the_references(name, q, cells, kinds, query):
    """Whatever backend computes a forward (named, or the auto rule's, which now keeps captured forwards on the fast
    backends), the captured rows and tracked masses equal those of the reference's own softmax (rows within 1e-6,
    masses within 1e-5: from the kernel's log-sum-exp they carry its exponential's rounding, ~1e-6), for the last,
    the first and every query, with cells keeping nothing, one entry, half or everything, and hidden suffix slots;
    the output still equals the reference's within 1e-5."""
    if name != "auto":
        _needs(name)
    got = {}
    for which in ("reference", name):
        rows: dict[int, torch.Tensor] = {}
        masses: dict[int, torch.Tensor] = {}
        call = _call(64, 4, q, "full" if cells == "full" else "sparse", backend=which, query=query, sets=_sets(q),
                     chunk=16 if which == "chunked" else None, own=_own(cells, q),
                     on_probs=None if kinds == "masses" else lambda _l, r, i, rows=rows: rows.__setitem__(i, r),
                     on_masses=None if kinds == "rows" else lambda _l, m, i, masses=masses: masses.__setitem__(i, m))
        chosen = choose(call).name
        before = ran()
        out = masked_forward(call.ctx, call.qg.reshape(call.qg.shape[0], -1, q, 64), call.key, call.value)
        assert ran_since(before) == {chosen: 1}
        got[which] = out, rows, masses, chosen
    out, rows, masses, chosen = got[name]
    ref_out, ref_rows, ref_masses, ref_chosen = got["reference"]
    assert ref_chosen == "reference" and (chosen == name or name == "auto")
    torch.testing.assert_close(out, ref_out, atol=1e-5, rtol=0)
    assert rows.keys() == ref_rows.keys() and masses.keys() == ref_masses.keys()
    assert len(rows if kinds != "masses" else masses) == (q if query is None else 1)
    for i in rows:
        assert rows[i].shape == (call.qg.shape[0], 2 * 4, 40 + q + 3)
        torch.testing.assert_close(rows[i], ref_rows[i], atol=1e-6, rtol=0)
    for i in masses:
        assert masses[i].shape == (call.qg.shape[0], 2 * 4, 3)
        torch.testing.assert_close(masses[i], ref_masses[i], atol=1e-5, rtol=0)  # (the kernel's exp: ~1e-6)
        assert torch.equal(masses[i][..., 2], torch.zeros_like(masses[i][..., 2]))  # the empty set
    if masses and cells != "full":  # the cell keeping nothing: no mass on context positions
        assert torch.equal(ref_masses[next(iter(ref_masses))][0, :, 0], torch.zeros(8))


@pytest.mark.parametrize("q", [20, 1], ids=["question", "decode"])
@pytest.mark.parametrize("name", [n for n in BACKENDS.names() if BACKENDS.get(n).lse])
def test_a_backends_log_sum_exp_is_the_references_normaliser(name, q):
    """Backends declaring ``lse`` return each row's log-sum-exp over every key it attends (kept context entries and
    the visible suffix), the normaliser the tracked masses are computed against."""
    _needs(name)
    for cells in ("sparse", "full", "sparse-own"):
        call = _call(64, 4, q, "full" if cells == "full" else "sparse", chunk=None, own=_own(cells, q))
        out, lse = BACKENDS.get(name).attend(call)
        scores = torch.cat([row_scores(call.qg, call.k_ctx, call.bias(), call.key, q=q, index=i, scale=call.scale,
                                       own=call.own) for i in range(q)], dim=2)  # [Hkv, B, q·G, T + s], (i, g) order
        Hkv, B, _, K = scores.shape
        ref = torch.logsumexp(scores.view(Hkv, B, q, 4, K).transpose(2, 3).reshape(Hkv, B, 4 * q, K), -1)
        assert lse is not None and lse.shape == ref.shape and lse.dtype == torch.float32
        torch.testing.assert_close(lse, ref, atol=1e-5, rtol=0)
        torch.testing.assert_close(out, BACKENDS.get(name).forward(call), atol=0, rtol=0)
