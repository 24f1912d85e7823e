"""Several questions over one context: the multi-question form, turn prompts, and run_conversation.

The engine side is checked as equivalences: a later turn decoded on turn 1's prefill equals a fresh run of
the same conversation prompt (its own prefill), cell by cell; turn 1 equals ``run_instance``; a whole
conversation costs one prefill.
"""

import copy

import pytest

import kvroute.engine.engine as engine_mod
from kvroute.engine import Cell, Engine
from kvroute.errors import ConfigError, EngineError
from kvroute.models import tiny_model
from kvroute.runner import _run_prompt, run_conversation, run_instance
from kvroute.settings import RunSettings
from kvroute.tasks import TaskSpec, generate_tasks
from kvroute.tasks.conversation import conversation_prompt, conversations
from kvroute.tasks.prompt import build_prompt

SETTINGS = RunSettings(max_new_tokens=4, metrics=("retention", "accessibility", "utilization"), history="own")
CELLS = [Cell("none", 0.0), Cell("snapkv", 0.5), Cell("knorm", 0.9), Cell("expected_attention", 0.75)]


@pytest.fixture(scope="module")
def lm():
    return tiny_model("llama", seed=0)


@pytest.fixture(scope="module")
def conv(lm):
    return conversations(generate_tasks(TaskSpec("base", n=2, seed=0, questions=3, target_tokens=200),
                                        lm.tokenizer))[0]


# --- the multi-question form ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("family", ["base", "multi_entity", "hops", "knowledge", "long_context"])
def test_multi_question_form_shares_one_context_and_keeps_each_questions_own_evidence(family):
    ts = generate_tasks(TaskSpec(family, n=3, seed=1, questions=3, target_tokens=300))
    assert len(ts) == 9
    convs = conversations(ts)
    assert [len(c) for c in convs] == [3, 3, 3]
    for c in convs:
        assert len({t.context for t in c}) == 1
        assert [t.meta["turn"] for t in c] == [1, 2, 3] and {t.meta["turns"] for t in c} == {3}
        assert len({t.meta["conversation"] for t in c}) == 1 and len({t.id for t in c}) == 3
        for t in c:
            assert t.answer_spans and t.evidence_spans
            # every answer span lies in this question's own evidence, which no other question shares
            assert all(any(s >= a and e <= b for a, b in t.evidence_spans) for s, e in t.answer_spans)
            others = {sp for u in c if u is not t for sp in u.evidence_spans}
            assert not set(t.evidence_spans) & others
            # its answer is not said by another question's evidence
            for u in c:
                if u is not t:
                    assert not any(t.answers[0] in t.context[a:b] for a, b in u.evidence_spans)


def test_multi_question_form_is_deterministic_and_independent_of_n():
    a = generate_tasks(TaskSpec("base", n=2, seed=4, questions=2))
    b = generate_tasks(TaskSpec("base", n=3, seed=4, questions=2))
    assert [t.to_dict() for t in a] == [t.to_dict() for t in b[:4]]


def test_one_question_keeps_the_single_instance_form():
    a = generate_tasks(TaskSpec("base", n=3, seed=2))
    b = generate_tasks(TaskSpec("base", n=3, seed=2, questions=1))
    assert [t.id for t in a] == [t.id for t in b] and "turn" not in a[0].meta


@pytest.mark.parametrize("kw, match", [({"family": "niah", "questions": 2}, "no multi-question form"),
                                       ({"family": "base", "questions": 0}, "questions"),
                                       ({"family": "base", "questions": 99}, "questions")])
def test_bad_multi_question_specs_fail_in_one_line(kw, match):
    with pytest.raises(ConfigError, match=match):
        TaskSpec(n=2, **kw)


def test_imported_rows_sharing_a_context_are_one_conversation_in_file_order():
    ts = generate_tasks(TaskSpec("base", n=2, seed=0))
    a, b = ts
    twin = type(a).create(**{**a.to_dict(), "id": None, "question": "Who is it?", "meta": {}})
    convs = conversations([a, b, twin])
    assert [[t.id for t in c] for c in convs] == [[a.id, twin.id], [b.id]]


# --- turn prompts --------------------------------------------------------------------------------------------------

def test_turn_one_is_the_single_instance_prompt(lm, conv):
    assert conversation_prompt(lm.tokenizer, conv[:1], [], answer_prefix="Answer:") == build_prompt(
        lm.tokenizer, conv[0], answer_prefix="Answer:")


@pytest.mark.parametrize("chat", [True, False])
def test_later_turns_share_the_context_and_locate_their_question_and_answer(lm, conv, chat):
    tok = lm.tokenizer if chat else copy.copy(lm.tokenizer)
    if not chat:
        tok.chat_template = None
    p1 = conversation_prompt(tok, conv[:1], [], answer_prefix="Answer:")
    p3 = conversation_prompt(tok, conv, ["Foo", "Bar"], answer_prefix="Answer:")
    assert p3.context_ids == p1.context_ids
    assert p3.question_text.startswith(p1.question_text.removesuffix("Answer:"))
    assert "Foo" in p3.question_text and "Bar" in p3.question_text and p3.question_text.endswith("Answer:")
    assert tok.decode([p3.input_ids[i] for i in p3.question_positions]).strip() == conv[2].question
    assert tok.decode([p3.input_ids[i] for i in p3.answer_positions]).strip() == conv[2].answers[0]


