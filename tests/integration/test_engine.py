"""The masked engine on tiny random models: equivalences that can fail for the right reason."""

from dataclasses import dataclass

import pytest
import torch

from kvroute.engine import Cell, DecodeSettings, Engine
from kvroute.engine.generate import greedy_generate
from kvroute.engine.reference import kvpress_prompt_ids
from kvroute.errors import ConfigError, EngineError, PromptTooLongError, UnknownNameError
from kvroute.models import tiny_model
from kvroute.presses import KeepMask
from tests.masked_reference import masked_reference_logits

CONTEXT = ("Alice Morgan was born in Ferravik in 1987 and works as a glassblower for the Northwind Company. "
           "Her brother lives in Quenby; his manager is Tobias Vell. ") * 3
QUESTION = "Question: where was Alice born? Answer briefly."


@dataclass
class Prompt:
    context_ids: list[int]
    question_ids: list[int]


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def setup(request):
    lm = tiny_model(request.param, seed=0)
    c, q = kvpress_prompt_ids(lm.tokenizer, CONTEXT, QUESTION)
    return lm, Prompt(c, q)


def test_ratio_zero_equals_uncompressed_generation(setup):
    lm, prompt = setup
    eng = Engine(lm, DecodeSettings(max_new_tokens=12))
    res = eng.run(prompt, [Cell("knorm", 0.0), Cell("expected_attention+adakv", 0.0), Cell("none", 0.0)])
    ref = greedy_generate(lm, prompt.context_ids + prompt.question_ids, max_new_tokens=12)
    assert res.full.tokens == ref
    for out, m in zip(res.outputs, res.masks, strict=True):
        assert out.tokens == ref
        assert bool(m.mask.all())


def test_ratio_zero_logits_match_plain_forward(setup):
    lm, prompt = setup
    eng = Engine(lm, DecodeSettings(max_new_tokens=2, keep_logits=True))
    res = eng.run(prompt, [Cell("snapkv[window_size=8]", 0.0)])
    ids = torch.tensor([prompt.context_ids + prompt.question_ids])
    ref = lm.model(ids).logits[0, -1]
    torch.testing.assert_close(res.outputs[0].logits[0], ref, atol=1e-4, rtol=0)


def test_batched_equals_one_by_one(setup):
    lm, prompt = setup
    cells = [Cell(p, r)
             for p in ("knorm", "snapkv[window_size=8]", "expected_attention+adakv", "tova+pyramid[window_size=4]")
             for r in (0.3, 0.6, 0.9)]
    gold = lm.tokenizer.encode(" Ferravik", add_special_tokens=False)
    batched = Engine(lm, DecodeSettings(max_new_tokens=10, keep_logits=True)).run(prompt, cells, gold_ids=gold)
    single = Engine(lm, DecodeSettings(max_new_tokens=10, keep_logits=True, batch_size=1)).run(prompt, cells,
                                                                                             gold_ids=gold)
    for a, b in zip(batched.outputs, single.outputs, strict=True):
        assert a.tokens == b.tokens
        torch.testing.assert_close(a.logits, b.logits, atol=1e-5, rtol=0)
        assert a.gold_logprob == pytest.approx(b.gold_logprob, abs=1e-4)
        torch.testing.assert_close(a.last_attention, b.last_attention, atol=1e-6, rtol=0)


def test_finished_cells_leave_the_batch_without_changing_others(setup):
    """Cells that stop early are dropped from the batch; the survivors' tokens must not change."""
    lm, prompt = setup
    cells = [Cell("knorm", r) for r in (0.1, 0.3, 0.5, 0.7, 0.9)]
    eng = Engine(lm, DecodeSettings(max_new_tokens=15))
    free = eng.run(prompt, cells).outputs
    # make a token that one cell emits early (and another cell does not emit at all) the EOS
    eos = next(t for o in free for t in o.tokens[1:6] if any(t not in p.tokens for p in free))
    gen = lm.model.generation_config
    old = gen.eos_token_id
    gen.eos_token_id = eos
    try:
        together = eng.run(prompt, cells).outputs
        lengths = [len(o.tokens) for o in together]
        assert min(lengths) < 15 and max(lengths) > min(lengths)  # the batch really shrank mid-way
        for cell, out in zip(cells, together, strict=True):
            assert out.tokens == eng.run(prompt, [cell]).outputs[0].tokens
            assert eos not in out.tokens[:-1]
    finally:
        gen.eos_token_id = old


