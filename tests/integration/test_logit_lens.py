"""The logit lens on tiny models equals a hand computation, and its last layer is the model's own prediction."""

import pytest
import torch

from kvroute.engine import Cell, DecodeSettings, Engine
from kvroute.engine.reference import kvpress_prompt_ids
from kvroute.models import tiny_model
from kvroute.runner import RunSettings, gold_ids, run_instance
from kvroute.tasks.instance import TaskInstance
from kvroute.tasks.prompt import build_prompt

CONTEXT = ("Alice Morgan was born in Ferravik in 1987 and works as a glassblower for the Northwind Company. "
           "Her brother lives in Quenby; his manager is Tobias Vell. ")
QUESTION = "Question: where was Alice born? Answer briefly."


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def lm(request):
    lm = tiny_model(request.param, seed=0)
    # a final norm with non-unit weights: a lens that skips the norm, or applies it twice, cannot pass
    with torch.no_grad():
        g = torch.Generator().manual_seed(1)
        lm.model.model.norm.weight.copy_(1.5 + torch.rand(lm.model.model.norm.weight.shape, generator=g))
    return lm


def _prompt(lm):
    class P:
        context_ids, question_ids = kvpress_prompt_ids(lm.tokenizer, CONTEXT * 2, QUESTION)
    return P


def test_lens_equals_final_norm_and_unembedding_of_the_hidden_states(lm):
    p = _prompt(lm)
    ids = lm.tokenizer.encode(" Ferravik Quenby Tobias", add_special_tokens=False)[:3]
    res = Engine(lm, DecodeSettings(max_new_tokens=2)).run(p, [Cell("none", 0.0)], lens_ids=ids)
    out = res.outputs[0]
    L = lm.model.config.num_hidden_layers
    assert out.lens_logprob.shape == (L, 3) and out.lens_rank.shape == (L, 3)
    with torch.no_grad():
        ref = lm.model(torch.tensor([p.context_ids + p.question_ids]), output_hidden_states=True)
    for layer in range(1, L):  # intermediate layers: the final norm + lm_head by hand
        logp = torch.log_softmax(lm.model.lm_head(lm.model.model.norm(ref.hidden_states[layer][0, -1])), -1)
        torch.testing.assert_close(out.lens_logprob[layer - 1], logp[ids], atol=1e-4, rtol=0)
        want = torch.tensor([(logp > logp[i]).sum() for i in ids])
        assert torch.equal(out.lens_rank[layer - 1], want)
    final = torch.log_softmax(ref.logits[0, -1], -1)
    torch.testing.assert_close(out.lens_logprob[-1], final[ids], atol=1e-4, rtol=0)
    assert torch.equal(out.lens_rank[-1], torch.tensor([(final > final[i]).sum() for i in ids]))
    # an intermediate layer really differs from the last (the test is not comparing a constant)
    assert not torch.allclose(out.lens_logprob[0], out.lens_logprob[-1], atol=1e-3)


def test_last_layer_lens_is_the_models_next_token_logprob_under_compression(lm):
    p = _prompt(lm)
    first = lm.tokenizer.encode(" Ferravik", add_special_tokens=False)[:1]
    cells = [Cell("knorm", 0.5), Cell("snapkv[window_size=8]", 0.8), Cell("anti_oracle[base=knorm]", 0.9)]
    eng = Engine(lm, DecodeSettings(max_new_tokens=2, keep_logits=True))
    res = eng.run(p, cells, gold_ids=first, lens_ids=first, evidence=list(range(5, 15)))
    lps = [float(o.lens_logprob[-1, 0]) for o in res.outputs]
    for o, lp in zip(res.outputs, lps, strict=True):
        own = torch.log_softmax(o.logits[0], -1)[first[0]]  # the masked model's next-token distribution
        assert lp == pytest.approx(float(own), abs=1e-4)
        assert lp == pytest.approx(o.gold_logprob, abs=1e-4)  # teacher-forced log p of a one-token gold
    assert len({round(v, 3) for v in lps}) > 1  # the masks change the reading
    single = Engine(lm, DecodeSettings(max_new_tokens=2, batch_size=1)).run(p, cells, lens_ids=first,
                                                                             evidence=list(range(5, 15)))
    for a, b in zip(res.outputs, single.outputs, strict=True):
        torch.testing.assert_close(a.lens_logprob, b.lens_logprob, atol=1e-4, rtol=0)


def test_no_lens_ids_no_lens(lm):
    res = Engine(lm, DecodeSettings(max_new_tokens=1, capture=False)).run(_prompt(lm), [Cell("knorm", 0.5)])
    assert res.outputs[0].lens_logprob is None and res.outputs[0].lens_rank is None