@pytest.mark.parametrize("chat", [True, False])
@pytest.mark.parametrize("prefix", ["Answer:", "Answer: ", ""])
def test_earlier_answers_are_written_with_the_models_own_separator(lm, conv, chat, prefix):
    """Bare answers get the separator of ``answer_separator``: one space after ``"Answer:"`` or the chat
    template's ``assistant\n``, none after ``"Answer: "``; an answer given with a space of its own gives the same."""
    tok = lm.tokenizer if chat else copy.copy(lm.tokenizer)
    if not chat:
        tok.chat_template = None
    bare = conversation_prompt(tok, conv, ["Foo", "Bar"], answer_prefix=prefix)
    spaced = conversation_prompt(tok, conv, [" Foo", " Bar"], answer_prefix=prefix)
    text = bare.question_text
    assert spaced.question_text == text
    sep = "" if prefix.endswith(" ") else " "
    assert prefix + sep + "Foo" in text and prefix + sep + "Bar" in text
    assert "  Foo" not in text and "  Bar" not in text


def test_turn_prompts_refuse_the_aware_regime_and_other_contexts(lm, conv):
    with pytest.raises(ConfigError, match="agnostic"):
        conversation_prompt(lm.tokenizer, conv[:2], [" x"], regime="aware")
    other = generate_tasks(TaskSpec("base", n=1, seed=9))[0]
    with pytest.raises(ConfigError, match="share one context"):
        conversation_prompt(lm.tokenizer, [conv[0], other], [" x"])
    with pytest.raises(ConfigError, match="earlier answers"):
        conversation_prompt(lm.tokenizer, conv, [" x"])


# --- run_conversation ----------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def ran(lm, conv, monkeypatch_module):
    calls = []
    real = engine_mod.prefill

    def counting(*a, **kw):
        calls.append(len(a[1]))
        return real(*a, **kw)

    monkeypatch_module.setattr(engine_mod, "prefill", counting)
    eng = Engine(lm, SETTINGS.decode_settings())
    out = run_conversation(eng, conv, CELLS, settings=SETTINGS)
    monkeypatch_module.setattr(engine_mod, "prefill", real)
    return eng, out, calls


@pytest.fixture(scope="module")
def monkeypatch_module():
    mp = pytest.MonkeyPatch()
    yield mp
    mp.undo()


def test_a_conversation_costs_one_prefill_and_tags_its_turns(ran, conv):
    _, out, calls = ran
    assert len(calls) == 1
    assert [len(t) for t in out] == [len(CELLS)] * 3
    for k, turn in enumerate(out):
        for r, c in zip(turn, CELLS, strict=True):
            assert (r["press"], r["ratio"], r["turn"], r["turns"]) == (c.press, c.ratio, k + 1, 3)
            assert r["instance_id"] == conv[k].id and r["conversation"] == conv[0].meta["conversation"]
            assert r["status"] == "ok"
            assert (r["seconds_prefill"] > 0) == (k == 0)


def test_turn_one_is_run_instance(ran, conv, lm):
    eng, out, _ = ran
    ref = run_instance(eng, conv[0], CELLS, settings=SETTINGS)
    for a, b in zip(out[0], ref, strict=True):
        assert a["answer"] == b["answer"] and a["gold_logprob"] == pytest.approx(b["gold_logprob"], abs=1e-4)


def test_a_later_turn_on_the_shared_prefill_equals_a_fresh_run_of_its_prompt(ran, conv, lm):
    """Each cell's turn k, rebuilt from its own earlier answers and run with a prefill of its own."""
    eng, out, _ = ran
    for k in (1, 2):
        for i, c in enumerate(CELLS):
            history = [out[j][i]["answer"] for j in range(k)]
            p = conversation_prompt(lm.tokenizer, conv[:k + 1], history, answer_prefix=SETTINGS.answer_prefix)
            fresh, _ = _run_prompt(eng, conv[k], p, [c], regime="agnostic", seed=0, settings=SETTINGS,
                                   model_name=lm.name)
            got = out[k][i]
            assert got["answer"] == fresh[0]["answer"], (k, c)
            assert got["gold_logprob"] == pytest.approx(fresh[0]["gold_logprob"], abs=1e-4)
            assert got["ger_evidence"] == fresh[0]["ger_evidence"]
            assert got["evidence_attention_mass"] == pytest.approx(fresh[0]["evidence_attention_mass"], abs=1e-5)


def test_the_mask_is_the_same_every_turn(ran):
    """Question-agnostic compression: the context's keep mask does not depend on the question asked."""
    _, out, _ = ran
    for i in range(len(CELLS)):
        assert len({out[k][i]["eviction_rate"] for k in range(3)}) == 1


def test_gold_history_gives_every_cell_the_same_conversation(lm, conv):
    s = RunSettings(max_new_tokens=4, metrics=("utilization",), history="gold")
    eng = Engine(lm, s.decode_settings())
    out = run_conversation(eng, conv, CELLS, settings=s)
    p = conversation_prompt(lm.tokenizer, conv, [conv[0].answers[0], conv[1].answers[0]])
    fresh, _ = _run_prompt(eng, conv[2], p, CELLS, regime="agnostic", seed=0, settings=s, model_name=lm.name)
    assert [r["answer"] for r in out[2]] == [r["answer"] for r in fresh]


def test_a_prefill_of_another_context_is_refused(lm, conv):
    eng = Engine(lm, SETTINGS.decode_settings())
    p0 = build_prompt(lm.tokenizer, conv[0])
    res = eng.run(p0, [Cell("snapkv", 0.5)])
    other = build_prompt(lm.tokenizer, generate_tasks(TaskSpec("base", n=1, seed=9))[0])
    with pytest.raises(EngineError, match="another context"):
        eng.run(other, [Cell("snapkv", 0.5)], prefilled=res.prefill)
    with pytest.raises(EngineError, match="no scores for knorm"):
        eng.run(p0, [Cell("knorm", 0.5)], prefilled=res.prefill).raise_for_errors()


def test_history_setting_is_checked_with_a_suggestion():
    with pytest.raises(ConfigError, match="did you mean 'own'"):
        RunSettings(history="onw")
