"""The seven generators: registration, knobs, validity of every instance, determinism, coverage, speed."""

import random
import re
import time

import pytest

from kvroute.errors import ConfigError, UnknownNameError
from kvroute.tasks import (
    ANSWER_TYPES,
    FAMILIES,
    IDK,
    QUESTION_TYPES,
    TaskSpec,
    dumps_tasks,
    generate_tasks,
    get_family,
)
from kvroute.tasks.text import TokenCounter

NAMES = ["base", "knowledge", "multi_presence", "multi_entity", "coreference", "long_context", "hops"]
CELLS = [(f, lv) for f in NAMES for lv in get_family(f).levels]


def test_all_seven_families_are_registered_with_versions():
    assert set(NAMES) <= set(FAMILIES.names())
    for name in NAMES:
        fam = get_family(name)
        assert fam.name == name and isinstance(fam.VERSION, int) and fam.VERSION >= 1
        d = fam.describe()
        assert d["levels"] and set(d["answer_types"]) <= set(ANSWER_TYPES)
        assert "target_tokens" in d["knobs"] and "unanswerable_share" in d["knobs"]


def test_unknown_family_suggests():
    with pytest.raises(UnknownNameError, match="did you mean 'hops'"):
        TaskSpec("hop")


@pytest.mark.parametrize("family,level", CELLS)
def test_every_instance_is_consistent(family, level):
    tasks = generate_tasks(TaskSpec(family, n=40, seed=3, difficulty=level,
                                    question_types=get_family(family).question_types))
    assert len(tasks) == 40 and len({t.id for t in tasks}) == 40
    for t in tasks:
        assert t.family == family and t.version == get_family(family).VERSION and t.seed == 3
        assert t.meta["difficulty"] == level
        assert t.answer_type in get_family(family).answer_types
        ev = t.evidence_spans
        if t.unanswerable:
            assert t.answers == (IDK,) and not t.answer_spans
            continue
        assert ev, "an answerable instance has evidence"
        for s, e in t.answer_spans:  # answers lie inside evidence, as whole words
            assert any(a <= s and e <= b for a, b in ev)
            assert t.span_text((s, e)) in t.answers
            assert not t.context[s - 1:s].isalnum() and not t.context[e:e + 1].isalnum()
        if t.question_type == "Standard":
            assert t.answer_spans, "a Standard answer is stated in the context"
        for d in t.distractors:
            assert d in t.context and d not in t.answers
        # the question names no answer (it would give it away)
        assert not any(re.search(rf"\b{re.escape(a)}\b", t.question) for a in t.answers)


@pytest.mark.parametrize("family", NAMES)
def test_all_answer_and_question_types_are_covered(family):
    fam = get_family(family)
    top = max(fam.levels)
    tasks = generate_tasks(TaskSpec(family, n=60, seed=0, difficulty=top, question_types=fam.question_types))
    assert {t.answer_type for t in tasks} == set(fam.answer_types) == set(ANSWER_TYPES)
    assert {t.question_type for t in tasks} == set(fam.question_types)
    expected_q = {"hops": {"Manipulated", "Part"}}.get(family, set(QUESTION_TYPES))
    assert set(fam.question_types) == expected_q


@pytest.mark.parametrize("family", NAMES)
def test_same_seed_same_bytes_and_prefix_stable(family):
    a = dumps_tasks(generate_tasks(TaskSpec(family, n=12, seed=5, difficulty=2)))
    b = dumps_tasks(generate_tasks(TaskSpec(family, n=12, seed=5, difficulty=2)))
    assert a == b
    first = dumps_tasks(generate_tasks(TaskSpec(family, n=5, seed=5, difficulty=2)))
    assert a.startswith(first)
    assert a != dumps_tasks(generate_tasks(TaskSpec(family, n=12, seed=6, difficulty=2)))


def test_generation_leaves_global_random_state_alone():
    random.seed(123)
    expected = random.random()
    random.seed(123)
    generate_tasks(TaskSpec("coreference", n=20, seed=1, difficulty=3))
    assert random.random() == expected


