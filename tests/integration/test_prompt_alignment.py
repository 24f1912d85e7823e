"""Prompts: kvpress's exact token layout, and character spans found back as tokens.

For many generated instances (hypothesis over family, level, seed, regime, system prompt and
answer prefix), the tokens at ``answer_positions`` decode to text containing the answer, evidence
contains the answer, the question tokens decode to the question, and ``input_ids`` equal what
kvpress's ``KVPressTextGenerationPipeline.preprocess`` produces from the same strings. Run on the
tiny ChatML tokenizer always, and on the SmolLM2 (Llama) and Qwen2.5 tokenizers when the embedded
models are available (``embedded`` marker).
"""

import copy
import functools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvroute.errors import ConfigError, TaskFormatError
from kvroute.models import tiny_tokenizer
from kvroute.tasks import TaskInstance, TaskSpec, build_prompt, generate_tasks, get_family, prompt_texts
from kvroute.tasks.prompt import ABSTAIN_CLAUSE

NAMES = ["base", "knowledge", "multi_presence", "multi_entity", "coreference", "long_context", "hops"]
CELLS = [(f, lv) for f in NAMES for lv in get_family(f).levels]


@functools.cache
def _instances(family: str, level: int, seed: int) -> tuple[TaskInstance, ...]:
    fam = get_family(family)
    target = 300 if family == "long_context" else None  # keep long contexts short here
    return tuple(generate_tasks(TaskSpec(family, n=4, seed=seed, difficulty=level, target_tokens=target,
                                         question_types=fam.question_types)))


def kvpress_ids(tokenizer, context: str, question: str, answer_prefix: str) -> tuple[list[int], list[int]]:
    """kvpress's own preprocessing (the pipeline method, called on a bare instance)."""
    from kvpress.pipeline import KVPressTextGenerationPipeline

    pipe = KVPressTextGenerationPipeline.__new__(KVPressTextGenerationPipeline)
    pipe.tokenizer = tokenizer
    out = pipe.preprocess(context, [question], answer_prefix, max_context_length=10**9)
    return out["context_ids"][0].tolist(), out["questions_ids"][0][0].tolist()


def check_prompt(tok, inst: TaskInstance, regime: str, system_prompt: str | None, answer_prefix: str) -> None:
    p = build_prompt(tok, inst, regime=regime, system_prompt=system_prompt, answer_prefix=answer_prefix)
    ids = p.input_ids
    assert ids == tok.encode(p.text[: len(p.context_text)], add_special_tokens=False) + \
        tok.encode(p.question_text, add_special_tokens=False)
    assert p.n_context == len(p.context_ids) and p.text == p.context_text + p.question_text
    assert p.context_text[p.context_char_offset:].startswith(inst.context)
    # every answer span is found back as tokens that decode to text containing the answer
    assert len(p.answer_span_positions) == len(inst.answer_spans)
    for (s, e), pos in zip(inst.answer_spans, p.answer_span_positions, strict=True):
        assert pos == list(range(pos[0], pos[-1] + 1)), "a span maps to contiguous tokens"
        assert all(q < p.n_context for q in pos), "answers lie in the compressible context"
        assert inst.span_text((s, e)) in tok.decode([ids[q] for q in pos])
        # minimal: dropping the first or last token loses part of the answer
        if len(pos) > 1:
            assert inst.span_text((s, e)) not in tok.decode([ids[q] for q in pos[1:]])
            assert inst.span_text((s, e)) not in tok.decode([ids[q] for q in pos[:-1]])
    assert set(p.answer_positions) <= set(p.evidence_positions)
    # every distractor occurrence is found back as context tokens that hold part of its text, none the answer's
    assert not {q for o in p.distractor_span_positions for q in o} & set(p.answer_positions)
    assert all(q < p.n_context for o in p.distractor_span_positions for q in o)
    if any(d not in inst.answers and inst.context.count(d) for d in inst.distractors):
        assert p.distractor_span_positions, "distractors in the context give distractor tokens"
    decoded = [tok.decode([ids[q] for q in o]) for o in p.distractor_span_positions]
    assert all(any(w and w in text for d in inst.distractors for w in d.split()) or len(text.strip()) <= 2
               for text in decoded), decoded
    if inst.evidence_spans:
        ev_text = tok.decode([ids[q] for q in p.evidence_positions])
        assert inst.span_text(inst.evidence_spans[0]).split()[0] in ev_text
    q_text = tok.decode([ids[q] for q in p.question_positions])
    assert inst.question in q_text
    if regime == "agnostic":
        assert all(q >= p.n_context for q in p.question_positions)
    else:
        assert all(q < p.n_context for q in p.question_positions)
    if system_prompt is None:  # token for token what kvpress's pipeline builds
        assert kvpress_ids(tok, p.kvpress_context, p.kvpress_question, answer_prefix) == (p.context_ids,
                                                                                           p.question_ids)


