"""The needle-in-a-haystack generator: grids, exact spans, depth and length, any haystack, RULER round trip."""

import json

import pytest

from kvroute.errors import ConfigError
from kvroute.models import tiny_tokenizer
from kvroute.tasks import TaskSpec, build_prompt, dumps_tasks, generate_tasks, get_family
from kvroute.tasks.families.niah import SHIPPED, NiahSpec, _paragraphs, generate_niah, niah_rows
from kvroute.tasks.importers import import_tasks
from kvroute.tasks.text import TokenCounter


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


def test_grid_covers_every_cell_with_exact_spans(tok):
    spec = NiahSpec(lengths=(200, 600), depths=(0.0, 0.5, 1.0), n=2, seed=1)
    xs = generate_niah(spec, tok)
    longest = max(len(tok.encode(" " + s)) for p in _paragraphs(None) for s in p)
    assert len(xs) == 12 and len({x.id for x in xs}) == 12
    cells = [(x.meta["target_length"], x.meta["depth"]) for x in xs]
    assert cells == [(L, d) for L in (200, 600) for d in (0.0, 0.5, 1.0) for _ in range(2)]
    for x in xs:
        (a,), (ev,) = x.answer_spans, x.evidence_spans
        value = x.answers[0]
        assert x.span_text(a) == value and len(value) == 7 and value.isdigit() and x.context.count(value) == 1
        assert x.span_text(ev) == f"The special magic number for {x.meta['key']} is {value}."
        assert x.meta["key"] in x.question and value not in x.question
        assert x.family == "niah" and x.answer_type == "Numeral" and x.meta["haystack"] == SHIPPED
        # length within about one sentence of the target, measured with the tokenizer
        assert abs(x.meta["context_tokens"] - x.meta["target_length"]) <= longest + 5
        assert x.meta["tokens_counted_with"] != "estimate"
        p = build_prompt(tok, x)
        assert value in tok.decode([p.input_ids[i] for i in p.answer_positions])


def test_depth_places_the_needle(tok):
    xs = generate_niah(NiahSpec(lengths=(800,), depths=(0.0, 0.25, 0.5, 0.75, 1.0), seed=3), tok)
    starts = [x.answer_spans[0][0] / len(x.context) for x in xs]
    assert xs[0].context.startswith("The special magic number")
    assert xs[-1].context.endswith(xs[-1].span_text(xs[-1].evidence_spans[0]))
    for x, s in zip(xs, starts, strict=True):
        assert abs(x.meta["depth_realised"] - x.meta["depth"]) <= 0.1
        assert abs(s - x.meta["depth"]) <= 0.12


def test_same_seed_same_bytes_and_other_seed_differs(tok):
    spec = NiahSpec(lengths=(300,), depths=(0.3,), n=3, seed=7)
    assert dumps_tasks(generate_niah(spec, tok)) == dumps_tasks(generate_niah(spec, tok))
    other = NiahSpec(lengths=(300,), depths=(0.3,), n=3, seed=8)
    assert dumps_tasks(generate_niah(spec, tok)) != dumps_tasks(generate_niah(other, tok))


def test_user_haystack_and_templates_and_cycling(tmp_path):
    hay = tmp_path / "hay.txt"
    hay.write_text("Alpha beta gamma. Delta epsilon zeta!\n\nEta theta iota? Kappa lambda mu.\n")
    spec = NiahSpec(lengths=(400,), depths=(0.5,), haystack=hay, needle="Remember: {key} opens with {value}.",
                    question="What opens {key}?")
    (x,) = generate_niah(spec)  # word estimate; the short text is cycled to reach the length
    assert x.meta["haystack"] == "hay.txt" and x.meta["tokens_counted_with"] == "estimate"
    assert x.context.count("Alpha beta gamma.") > 3
    assert x.span_text(x.evidence_spans[0]) == f"Remember: {x.meta['key']} opens with {x.answers[0]}."
    assert x.question == f"What opens {x.meta['key']}?"


@pytest.mark.parametrize("kw,match", [({"lengths": (8,)}, "lengths"), ({"depths": (1.5,)}, "depths"),
                                      ({"n": 0}, "n="), ({"needle": "no fields"}, "needle"),
                                      ({"question": "{key} is {value}?"}, "question"),
                                      ({"haystack": "/no/such/file.txt"}, "no such file")])
def test_spec_validation(kw, match):
    with pytest.raises(ConfigError, match=match):
        NiahSpec(**kw)


def test_registered_family_through_taskspec(tok):
    fam = get_family("niah")
    assert fam.describe()["answer_types"] == ["Numeral"]
    xs = generate_tasks(TaskSpec("niah", n=3, seed=2, target_tokens=300, depth=0.4), tok)
    assert [x.meta["depth"] for x in xs] == [0.4] * 3 and all(x.meta["target_length"] == 300 for x in xs)
    ys = generate_tasks(TaskSpec("niah", n=3, seed=2))  # level 1 length, depth drawn per instance
    assert {y.meta["target_length"] for y in ys} == {500} and len({y.meta["depth"] for y in ys}) == 3
    with pytest.raises(ConfigError, match="at most 8"):
        TaskSpec("niah", distractors=9)


def test_multi_key_needles_are_distractors_that_need_binding():
    tok = tiny_tokenizer()
    plain = generate_tasks(TaskSpec("niah", n=4, seed=5, target_tokens=300), tok)
    multi = generate_tasks(TaskSpec("niah", n=4, seed=5, target_tokens=300, distractors=3), tok)
    assert generate_tasks(TaskSpec("niah", n=4, seed=5, target_tokens=300, distractors=0), tok) == plain
    for x, y in zip(plain, multi, strict=True):
        assert not x.distractors and len(y.distractors) == 3
        assert y.meta["key"] == x.meta["key"] and y.answers == x.answers  # the asked needle is unchanged
        keys = y.meta["distractor_keys"]
        assert len(set(keys)) == 3 and y.meta["key"] not in keys
        for k, v in zip(keys, y.distractors, strict=True):
            assert y.context.count(f"The special magic number for {k} is {v}.") == 1
            assert v != y.answers[0] and y.context.count(v) == 1
        a, b = y.answer_spans[0]
        assert y.context[a:b] == y.answers[0]
        e0, e1 = y.evidence_spans[0]
        assert y.context[e0:e1] == f"The special magic number for {y.meta['key']} is {y.answers[0]}."
    with pytest.raises(ConfigError, match="distractors"):
        NiahSpec(distractors=-1)


@pytest.mark.parametrize("layout", ["ruler", "kvpress"])
def test_export_then_import_round_trip(tmp_path, tok, layout):
    xs = generate_niah(NiahSpec(lengths=(250,), depths=(0.0, 1.0), n=2), tok)
    rows = niah_rows(xs, layout, count=TokenCounter(tok))
    path = tmp_path / f"niah_{layout}.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    res = import_tasks(str(path))
    assert res.layout == layout and len(res.instances) == 4
    for x, y in zip(xs, res.instances, strict=True):
        assert y.answers == x.answers and [y.span_text(s) for s in y.answer_spans] == list(x.answers)
        assert y.span_text(y.evidence_spans[0]) == x.span_text(x.evidence_spans[0])
        assert y.question == x.question and x.context in y.context
        assert y.meta["depth"] == x.meta["depth"] and y.meta["target_length"] == x.meta["target_length"]
        assert y.meta["answer_prefix"].strip() == x.meta["answer_prefix_template"]
    if layout == "ruler":
        assert rows[0]["length"] == len(tok.encode(rows[0]["input"], add_special_tokens=False))
