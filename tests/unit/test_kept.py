"""The kept-entries attention kernel (kvroute.engine.attention.kept) equals the explicit masked attention to float32
rounding.

Each case runs the masked attention function twice on the same inputs: once with the kernel and once with PyTorch's
explicit one-shot form (softmax over the masked scores), and also checks the kernel's raw output and log-sum-exp
against a dense reference. Cells that keep nothing, cells that keep everything, contexts shorter and longer than the
kernel's span (256 positions) and block (128 kept entries), several head sizes, GQA groups and query counts, and a
context K/V with room to spare (row stride ≠ head size) are covered. The kernel is opt-in (``kvroute kernel build``,
which needs AVX-512, a C++ compiler and ninja): without a build these tests skip, except under CI=true, where
.ci/run builds it and a missing kernel is a failure.
"""

from __future__ import annotations

import logging
import os
import sys

import pytest
import torch

from kvroute.engine.attention import MaskedContext, kept
from kvroute.engine.attention.kept import kept_context, kept_index, select_index
from tests.attention_call import masked_forward


@pytest.fixture(scope="module")
def kernel():
    mod = kept.kernel()
    if mod is None:
        if os.environ.get("CI") == "true":
            pytest.fail("the kept-entries attention kernel is not built on the CI machine (.ci/run runs `make kernel`)")
        pytest.skip("the kept-entries kernel is not built here (`kvroute kernel build`; it needs AVX-512, a C++ "
                    "compiler and ninja)")
    return mod


def _inputs(B, Hkv, G, q, s, T, D, *, share=0.5, seed=0, spare=0):
    g = torch.Generator().manual_seed(seed)
    # a cache with room to spare: rows of a [1, Hkv, T + spare, D] tensor, as a growing cache holds them
    k_ctx = torch.randn(1, Hkv, T + spare, D, generator=g)[:, :, :T]
    v_ctx = torch.randn(1, Hkv, T + spare, D, generator=g)[:, :, :T]
    keep = torch.rand(B, 1, Hkv, T, generator=g) > share  # [B, L=1, Hkv, T]
    keep[0] = False  # a cell that keeps nothing
    if B > 2:
        keep[1] = True  # a cell that keeps everything
        keep[2, 0, 0] = False  # a KV head of which a cell keeps nothing
    query = torch.randn(B, Hkv * G, q, D, generator=g) * 2
    key, value = torch.randn(B, Hkv, s, D, generator=g), torch.randn(B, Hkv, s, D, generator=g)
    return k_ctx, v_ctx, keep, query, key, value


@pytest.mark.parametrize("B, Hkv, G, q, s, T, D", [
    (4, 3, 3, 1, 5, 700, 64),  # a decode step: SmolLM2's GQA (3 query heads per KV head), past one span
    (3, 2, 7, 1, 2, 90, 64),  # Qwen2.5-0.5B's group, a context shorter than one block
    (5, 2, 2, 9, 12, 1000, 128),  # a few queries per cell (a draft or a short question), head_dim 128
    (3, 1, 4, 20, 20, 300, 80),  # a question forward past the gather threshold, head_dim 80
    (3, 2, 1, 1, 1, 2048, 96),  # many kept entries per pair: several blocks per span
])
def test_kernel_equals_the_explicit_masked_attention(kernel, monkeypatch, B, Hkv, G, q, s, T, D):
    k_ctx, v_ctx, keep, query, key, value = _inputs(B, Hkv, G, q, s, T, D, spare=7)
    calls = []
    real = kept_context

    def counting(*a, **kw):
        calls.append(1)
        return real(*a, **kw)

    monkeypatch.setattr("kvroute.engine.attention.kept.kept_context", counting)
    ours = masked_forward(MaskedContext([k_ctx], [v_ctx], keep, gather_from=None), query, key, value)
    assert calls, "the kernel did not run"
    monkeypatch.setattr(kept, "ENABLED", False)
    ref = masked_forward(MaskedContext([k_ctx], [v_ctx], keep, gather_from=None), query, key, value)
    assert len(calls) == 1
    assert ours.shape == ref.shape == (B, q, Hkv * G, D)
    torch.testing.assert_close(ours, ref, atol=1e-5, rtol=0)