def _instance():
    ctx = CONTEXT
    s = ctx.index("Ferravik")
    return TaskInstance.create(family="base", version=1, seed=None, context=ctx,
                               question="Where was Alice Morgan born?",
                               answers=["Ferravik"], unanswerable=False, answer_spans=[[s, s + 8]],
                               evidence_spans=[[0, ctx.index("1987") + 4]],
                               distractors=["Quenby", "Tobias Vell", "Northwind Company"], answer_type="Location",
                               question_type="Standard")


def test_records_carry_the_lens_of_the_gold_and_every_candidate(lm):
    inst = _instance()
    settings = RunSettings(max_new_tokens=3)
    cells = [Cell("none", 0.0), Cell("knorm", 0.5), Cell("anti_oracle[base=knorm]", 0.9)]
    recs = run_instance(Engine(lm, settings.decode_settings()), inst, cells, settings=settings)
    L = lm.model.config.num_hidden_layers
    prompt = build_prompt(lm.tokenizer, inst)
    for r in recs:
        assert len(r["lens_gold_logprob"]) == L and len(r["lens_gold_rank"]) == L
        assert r["lens_gold_logprob_final"] == r["lens_gold_logprob"][-1]
        assert r["lens_gold_rank_final"] == int(r["lens_gold_rank"][-1])
        n = r["lens_n_candidates"]
        assert n + r["lens_candidates_dropped"] == 4 and n >= 2
        assert len(r["lens_candidates"]) == n and all(len(c) == L for c in r["lens_candidates"])
        assert r["lens_candidates"][0] == r["lens_gold_logprob"]  # the gold is the first candidate
        finals = [c[-1] for c in r["lens_candidates"]]
        assert r["lens_identity_top1"] == (1.0 if finals[0] > max(finals[1:]) else 0.0)
        top1 = [i + 1 for i, k in enumerate(r["lens_gold_rank"]) if k == 0]
        assert r["lens_top1_layer"] == (top1[0] if top1 else None)
    assert recs[0]["lens_gold_logprob_delta"] == 0.0
    assert recs[2]["lens_gold_logprob_delta"] == pytest.approx(
        recs[2]["lens_gold_logprob_final"] - recs[0]["lens_gold_logprob_final"], abs=1e-5)
    # the lens reads the gold's first token as the model would write it after the prompt (the runner's
    # gold tokens, leading space included): its full-cache last-layer value is the model's own log-prob of it
    first = gold_ids(lm.tokenizer, inst, prompt)[0]
    assert first == lm.tokenizer(prompt.question_text + " Ferravik", add_special_tokens=False)["input_ids"][
        len(prompt.question_ids)]
    with torch.no_grad():
        logits = lm.model(torch.tensor([prompt.input_ids])).logits[0, -1]
    assert recs[0]["lens_gold_logprob_final"] == pytest.approx(float(torch.log_softmax(logits, -1)[first]), abs=1e-4)


def test_records_carry_the_sequence_lens_of_every_distinct_candidate(lm):
    """The sequence lens keeps every distinct candidate (none dropped for a shared first token), the gold
    first, and its last layer is the masked model's own log-likelihood of the gold: the record's
    ``gold_logprob``, which the engine computes by teacher forcing in a separate code path."""
    from kvroute.metrics.representation import answer_candidates

    inst = _instance()
    settings = RunSettings(max_new_tokens=3)
    cells = [Cell("none", 0.0), Cell("knorm", 0.5), Cell("anti_oracle[base=knorm]", 0.9)]
    recs = run_instance(Engine(lm, settings.decode_settings()), inst, cells, settings=settings)
    L = lm.model.config.num_hidden_layers
    prompt = build_prompt(lm.tokenizer, inst)
    cands = answer_candidates(lm.tokenizer, prompt, inst, gold_ids(lm.tokenizer, inst, prompt))
    assert cands.seq_texts == ("Ferravik", *inst.distractors) and len(set(cands.seqs)) == 4
    assert cands.seqs[0] == tuple(gold_ids(lm.tokenizer, inst, prompt))
    for r in recs:
        assert r["lens_seq_n_candidates"] == 4 and len(r["lens_candidates_seq"]) == 4
        assert all(len(c) == L for c in r["lens_candidates_seq"])
        assert r["lens_gold_seq_logprob_final"] == r["lens_candidates_seq"][0][-1]
        assert r["lens_gold_seq_logprob_final"] == pytest.approx(r["gold_logprob"], abs=1e-3)
        finals = [c[-1] for c in r["lens_candidates_seq"]]
        assert r["lens_seq_identity_top1"] == (1.0 if finals[0] > max(finals[1:]) else 0.0)
    # the mask changes the reading
    assert len({round(r["lens_gold_seq_logprob_final"], 3) for r in recs}) > 1