def test_masked_decoding_equals_independent_reference(setup):
    """Random per-layer, per-KV-head masks: the engine equals a plain eager forward with 4D masks."""
    lm, prompt = setup
    L, Hkv, T = lm.info.num_layers, lm.info.num_kv_heads, len(prompt.context_ids)
    g = torch.Generator().manual_seed(0)
    keep = torch.rand(L, Hkv, T, generator=g) < 0.5
    keep[0, 0, : T // 2] = False  # KV head 0 of layer 0 loses the whole first half
    from kvroute.engine.decode import decode_cells
    from kvroute.engine.prefill import prefill

    pre = prefill(lm.model, prompt.context_ids)
    q = prompt.question_ids
    ours = decode_cells(lm.model, lm.tokenizer, pre, q[:-1], [KeepMask(keep, "hand", 0.5)], gold_ids=q[-1:],
                        settings=DecodeSettings(max_new_tokens=1, keep_logits=True))[0]
    ref = masked_reference_logits(lm, prompt.context_ids, q, keep)
    torch.testing.assert_close(ours.logits[0], ref[-2], atol=1e-4, rtol=0)
    torch.testing.assert_close(ours.logits[1], ref[-1], atol=1e-4, rtol=0)


def test_the_prefill_reports_the_time_its_scorers_took(setup):
    """``seconds["scoring"]``: the part of the prefill inside the scorers (layer hooks and after-prefill scorers),
    nothing without one."""
    from kvroute.engine.prefill import prefill

    lm, prompt = setup
    assert prefill(lm.model, prompt.context_ids).score_seconds == 0.0
    res = Engine(lm, DecodeSettings(max_new_tokens=1)).run(
        prompt, [Cell("snapkv[window_size=8]", 0.5), Cell("expected_attention", 0.5), Cell("kvzip", 0.5)])
    assert 0.0 < res.seconds["scoring"] < res.seconds["prefill"]
    assert res.prefill.score_seconds == res.seconds["scoring"]


def test_gqa_group_axis_matters(setup):
    """Swapping which query group a KV head's mask applies to changes the logits: the check above can fail."""
    lm, prompt = setup
    L, Hkv, T = lm.info.num_layers, lm.info.num_kv_heads, len(prompt.context_ids)
    keep = torch.ones(L, Hkv, T, dtype=torch.bool)
    keep[:, 0, : T // 2] = False
    a = masked_reference_logits(lm, prompt.context_ids, prompt.question_ids, keep)
    b = masked_reference_logits(lm, prompt.context_ids, prompt.question_ids, keep.flip(1))
    assert (a[-1] - b[-1]).abs().max() > 1e-3


def test_oracle_keeps_evidence_while_budget_allows(setup):
    lm, prompt = setup
    T = len(prompt.context_ids)
    evidence = list(range(10, 22))  # 12 tokens
    eng = Engine(lm, DecodeSettings(max_new_tokens=2))
    ratios = [0.2, 0.5, 0.8, 1 - 13 / T]
    cells = [Cell(f"oracle[base={b}]+{s}", r) for b in ("knorm", "expected_attention")
             for s in ("per_head", "adakv", "shared") for r in ratios]
    res = eng.run(prompt, cells, evidence=evidence)
    for cell, m in zip(cells, res.masks, strict=True):
        assert bool(m.mask[:, :, evidence].all()), cell
    anti = eng.run(prompt, [Cell("anti_oracle[base=knorm]", 0.5)], evidence=evidence).masks[0]
    assert not bool(anti.mask[:, :, evidence].any())  # budget smaller than the non-evidence tokens


def test_kept_counts_follow_kvpress_ratio_semantics(setup):
    lm, prompt = setup
    T = len(prompt.context_ids)
    res = Engine(lm, DecodeSettings(max_new_tokens=1)).run(
        prompt, [Cell("knorm", 0.5), Cell("knorm+adakv", 0.5), Cell("knorm+shared", 0.75)])
    assert bool((res.masks[0].kept_per_head == int(T * 0.5)).all())
    assert int(res.masks[1].kept_per_head.sum()) == lm.info.num_layers * lm.info.num_kv_heads * int(T * 0.5)
    assert bool((res.masks[2].mask == res.masks[2].mask[:, :1]).all())  # same tokens in every head


def test_bad_input_is_refused_clearly(setup):
    """A cell's bad name, ratio or precondition is that cell's error, raised with its own type and message by
    ``raise_for_errors``; a prompt the model cannot take raises from ``run`` itself."""
    lm, prompt = setup
    eng = Engine(lm, DecodeSettings(max_new_tokens=2))
    with pytest.raises(UnknownNameError, match="did you mean 'snapkv'"):
        eng.run(prompt, [Cell("snapvk", 0.5)]).raise_for_errors()
    with pytest.raises(UnknownNameError, match="did you mean 'adakv'"):
        eng.run(prompt, [Cell("knorm+adakw", 0.5)]).raise_for_errors()
    for bad in (1.0, -0.1, 1.5):
        with pytest.raises(ConfigError, match=r"\[0, 1\)"):
            eng.run(prompt, [Cell("knorm", bad)]).raise_for_errors()
    T = len(prompt.context_ids)
    with pytest.raises(EngineError, match="keeps 0 of"):
        eng.run(prompt, [Cell("knorm", 1 - 0.5 / T)]).raise_for_errors()
    short = Prompt(prompt.context_ids[:40], prompt.question_ids)
    with pytest.raises(EngineError, match="window_size"):
        eng.run(short, [Cell("snapkv", 0.5)]).raise_for_errors()  # default window of 64 > this short context
    long = Prompt(prompt.context_ids * 200, prompt.question_ids)
    with pytest.raises(PromptTooLongError, match="context window of 4096"):
        eng.run(long, [Cell("knorm", 0.5)])


def test_skipping_the_full_reference_changes_nothing_else(setup):
    lm, prompt = setup
    eng = Engine(lm, DecodeSettings(max_new_tokens=6))
    cells = [Cell("knorm", 0.5), Cell("snapkv[window_size=8]", 0.8)]
    a = eng.run(prompt, cells)
    b = eng.run(prompt, cells, decode_full=False)
    assert b.full is None and a.full is not None
    assert [o.tokens for o in a.outputs] == [o.tokens for o in b.outputs]
    c = eng.run(prompt, cells + [Cell("knorm", 0.0)], decode_full=False)  # a ratio-0 cell needs the full cache
    assert c.full is not None and c.outputs[-1].tokens == a.full.tokens


def test_captured_attention_rows_equal_eager_attention_weights(setup):
    """The last prompt token's captured rows [L, H, T+Q] are the model's own attention (query-head order too)."""
    lm, prompt = setup
    res = Engine(lm, DecodeSettings(max_new_tokens=3)).run(prompt, [Cell("none", 0.0)])
    ids = torch.tensor([prompt.context_ids + prompt.question_ids])
    cfg = lm.model.config
    prev = cfg._attn_implementation
    cfg._attn_implementation = "eager"
    try:
        out = lm.model(ids, output_attentions=True)
    finally:
        cfg._attn_implementation = prev
    eager = torch.stack([a[0, :, -1, :] for a in out.attentions])  # [L, H, T+Q]
    torch.testing.assert_close(res.full.last_attention, eager, atol=1e-5, rtol=0)


def test_rollout_reuses_the_models_queries_exactly(setup):
    """The evidence rollout fed by the prefill's q_proj hook equals one that recomputes the queries."""
    from kvroute.engine.prefill import prefill
    from kvroute.metrics.accessibility import EvidenceRollout

    lm, prompt = setup
    T = len(prompt.context_ids)
    hooked = EvidenceRollout([5, 6, 7], T)
    prefill(lm.model, prompt.context_ids, captures=[hooked])

    class Recompute(EvidenceRollout):
        def on_layer(self, *args, queries=None, **kwargs):  # drop the hooked queries
            super().on_layer(*args, **kwargs)

    recomputed = Recompute([5, 6, 7], T)
    prefill(lm.model, prompt.context_ids, captures=[recomputed])
    torch.testing.assert_close(hooked.shares(), recomputed.shares(), atol=1e-6, rtol=0)
    assert hooked.shares().shape == (lm.info.num_layers, T) and float(hooked.shares()[0, 5]) == 1.0


def test_chunked_context_attention_gives_the_same_cells(setup, monkeypatch):
    """The memory planner's chunked (online-softmax) attention against the one-shot form: same tokens, and
    logits, captured rows and gold log-probs equal to float32 rounding (attention_memory=1 forces the smallest
    chunk, 16 keys here)."""
    import kvroute.engine.attention.chunked as chunked_backend
    import kvroute.engine.attention.streaming as streaming

    monkeypatch.setattr(streaming, "MIN_CHUNK", 16)
    calls = []

    def counted(*args, **kwargs):
        calls.append(kwargs["chunk"])
        return streaming.chunked_context_attention(*args, **kwargs)

    monkeypatch.setattr(chunked_backend, "chunked_context_attention", counted)
    lm, prompt = setup
    assert len(prompt.context_ids) > 4 * 16  # several chunks
    cells = [Cell(p, r) for p in ("knorm", "expected_attention+adakv", "snapkv[window_size=8]") for r in (0.3, 0.9)]
    gold = lm.tokenizer.encode(" Ferravik", add_special_tokens=False)
    one = Engine(lm, DecodeSettings(max_new_tokens=8, keep_logits=True)).run(prompt, cells, gold_ids=gold)
    assert calls == []  # the default budget keeps this small context in one shot
    chunked = Engine(lm, DecodeSettings(max_new_tokens=8, keep_logits=True, attention_memory=1)).run(
        prompt, cells, gold_ids=gold)
    assert calls and set(calls) == {16}  # the chunked form ran (every layer, every forward), the other did not
    for a, b in zip([one.full, *one.outputs], [chunked.full, *chunked.outputs], strict=True):
        assert a.tokens == b.tokens
        torch.testing.assert_close(b.logits, a.logits, atol=1e-4, rtol=0)
        torch.testing.assert_close(b.last_attention, a.last_attention, atol=1e-5, rtol=0)
        assert b.gold_logprob == pytest.approx(a.gold_logprob, abs=1e-4)


def test_onednn_linear_gives_the_same_cells(setup, monkeypatch):
    """The decode forwards' linear layers through oneDNN (kvroute.engine.linear) against PyTorch's default: same
    tokens, and logits, captured rows and gold log-probs equal to float32 rounding; it ran in the decode forwards
    and the prefill was left on the default (its scores must equal the reference's bit for bit)."""
    import kvroute.engine.decode as decode
    import kvroute.engine.linear as linear

    if not linear.onednn_available():
        pytest.skip("this PyTorch build has no oneDNN linear on the CPU")
    lm, prompt = setup
    cells = [Cell(p, r) for p in ("knorm", "expected_attention+adakv", "snapkv[window_size=8]") for r in (0.3, 0.9)]
    gold = lm.tokenizer.encode(" Ferravik", add_special_tokens=False)
    switched = []

    def counted(model, enabled=None):
        ctx = linear.onednn_linear(model, enabled)
        switched.append(len(linear.switched(model)))
        return ctx

    monkeypatch.setattr(decode, "onednn_linear", counted)
    runs = {}
    for on in (False, True):
        monkeypatch.setattr(linear, "ONEDNN", on)
        runs[on] = Engine(lm, DecodeSettings(max_new_tokens=8, keep_logits=True)).run(prompt, cells, gold_ids=gold)
    assert switched and all(n == 7 * 3 + 1 for n in switched)  # 7 projections a layer, 3 layers, the unembedding
    assert torch.equal(runs[True].prefill.keys[0], runs[False].prefill.keys[0])  # the prefill: bit for bit
    for a, b in zip([runs[False].full, *runs[False].outputs], [runs[True].full, *runs[True].outputs], strict=True):
        assert a.tokens == b.tokens
        torch.testing.assert_close(b.logits, a.logits, atol=1e-4, rtol=0)
        torch.testing.assert_close(b.last_attention, a.last_attention, atol=1e-5, rtol=0)
        assert b.gold_logprob == pytest.approx(a.gold_logprob, abs=1e-4)
    with monkeypatch.context() as m:  # and it ran: the decode forwards' linear layers went through oneDNN
        m.setattr(linear, "ONEDNN", True)
        with torch.profiler.profile() as prof:
            Engine(lm, DecodeSettings(max_new_tokens=2)).run(prompt, cells[:1])
    assert any("_linear_pointwise" in e.name for e in prof.events())


def test_gathered_context_attention_gives_the_same_cells(setup, monkeypatch):
    """The question forward over each cell's kept entries only (gathered) against all T entries masked: same tokens,
    and logits, captured rows, gold log-probs and lens readings equal to float32 rounding; the gathered form ran in
    every layer of the question forward and nowhere else (a decode step has one query)."""
    import kvroute.engine.attention.gather as gather

    queries = []
    real = gather.gathered_context_attention

    def counted(qg, *args, **kwargs):
        queries.append(kwargs["q"])
        return real(qg, *args, **kwargs)

    monkeypatch.setattr(gather, "gathered_context_attention", counted)
    lm, prompt = setup
    Q = len(prompt.question_ids)
    assert Q >= gather.GATHER_MIN_QUERIES  # the question forward gathers by default
    cells = [Cell(p, r) for p in ("knorm", "expected_attention+adakv", "snapkv[window_size=8]") for r in (0.3, 0.9)]
    gold = lm.tokenizer.encode(" Ferravik", add_special_tokens=False)
    kw = dict(gold_ids=gold, lens_ids=gold[:1], lens_seqs=[gold, gold[:1]])
    masked = Engine(lm, DecodeSettings(max_new_tokens=8, keep_logits=True, gather=False)).run(prompt, cells, **kw)
    assert queries == []
    gathered = Engine(lm, DecodeSettings(max_new_tokens=8, keep_logits=True)).run(prompt, cells, **kw)
    assert queries and set(queries) == {Q + len(gold)}  # the question + gold forward, every layer
    for a, b in zip([masked.full, *masked.outputs], [gathered.full, *gathered.outputs], strict=True):
        assert a.tokens == b.tokens
        torch.testing.assert_close(b.logits, a.logits, atol=1e-4, rtol=0)
        torch.testing.assert_close(b.last_attention, a.last_attention, atol=1e-5, rtol=0)
        torch.testing.assert_close(b.lens_logprob, a.lens_logprob, atol=1e-4, rtol=0)
        torch.testing.assert_close(b.lens_seq_logprob, a.lens_seq_logprob, atol=1e-4, rtol=0)
        assert b.gold_logprob == pytest.approx(a.gold_logprob, abs=1e-4)


def _decode(lm, prompt, masks, *, draft=None, attention_memory=None, **kw):
    from kvroute.engine.decode import decode_cells
    from kvroute.engine.prefill import prefill

    pre = prefill(lm.model, prompt.context_ids)
    settings = DecodeSettings(max_new_tokens=12, attention_memory=attention_memory, draft=True)
    return decode_cells(lm.model, lm.tokenizer, pre, prompt.question_ids, masks, draft=draft, settings=settings, **kw)


def _masks(lm, prompt):
    eng = Engine(lm)
    res = eng.run(prompt, [Cell(p, r) for p in ("knorm", "snapkv[window_size=8]", "expected_attention+adakv")
                           for r in (0.1, 0.5, 0.9)], decode_full=False)
    return res.masks


@pytest.mark.parametrize("memory, gather_from", [(None, None), (1, None), (None, 2)],
                         ids=["one_shot", "chunked", "gathered"])
def test_draft_verification_gives_the_greedy_tokens_whatever_the_draft(setup, memory, gather_from, monkeypatch):
    """Any draft — a cell's own answer (accepted whole), the same with one token changed (accepted up to it), noise,
    one token, one longer than the answer may be, one ending in EOS — leaves every cell's greedy tokens, gold
    log-prob, captured rows and generated-token masses as plain step-by-step decoding gives them (with the
    question and draft forwards gathered too: the rejected draft slots masked in the gathered form)."""
    import kvroute.engine.attention.streaming as streaming
    import kvroute.engine.decode as decode

    monkeypatch.setattr(streaming, "MIN_CHUNK", 16)
    monkeypatch.setattr(decode, "GATHER_MIN_QUERIES", gather_from or 10**9)
    lm, prompt = setup
    masks = _masks(lm, prompt)
    gold = lm.tokenizer.encode(" Ferravik", add_special_tokens=False)
    kw = dict(gold_ids=gold, track={"first": list(range(8)), "question": [len(prompt.context_ids) + 1]})
    plain = _decode(lm, prompt, masks, attention_memory=memory, **kw)
    own = plain[4].tokens
    eos = lm.model.generation_config.eos_token_id
    eos = eos[0] if isinstance(eos, list) else eos
    g = torch.Generator().manual_seed(1)
    drafts = {"own": own, "changed": own[:3] + [(own[3] + 1) % 200] + own[4:],
              "noise": torch.randint(0, 200, (12,), generator=g).tolist(), "one": own[:1], "long": own * 5,
              "eos": own[:5] + [eos]}
    for name, draft in drafts.items():
        got = _decode(lm, prompt, masks, draft=draft, attention_memory=memory, **kw)
        for a, b in zip(plain, got, strict=True):
            assert a.tokens == b.tokens, name
            assert b.gold_logprob == pytest.approx(a.gold_logprob, abs=1e-5)
            torch.testing.assert_close(b.last_attention, a.last_attention, atol=1e-6, rtol=0)
            for k in a.generated_mass:
                torch.testing.assert_close(b.generated_mass[k], a.generated_mass[k], atol=1e-5, rtol=0)


def test_an_accepted_draft_replaces_the_decode_steps(setup):
    """A draft the cells reproduce is verified in one forward: question forward + draft forward, no steps;
    a draft wrong from its third token leaves steps from there only."""
    lm, prompt = setup
    mask = _masks(lm, prompt)[0]
    calls = []
    hook = lm.model.register_forward_pre_hook(lambda _m, args, kwargs: calls.append(kwargs["input_ids"].shape[1]),
                                              with_kwargs=True)
    try:
        plain = _decode(lm, prompt, [mask, mask])[0].tokens
        assert len(plain) == 12 and len(calls) == 12  # (random weights: no EOS) the question, then 11 steps
        calls.clear()
        assert _decode(lm, prompt, [mask, mask], draft=plain)[0].tokens == plain
        assert calls == [len(prompt.question_ids), 11]
        calls.clear()
        changed = plain[:2] + [(plain[2] + 1) % 200] + plain[3:]
        assert _decode(lm, prompt, [mask, mask], draft=changed)[0].tokens == plain
        assert calls == [len(prompt.question_ids), 11] + [1] * 9  # tokens 0-2 decided; steps feed tokens 2 … 10
    finally:
        hook.remove()


def test_the_engine_drafts_with_the_full_cache_answer(setup):
    """Engine-level: draft on and off give the same cells, with and without the full-cache reference asked for."""
    lm, prompt = setup
    cells = [Cell(p, r) for p in ("knorm", "streaming_llm", "tova+pyramid[window_size=4]") for r in (0.0, 0.2, 0.9)]
    gold = lm.tokenizer.encode(" Ferravik", add_special_tokens=False)
    for decode_full in (True, False):
        off = Engine(lm, DecodeSettings(max_new_tokens=10, draft=False)).run(prompt, cells, gold_ids=gold,
                                                                            decode_full=decode_full)
        on = Engine(lm, DecodeSettings(max_new_tokens=10, draft=True)).run(prompt, cells, gold_ids=gold,
                                                                         decode_full=decode_full)
        assert [o.tokens for o in on.outputs] == [o.tokens for o in off.outputs]
        assert on.full is not None and on.full.tokens == off.full.tokens  # (ratio-0 cells share the full cache)


def test_the_planned_batch_is_what_the_free_memory_takes(setup, monkeypatch):
    """batch_size "auto": with free memory for exactly three cells beside the fixed part, cells are decoded three at
    a time, and give what one batch of all of them gives."""
    import kvroute.engine.attention.streaming as streaming
    from kvroute.engine.plan import HEADROOM, MemoryShape, plan_batch

    lm, prompt = setup
    cells = [Cell("knorm", r) for r in (0.1, 0.3, 0.5, 0.7, 0.9)]
    budget = 1 << 20
    one = Engine(lm, DecodeSettings(max_new_tokens=6, batch_size=64, attention_memory=budget)).run(prompt, cells)
    shape, T, Q = MemoryShape.of(lm.model), len(prompt.context_ids), len(prompt.question_ids)
    probe = plan_batch(shape, T=T, q=Q, new=6, cells=5, available=1 << 40, attention=budget, capture=True)
    available = int((probe.fixed + 3 * probe.per_cell + 1) / (1 - HEADROOM)) + 1
    monkeypatch.setattr(streaming, "available_memory", lambda _device: available)
    rows = []
    hook = lm.model.register_forward_pre_hook(lambda _m, _a, kw: rows.append(kw["input_ids"].shape), with_kwargs=True)
    try:
        planned = Engine(lm, DecodeSettings(max_new_tokens=6, attention_memory=budget, draft=False)).run(
            prompt, cells, decode_full=False)
    finally:
        hook.remove()
    assert [r[0] for r in rows if r[1] == Q] == [3, 2]  # two batches' question forwards: 3 cells, then 2
    for a, b in zip(one.outputs, planned.outputs, strict=True):
        assert a.tokens == b.tokens


def test_an_instance_too_big_for_the_memory_is_refused_before_its_prefill(setup, monkeypatch):
    import kvroute.engine.attention.streaming as streaming
    from kvroute.errors import InsufficientMemoryError

    lm, prompt = setup
    monkeypatch.setattr(streaming, "available_memory", lambda _device: 10_000)
    calls = []
    hook = lm.model.register_forward_pre_hook(lambda *_: calls.append(1))
    try:
        with pytest.raises(InsufficientMemoryError, match=r"needs about [\d.]+ GiB beside the model; 0.00 GiB is free"):
            Engine(lm, DecodeSettings(max_new_tokens=4)).run(prompt, [Cell("knorm", 0.5)])
    finally:
        hook.remove()
    assert calls == []  # refused before any forward


def test_run_returns_each_cells_error_and_computes_the_others(setup):
    """Without any flag, a cell that fails at each stage (its name, its scorer's precondition, its mask) is left out
    with its reason while the good cells are computed exactly as alone; ``raise_for_errors`` raises the first
    failed cell's own exception, with a note naming it. Raising at the first failure (the old default) fails this."""
    lm, prompt = setup
    T = len(prompt.context_ids)
    eng = Engine(lm, DecodeSettings(max_new_tokens=4))
    cells = [Cell("knorm", 0.5), Cell("snapvk", 0.5), Cell("knorm", 1 - 0.5 / T), Cell("snapkv[window_size=4]", 0.5),
             Cell(f"snapkv[window_size={T + 8}]", 0.5)]
    res = eng.run(prompt, cells, seed=0)
    alone = eng.run(prompt, [cells[0], cells[3]], seed=0)
    assert sorted(res.errors) == [1, 2, 4] and sorted(res.failures) == [1, 2, 4]
    assert "did you mean 'snapkv'" in res.errors[1] and "keeps 0 of" in res.errors[2]
    assert "window_size" in res.errors[4]
    assert res.masks[1] is None and res.outputs[1] is None and res.outputs[2] is None
    assert res.outputs[0].tokens == alone.outputs[0].tokens and res.outputs[3].tokens == alone.outputs[1].tokens
    assert torch.equal(res.masks[3].mask, alone.masks[1].mask)
    assert alone.raise_for_errors() is alone
    with pytest.raises(UnknownNameError, match="did you mean 'snapkv'") as raised:
        res.raise_for_errors()
    assert "(cell 1, snapvk@0.5; 3 of 5 cells failed)" in raised.value.__notes__


def test_restored_cells_decode_their_restored_masks_and_bad_conditions_are_cell_errors(setup):
    """A restore condition puts its entries back into the press's mask (decoded like any cell); a condition the
    model or the instance cannot take is that cell's error, not the run's; restoring into the full cache changes
    nothing."""
    lm, prompt = setup
    T, L = len(prompt.context_ids), lm.info.num_layers
    answer = [5, 6, 7]
    cells = [Cell("knorm", 0.9), Cell("knorm", 0.9, "answer"), Cell("knorm", 0.9, f"answer@layers:{L}-{L + 2}"),
             Cell("knorm", 0.9, "answer@heads:7"), Cell("knorm", 0.0, "answer"),
             Cell("knorm", 0.9, "answer@layers:late")]
    eng = Engine(lm, DecodeSettings(max_new_tokens=6))
    res = eng.run(prompt, cells, answer=answer)
    base, restored = res.masks[0].mask, res.masks[1].mask
    assert not base[:, :, answer].all() and restored[:, :, answer].all()
    assert torch.equal(restored, base | _answer_rows(L, base.shape[1], T, answer, range(L)))
    late = range(2 * L // 3, L)  # the last third of the layers
    assert torch.equal(res.masks[5].mask, base | _answer_rows(L, base.shape[1], T, answer, late))
    assert set(res.errors) == {2, 3}
    assert f"has {L} layers" in res.errors[2] and "KV heads" in res.errors[3]
    assert res.outputs[4].tokens == res.full.tokens  # restored into the uncompressed cache: the full answer
    alone = Engine(lm, DecodeSettings(max_new_tokens=6)).run(prompt, [Cell("knorm", 0.9, "answer")], answer=answer)
    assert alone.outputs[0].tokens == res.outputs[1].tokens
    with pytest.raises(EngineError, match="no answer tokens"):
        eng.run(prompt, [Cell("knorm", 0.5, "answer")]).raise_for_errors()  # no answer positions: the cell's error


def test_retrieval_head_restore_puts_the_answer_back_in_those_heads_only(setup):
    """``@heads:retrieval`` restores in the (layer, KV head) pairs serving the engine's retrieval heads (given as
    query heads); an engine that knows none records the cell's error and runs the others."""
    from kvroute.presses.restore import kv_pairs

    lm, prompt = setup
    info = lm.info
    answer = [5, 6, 7]
    heads = [(0, 0), (info.num_layers - 1, info.num_heads - 1)]
    cells = [Cell("knorm", 0.9), Cell("knorm", 0.9, "answer@heads:retrieval")]
    res = Engine(lm, DecodeSettings(max_new_tokens=4), retrieval_heads=heads).run(prompt, cells, answer=answer)
    expected = res.masks[0].mask.clone()
    for layer, h in kv_pairs(heads, info.num_heads, info.num_kv_heads):
        expected[layer, h, answer] = True
    assert torch.equal(res.masks[1].mask, expected) and not torch.equal(expected, res.masks[0].mask)
    bare = Engine(lm, DecodeSettings(max_new_tokens=4)).run(prompt, cells, answer=answer)
    assert set(bare.errors) == {1} and "no retrieval heads are known" in bare.errors[1]
    assert bare.outputs[0].tokens == res.outputs[0].tokens


def _answer_rows(L, H, T, answer, layers):
    rows = torch.zeros(L, H, T, dtype=torch.bool)
    for layer in layers:
        rows[layer, :, answer] = True
    return rows


def test_consensus_restore_puts_back_the_full_caches_consensus_token_of_each_layer(setup):
    from kvroute.presses.restore import consensus_positions

    lm, prompt = setup
    T = len(prompt.context_ids)
    res = Engine(lm, DecodeSettings(max_new_tokens=4)).run(prompt, [Cell("knorm", 0.9),
                                                                   Cell("knorm", 0.9, "consensus")])
    pos = consensus_positions(res.full.last_attention, T)
    assert len(pos) == lm.info.num_layers and all(4 <= p < T for p in pos)
    expected = res.masks[0].mask.clone()
    for layer, p in enumerate(pos):
        expected[layer, :, p] = True
    assert torch.equal(res.masks[1].mask, expected)


@pytest.mark.parametrize("draft", [False, True])
def test_generated_argmax_is_the_argmax_of_each_generated_row(setup, draft):
    """DecodeSettings.argmax records, per token fed back, each layer and head's most-attended context position: the
    argmax of the rows keep_generated_rows keeps (with draft verification too, where the rows come from the draft
    forward for the accepted tokens)."""
    lm, prompt = setup
    T = len(prompt.context_ids)
    cells = [Cell("knorm", r) for r in (0.3, 0.9)]
    rows = Engine(lm, DecodeSettings(max_new_tokens=6, keep_generated_rows=True)).run(prompt, cells)
    got = Engine(lm, DecodeSettings(max_new_tokens=6, argmax=True, draft=draft)).run(prompt, cells)
    for a, b in zip([rows.full, *rows.outputs], [got.full, *got.outputs], strict=True):
        assert a.tokens == b.tokens
        expected = torch.stack([r[..., :T].float().argmax(-1) for r in a.generated_rows])
        assert b.generated_argmax.shape == (len(a.tokens) - 1, lm.info.num_layers, lm.info.num_heads)
        assert (b.generated_argmax == expected).float().mean() > 0.99  # (float16 rows may tie where float32 does not)