@pytest.mark.parametrize("q", [1, 6])
def test_kernel_sees_only_the_suffix_slots_a_cell_owns(kernel, monkeypatch, q):
    """With ``suffix_keep`` (the draft tokens a cell rejected are not its own), the kernel's suffix part skips the slots
    a cell does not own, as the explicit form masks them."""
    B, Hkv, G, s, T, D = 4, 3, 3, 9, 700, 64
    k_ctx, v_ctx, keep, query, key, value = _inputs(B, Hkv, G, q, s, T, D, seed=5)
    own = torch.ones(B, s + 3, dtype=torch.bool)
    own[1, :2] = False  # the first slots of cell 1
    own[2, 3:5] = False
    outs = {}
    for on in (True, False):
        monkeypatch.setattr(kept, "ENABLED", on)
        outs[on] = masked_forward(MaskedContext([k_ctx], [v_ctx], keep, gather_from=None, suffix_keep=own), query,
                                  key, value)
    torch.testing.assert_close(outs[True], outs[False], atol=1e-5, rtol=0)
    monkeypatch.setattr(kept, "ENABLED", True)
    everything = masked_forward(MaskedContext([k_ctx], [v_ctx], keep, gather_from=None), query, key, value)
    assert not torch.allclose(everything[1], outs[True][1]) and torch.equal(everything[0], outs[True][0])


def test_kernel_results_do_not_depend_on_the_thread_count(kernel):
    """Work is split into fixed context chunks, not per thread: one thread and two give the same bits."""
    B, Hkv, R, T, D = 9, 3, 3, 2100, 64
    g = torch.Generator().manual_seed(8)
    k_ctx, v_ctx = torch.randn(Hkv, T, D, generator=g), torch.randn(Hkv, T, D, generator=g)
    keep = torch.rand(Hkv, B, T, generator=g) >= 0.4
    qg = torch.randn(B, Hkv, R, D, generator=g)
    key, value = torch.randn(B, Hkv, 7, D, generator=g), torch.randn(B, Hkv, 7, D, generator=g)
    offsets, index = kept_index(keep)
    before = torch.get_num_threads()
    try:
        runs = []
        for n in (1, 2):
            torch.set_num_threads(n)
            runs.append(kept_context(qg, k_ctx, v_ctx, offsets, index, scale=0.125, key=key, value=value))
    finally:
        torch.set_num_threads(before)
    assert torch.equal(runs[0][0], runs[1][0]) and torch.equal(runs[0][1], runs[1][1])


@pytest.mark.parametrize("share", [0.0, 0.5, 0.97, 1.0])
def test_kernel_output_and_log_sum_exp_against_a_dense_reference(kernel, share):
    B, Hkv, R, T, D = 6, 2, 3, 530, 64
    g = torch.Generator().manual_seed(int(share * 100))
    k_ctx, v_ctx = torch.randn(Hkv, T, D, generator=g), torch.randn(Hkv, T, D, generator=g)
    keep = torch.rand(Hkv, B, T, generator=g) >= share  # share = 1.0: nothing kept anywhere
    qg = torch.randn(B, Hkv, R, D, generator=g) * 3
    offsets, index = kept_index(keep)
    assert offsets.tolist()[-1] == int(keep.sum()) == index.numel()
    out, lse = kept_context(qg, k_ctx, v_ctx, offsets, index, scale=0.125)
    scores = torch.einsum("bhrd,htd->hbrt", qg, k_ctx) * 0.125
    scores = scores.masked_fill(~keep[:, :, None], float("-inf"))
    ref_lse = torch.logsumexp(scores, -1)  # −inf where a pair keeps nothing
    probs = torch.softmax(scores, -1).nan_to_num(0.0)
    ref = torch.einsum("hbrt,htd->hbrd", probs, v_ctx)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=0)
    torch.testing.assert_close(lse, ref_lse, atol=1e-5, rtol=0)