prompt_cases = st.tuples(
    st.sampled_from(CELLS), st.integers(0, 40), st.integers(0, 3), st.sampled_from(["agnostic", "aware"]),
    st.sampled_from([None, "You answer questions about texts."]), st.sampled_from(["", "Answer:"]),
)


# the default tests use SmolLM2 only (its GGUF is small); Qwen2.5's tokenizer (a 490 MB GGUF) runs with `make test-slow`
EMBEDDED = ["smollm2-135m", pytest.param("qwen2.5-0.5b", marks=pytest.mark.slow)]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(prompt_cases)
def test_alignment_tiny_tokenizer(case):
    (family, level), seed, k, regime, system, prefix = case
    check_prompt(tiny_tokenizer(), _instances(family, level, seed)[k], regime, system, prefix)


@pytest.mark.embedded
@pytest.mark.parametrize("model", EMBEDDED)
def test_alignment_embedded_tokenizers(model):
    from kvroute.models import load_tokenizer

    tok = load_tokenizer(model)

    @settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(prompt_cases)
    def run(case):
        (family, level), seed, k, regime, system, prefix = case
        check_prompt(tok, _instances(family, level, seed)[k], regime, system, prefix)

    run()


@pytest.mark.embedded
@pytest.mark.parametrize("model", EMBEDDED)
def test_every_family_level_aligns_on_embedded_tokenizers(model):
    """Deterministic sweep on top of the property test: every cell, both regimes."""
    from kvroute.models import load_tokenizer

    tok = load_tokenizer(model)
    for family, level in CELLS:
        for inst in _instances(family, level, 0):
            for regime in ("agnostic", "aware"):
                check_prompt(tok, inst, regime, None, "")


def test_spans_under_bpe_merges_and_special_tokens():
    """An answer glued to punctuation and at the very start/end of the context still aligns."""
    tok = tiny_tokenizer()
    ctx = "Velkirra.Maren was born in Velkirra,Ferravik"
    inst = TaskInstance.create(
        family="custom", version=0, seed=None, context=ctx, question="Where?", answers=["Velkirra", "Ferravik"],
        unanswerable=False, answer_spans=[[0, 8], [27, 35], [36, 44]], evidence_spans=[[0, 44]], distractors=[],
        answer_type="Location", question_type="Standard")
    for regime in ("agnostic", "aware"):
        check_prompt(tok, inst, regime, None, "")


def test_without_chat_template_matches_kvpress():
    tok = copy.deepcopy(tiny_tokenizer())
    tok.chat_template = None
    inst = _instances("base", 1, 0)[0]
    p = build_prompt(tok, inst)  # no BOS token: kvroute uses "" (kvpress itself fails on None + str)
    assert p.question_text.endswith("\n") and p.context_text.startswith("Read")
    tok.bos_token = "<|endoftext|>"
    p = build_prompt(tok, inst)
    assert p.context_ids[0] == tok.convert_tokens_to_ids("<|endoftext|>")
    check_prompt(tok, inst, "agnostic", None, "")
    check_prompt(tok, inst, "aware", None, "")


def test_prompt_texts_abstain_follows_meta():
    coref = next(t for t in _instances("coreference", 1, 0))
    base = _instances("base", 1, 0)[0]
    assert ABSTAIN_CLAUSE in prompt_texts(coref)[1]
    assert ABSTAIN_CLAUSE not in prompt_texts(base)[1]
    assert ABSTAIN_CLAUSE in prompt_texts(base, abstain=True)[1]
    ctx, q = prompt_texts(base)
    assert base.context in ctx and base.question in q


def test_aware_regime_puts_the_question_in_the_context():
    tok = tiny_tokenizer()
    inst = _instances("base", 1, 0)[0]
    a, w = build_prompt(tok, inst), build_prompt(tok, inst, regime="aware")
    assert a.input_ids == w.input_ids or a.text == w.text  # same text, split elsewhere
    assert w.n_context > a.n_context and w.kvpress_question == ""


def test_errors():
    tok = tiny_tokenizer()
    inst = _instances("base", 1, 0)[0]
    with pytest.raises(ConfigError, match="unknown regime"):
        build_prompt(tok, inst, regime="both")

    class NoOffsets:
        chat_template = None
        bos_token = None
        is_fast = True

        def __call__(self, text, **kw):
            return {"input_ids": [1] * 3, "offset_mapping": [(0, 0)] * 3}

    with pytest.raises(TaskFormatError, match="maps to no token"):
        build_prompt(NoOffsets(), inst)