def test_sequence_lens_is_the_masked_models_log_likelihood_of_each_sequence(lm):
    p = _prompt(lm)
    tok = lm.tokenizer
    seqs = [tok.encode(t, add_special_tokens=False) for t in (" Ferravik in 1987", " Quenby", " Tobias Vell")]
    assert max(map(len, seqs)) >= 3 and min(map(len, seqs)) >= 1
    cells = [Cell("none", 0.0), Cell("knorm", 0.5), Cell("snapkv[window_size=8]", 0.8),
             Cell("anti_oracle[base=knorm]", 0.9)]
    ev = list(range(5, 15))
    eng = Engine(lm, DecodeSettings(max_new_tokens=2))
    res = eng.run(p, cells, lens_seqs=seqs, evidence=ev)
    L = lm.model.config.num_hidden_layers
    # the last layer of each sequence equals the teacher-forced log p(sequence | prompt) under the same
    # mask, which the engine computes in its question forward for a gold (a separate code path)
    for j, s in enumerate(seqs):
        gold = eng.run(p, cells, gold_ids=s, evidence=ev)
        for a, b in zip(res.outputs, gold.outputs, strict=True):
            assert a.lens_seq_logprob.shape == (L, len(seqs))
            assert float(a.lens_seq_logprob[-1, j]) == pytest.approx(b.gold_logprob, abs=1e-3)
    # the full cache by hand: every layer's lens summed over the sequence's tokens
    s = seqs[0]
    with torch.no_grad():
        ref = lm.model(torch.tensor([p.context_ids + p.question_ids + s]), output_hidden_states=True)
    n = len(p.context_ids) + len(p.question_ids)
    for layer in range(1, L):
        h = ref.hidden_states[layer][0, n - 1 : n - 1 + len(s)]
        logp = torch.log_softmax(lm.model.lm_head(lm.model.model.norm(h)), -1)
        want = float(logp[torch.arange(len(s)), torch.tensor(s)].sum())
        assert float(res.outputs[0].lens_seq_logprob[layer - 1, 0]) == pytest.approx(want, abs=1e-3)
    # masks change the reading; batching does not
    assert len({round(float(o.lens_seq_logprob[-1, 0]), 3) for o in res.outputs}) > 1
    single = Engine(lm, DecodeSettings(max_new_tokens=2, batch_size=1)).run(p, cells, lens_seqs=seqs, evidence=ev)
    for a, b in zip(res.outputs, single.outputs, strict=True):
        torch.testing.assert_close(a.lens_seq_logprob, b.lens_seq_logprob, atol=1e-4, rtol=0)


@pytest.mark.parametrize("chunk", [None, 1, 7])  # one chunk; one row per chunk; chunks that cut across layers
def test_lens_pass_equals_the_lens_layer_by_layer_at_several_positions(lm, chunk):
    """The lens of N positions with their own token ids, every layer's rows through the unembedding together in
    chunks (kvroute.engine.decode._lens_pass), equals a log-softmax per layer and position, ranks of the first ids
    included."""
    from kvroute.engine.decode import _lens_pass

    p = _prompt(lm)
    with torch.no_grad():
        ref = lm.model(torch.tensor([p.context_ids + p.question_ids]), output_hidden_states=True)
        N, L = 5, lm.model.config.num_hidden_layers
        hidden = [h[0, -N:] for h in ref.hidden_states]
        V = ref.logits.shape[-1]
        cols = torch.randint(0, V, (N, 3), generator=torch.Generator().manual_seed(2))  # other ids at each position
        kw = {} if chunk is None else {"chunk": chunk * V}
        lp, rank = _lens_pass(lm.model, hidden, ref.logits[0, -N:], cols, ranked=2, **kw)
        assert lp.shape == (N, L, 3) and rank.shape == (N, L, 2)
        for layer in range(1, L + 1):
            if layer < L:
                logp = torch.log_softmax(lm.model.lm_head(lm.model.model.norm(hidden[layer])), -1)
            else:
                logp = torch.log_softmax(ref.logits[0, -N:], -1)
            want = logp.gather(-1, cols)
            torch.testing.assert_close(lp[:, layer - 1], want, atol=1e-5, rtol=0)
            assert torch.equal(rank[:, layer - 1], (logp.unsqueeze(1) > want[:, :2].unsqueeze(-1)).sum(-1))