@pytest.mark.parametrize("fault", ["position past the context", "negative position", "offsets past the index",
                                   "decreasing offsets"])
def test_the_kernel_refuses_an_index_outside_its_tensors(kernel, fault):
    """The kernel reads the context through the index without checking each access, so the index is checked once
    per call: a position outside the context or offsets that leave the index raise, never read past a tensor."""
    B, Hkv, R, T, D = 2, 2, 3, 40, 64
    g = torch.Generator().manual_seed(0)
    k_ctx, v_ctx = torch.randn(Hkv, T, D, generator=g), torch.randn(Hkv, T, D, generator=g)
    offsets, index = kept_index(torch.rand(Hkv, B, T, generator=g) >= 0.5)
    qg = torch.randn(B, Hkv, R, D, generator=g)
    kept_context(qg, k_ctx, v_ctx, offsets, index, scale=0.125)  # the index as made: fine
    if fault == "position past the context":
        index[3] = T
    elif fault == "negative position":
        index[-1] = -1
    elif fault == "offsets past the index":
        offsets[-1] += 1
    else:
        a, b = int(offsets[2]), int(offsets[3])
        offsets[2], offsets[3] = b, a - 1  # row 2 ends before it starts
    with pytest.raises(RuntimeError, match="kept_attention: (index|offsets)"):
        kept_context(qg, k_ctx, v_ctx, offsets, index, scale=0.125)


def test_the_kept_index_follows_the_cells_that_stay(kernel):
    """select_index slices the CSR lists of the cells that stay, equal to rebuilding them; MaskedContext.select carries
    the cached index along, and the attention after a select equals a fresh context's."""
    g = torch.Generator().manual_seed(3)
    B, L, Hkv, T, D = 7, 2, 3, 300, 64
    keep = torch.rand(B, L, Hkv, T, generator=g) > 0.4
    keep[4, 1] = False
    rows = torch.tensor([0, 2, 3, 4, 6])
    for layer in range(L):
        o, i = kept_index(keep[:, layer].transpose(0, 1))
        so, si = select_index(o, i, Hkv, rows)
        ro, ri = kept_index(keep[rows, layer].transpose(0, 1))
        assert torch.equal(so, ro) and torch.equal(si, ri)
    k_ctx, v_ctx = torch.randn(1, Hkv, T, D, generator=g), torch.randn(1, Hkv, T, D, generator=g)
    query = torch.randn(B, Hkv * 3, 1, D, generator=g)
    key, value = torch.randn(B, Hkv, 4, D, generator=g), torch.randn(B, Hkv, 4, D, generator=g)
    ctx = MaskedContext([k_ctx, k_ctx], [v_ctx, v_ctx], keep, gather_from=None)
    masked_forward(ctx, query, key, value)  # builds layer 0's index
    assert 0 in ctx._index
    ctx.select(rows)
    assert 0 in ctx._index  # sliced, not dropped
    after = masked_forward(ctx, query[rows], key[rows], value[rows])
    fresh = masked_forward(MaskedContext([k_ctx], [v_ctx], keep[rows], gather_from=None), query[rows], key[rows],
                           value[rows])
    assert torch.equal(after, fresh)
    ctx.select(torch.tensor([3, 1]))  # not ascending: the index is rebuilt from the mask on next use
    assert not ctx._index
    assert torch.equal(masked_forward(ctx, query[rows][[3, 1]], key[rows][[3, 1]], value[rows][[3, 1]]),
                       masked_forward(MaskedContext([k_ctx], [v_ctx], keep[rows][[3, 1]], gather_from=None),
                                      query[rows][[3, 1]], key[rows][[3, 1]], value[rows][[3, 1]]))