@pytest.mark.parametrize("kwargs,fragment", [
    ({"n": 0}, "n=0"),
    ({"n": 2.5}, "n=2.5"),
    ({"seed": -1}, "seed=-1"),
    ({"difficulty": 9}, "has levels 1, 2, 3"),
    ({"depth": 0.5}, "needs target_tokens"),
    ({"depth": 1.5, "target_tokens": 100}, "depth=1.5"),
    ({"target_tokens": 3}, "target_tokens=3"),
    ({"unanswerable_share": 0.3}, "no unanswerable items"),
    ({"distractors": 50}, "at most"),
    ({"answer_types": ("Colour",)}, "allowed values"),
    ({"question_types": ("Hard",)}, "allowed values"),
])
def test_spec_validation(kwargs, fragment):
    with pytest.raises(ConfigError, match=re.escape(fragment)):
        TaskSpec("base", **kwargs)


def test_spec_rejects_impossible_type_combinations():
    with pytest.raises(ConfigError, match="no questions"):
        TaskSpec("base", answer_types=("Location",), question_types=("Manipulated",))
    TaskSpec("hops", question_types=("Part",))
    with pytest.raises(ConfigError, match="no questions"):
        TaskSpec("hops", question_types=("Standard",))


@pytest.mark.parametrize("share", [0.0, 1.0])
def test_unanswerable_share_extremes(share):
    tasks = generate_tasks(TaskSpec("coreference", n=30, seed=0, difficulty=2, unanswerable_share=share))
    assert all(t.unanswerable == (share == 1.0) for t in tasks)
    if share == 1.0:
        assert {t.meta["reason"] for t in tasks} == {"ambiguous", "absent"}
        assert all(t.answers == (IDK,) and t.meta["abstain"] for t in tasks)


def test_default_unanswerable_share_is_near_a_quarter():
    tasks = generate_tasks(TaskSpec("coreference", n=400, seed=0, difficulty=2))
    assert 0.18 < sum(t.unanswerable for t in tasks) / 400 < 0.32


@pytest.mark.parametrize("target", [150, 600, 2000])
def test_target_tokens_estimated_and_measured(target, tiny_tok):
    for tok in (None, tiny_tok):
        tasks = generate_tasks(TaskSpec("long_context", n=5, seed=0, target_tokens=target), tok)
        count = TokenCounter(tok)
        for t in tasks + generate_tasks(TaskSpec("base", n=3, seed=0, target_tokens=target), tok):
            n = count(t.context)
            assert t.meta["context_tokens"] == n
            # within one filler sentence of the target, or the facts alone are already longer
            assert abs(n - target) <= max(30, 0.04 * target) or (t.meta["filler_sentences"] == 0 and n > target)


@pytest.mark.parametrize("depth", [0.0, 0.5, 1.0])
def test_depth_places_the_evidence(depth):
    for t in generate_tasks(TaskSpec("long_context", n=5, seed=1, target_tokens=1500, depth=depth)):
        start = t.evidence_spans[0][0] / len(t.context)
        assert abs(start - depth) < 0.1, (start, depth)
        assert t.meta["depth"] == pytest.approx(depth, abs=0.05)


def test_part_questions_need_two_evidence_sentences():
    for family in ("base", "knowledge", "multi_entity", "hops", "multi_presence"):
        fam = get_family(family)
        for t in generate_tasks(TaskSpec(family, n=16, seed=0, difficulty=max(fam.levels),
                                         question_types=("Part",))):
            assert len(t.evidence_spans) >= 2, (family, t.context, t.question)


def test_hops_levels_count_links():
    for level, links in ((1, 1), (2, 1), (3, 2), (4, 3)):
        for t in generate_tasks(TaskSpec("hops", n=5, seed=0, difficulty=level)):
            assert len(t.meta["links"]) == links and len(t.evidence_spans) == links + 1


def test_ten_thousand_instances_take_seconds():
    t0 = time.process_time()  # CPU time: wall time on a shared machine measures the neighbours
    tasks = generate_tasks(TaskSpec("knowledge", n=10_000, seed=0, difficulty=3))
    assert len(tasks) == 10_000
    assert time.process_time() - t0 < 15  # ~3 s of CPU here


@pytest.fixture(scope="module")
def tiny_tok():
    from kvroute.models import tiny_tokenizer

    return tiny_tokenizer()