def test_the_kernel_stays_out_where_it_does_not_apply(kernel, monkeypatch):
    """bfloat16, head sizes it was not built for, more rows than KEPT_MAX_ROWS and a one-shot forward that captures
    its rows go through PyTorch's kernels; the captured rows of a gathered forward are unchanged by it."""
    calls = []
    real = kept_context
    monkeypatch.setattr("kvroute.engine.attention.kept.kept_context",
                        lambda *a, **kw: calls.append(1) or real(*a, **kw))
    for dtype, D, G, q in [(torch.bfloat16, 64, 2, 1), (torch.float32, 16, 2, 1), (torch.float32, 64, 9, 60)]:
        k_ctx, v_ctx, keep, query, key, value = _inputs(3, 2, G, q, q, 200, D)
        masked_forward(MaskedContext([k_ctx.to(dtype)], [v_ctx.to(dtype)], keep, gather_from=None), query.to(dtype),
                       key.to(dtype), value.to(dtype))
    assert not calls
    k_ctx, v_ctx, keep, query, key, value = _inputs(3, 2, 2, 1, 3, 200, 64)
    seen: dict[str, torch.Tensor] = {}
    masked_forward(MaskedContext([k_ctx], [v_ctx], keep, lambda _, r, __: seen.__setitem__("rows", r), 0,
                                 gather_from=None), query, key, value)
    assert not calls and seen["rows"].shape == (3, 4, 203)
    # a gathered forward (q ≥ gather_from) that captures: rows as without the kernel, output through the kernel
    k_ctx, v_ctx, keep, query, key, value = _inputs(3, 2, 2, 6, 6, 200, 64)
    outs = {}
    for on in (True, False):
        monkeypatch.setattr(kept, "ENABLED", on)
        outs[on] = masked_forward(MaskedContext([k_ctx], [v_ctx], keep, lambda _, r, __, on=on: seen.__setitem__(on, r),
                                                5, gather_from=4), query, key, value)
    assert calls
    assert torch.equal(seen[True], seen[False])
    torch.testing.assert_close(outs[True], outs[False], atol=1e-5, rtol=0)


@pytest.mark.parametrize("D", [64, 128, 256])
def test_few_rows_steps_of_a_whole_block_at_every_head_size(kernel, D):
    """A decode step's rows (G = 7) over 128 kept entries in one step, where the few-rows scores take 4, 2 or 1 keys
    at a time by head size: each row's scores stay in its own row of the scratch (a store past it once overwrote the
    next row's first scores and ran past the buffer)."""
    torch.manual_seed(0)
    Hkv, G, B, T = 2, 7, 3, 300
    k, v = torch.randn(Hkv, T, D), torch.randn(Hkv, T, D)
    keep = torch.ones(Hkv, B, T, dtype=torch.bool)
    keep[:, 1, ::3] = False
    off, idx = kept_index(keep)
    q = torch.randn(B, Hkv, G, D)
    out = kept_context(q, k, v, off, idx, scale=D ** -0.5)
    scores = torch.einsum("bhrd,htd->bhrt", q, k) * D ** -0.5
    scores = scores.masked_fill(~keep.transpose(0, 1)[:, :, None, :], float("-inf"))
    ref = torch.einsum("bhrt,htd->bhrd", scores.softmax(-1), v)
    out = out[0] if isinstance(out, tuple) else out
    torch.testing.assert_close(out if out.shape == ref.shape else out.transpose(0, 1), ref, atol=1e-5, rtol=0)


@pytest.mark.parametrize("ninja", [False, True])
def test_a_kernel_that_cannot_be_built_says_why_in_one_line(ninja, monkeypatch, tmp_path):
    """``kvroute kernel build``'s step: without ninja (the ``kernel`` extra) no build is tried and the reason names the
    extra that adds it; with ninja, a failed build says what the compiler said, without that hint. PATH is left as
    it was either way."""
    import torch.utils.cpp_extension as cpp

    from kvroute.engine import kept_build

    builds = []

    def command(spec, attempt):
        builds.append(spec.name)
        return [sys.executable, "-c", "import sys; print('g++: fatal error: no input files'); sys.exit(1)"]

    monkeypatch.setenv("KVROUTE_HOME", str(tmp_path))  # no build of the kernel there yet
    monkeypatch.setattr(kept, "ENABLED", True)
    monkeypatch.setattr(kept, "_avx512", lambda: True)  # the kernel would apply here but for the build
    if not ninja:
        monkeypatch.setitem(sys.modules, "ninja", None)  # `import ninja` fails: the wheel is not installed
    monkeypatch.setattr(cpp, "is_ninja_available", lambda: ninja)
    monkeypatch.setattr(kept_build, "_builder_command", command)
    path = os.environ.get("PATH")
    with pytest.raises(kept_build.KernelUnavailable) as failed:
        kept.build_kernel()
    assert os.environ.get("PATH") == path
    assert len(builds) == ninja, "a build was tried without ninja"
    line = str(failed.value)
    assert "\n" not in line and ("pip install 'kvroute[kernel]'" in line) == (not ninja)
    assert ("ninja" in line) == (not ninja) and ("no input files" in line) == ninja


def test_a_run_never_builds_the_kernel_and_loads_it_once_built(monkeypatch, caplog, tmp_path):
    """The kernel is opt-in: where it was never built, the masked attention takes PyTorch's kernels without starting
    a build or writing anything, and says in one info line how to build it; after ``build_kernel`` (``kvroute kernel
    build``) the next run loads that build without building again. A ``kernel()`` that built on demand (the old
    default) fails the first half."""
    from kvroute.engine import kept_build

    built = kernel_module = object()
    builds = []

    def obtain(spec, folder, *, timeout, can_build, announce, build=True):
        if (folder / f"{spec.name}.so").exists():
            return kernel_module
        if not build:
            raise kept_build.NotBuilt(f"not built in {folder}")
        builds.append(spec.name)
        folder.mkdir(parents=True)
        (folder / f"{spec.name}.so").write_bytes(b"")
        return built

    monkeypatch.setenv("KVROUTE_HOME", str(tmp_path))
    monkeypatch.setattr(kept, "ENABLED", True)
    monkeypatch.setattr(kept, "_avx512", lambda: True)
    monkeypatch.setattr(kept, "_can_build", lambda have_ninja: None)
    monkeypatch.setattr(kept, "obtain", obtain)
    kept.kernel.cache_clear()
    try:
        with caplog.at_level(logging.INFO, logger=kept.log.name):
            assert not kept.kept_available(torch.zeros(2, 3, 1, 64), rows=3)
        assert builds == [] and list(tmp_path.iterdir()) == []
        (line,) = [r.getMessage() for r in caplog.records if r.name == kept.log.name]
        assert "`kvroute kernel build` builds it" in line and "PyTorch's kernels run" in line
        assert kept.build_kernel() is built and len(builds) == 1
        assert kept.kernel() is kernel_module and len(builds) == 1  # the cache was cleared: loaded, not rebuilt
    finally:
        kept.kernel.cache_clear()


def test_kernel_status_says_whether_it_is_built_and_how_to_build_it(monkeypatch, tmp_path):
    """``kvroute kernel status`` on a home where it was never built: "not built" and the command that builds it (or
    why it cannot run here); ``--json`` gives the same state as fields."""
    import json

    from typer.testing import CliRunner

    from kvroute.cli import app

    monkeypatch.setenv("KVROUTE_HOME", str(tmp_path))
    kept.kernel.cache_clear()
    try:
        runner = CliRunner()
        text = runner.invoke(app, ["kernel", "status"])
        state = json.loads(runner.invoke(app, ["kernel", "status", "--json"]).output)
    finally:
        kept.kernel.cache_clear()
    assert text.exit_code == 0 and state["built"] is False and state["folder"] == str(tmp_path / "kernels")
    if state["avx512"] and not state["switched_off"]:
        assert "not built; `kvroute kernel build` builds it" in text.output
    else:
        assert "not built" not in text.output
