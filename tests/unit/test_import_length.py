"""Long inputs: skipped with a count, or cut from the middle with the answers re-located; raw prompts."""

import json

import pytest

from kvroute.errors import NetworkError
from kvroute.models import tiny_tokenizer
from kvroute.tasks import build_prompt
from kvroute.tasks.importers import ImportOptions, import_tasks
from kvroute.tasks.importers.length import cut_middle, prompt_length
from kvroute.tasks.importers.sources import is_hub_id

FILL = "The river was quiet in the early morning. "


def row(context, answer="4471", task="t", **kw):
    return {"context": context, "question": "What is the code?", "answer": [answer], "answer_prefix": "Answer:",
            "max_new_tokens": 8, "task": task, **kw}


def write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


@pytest.fixture
def source(tmp_path):
    short = "The code is 4471. " + FILL
    head = "The code is 4471. " + FILL * 30  # answer at the start: survives a middle cut
    middle = FILL * 15 + "The code is 4471. " + FILL * 15  # answer in the middle: cut away
    both = "The code is 4471. " + FILL * 30 + "Again the code is 4471."
    return write(tmp_path / "long.jsonl", [row(short), row(head), row(middle), row(both)])


def test_too_long_instances_are_skipped_and_counted(tok, source):
    res = import_tasks(str(source), ImportOptions(max_tokens=200), tokenizer=tok)
    (c,) = res.summary
    assert (c.rows, c.instances, c.skipped_too_long, c.truncated) == (4, 1, 3, 0)
    (inst,) = res.instances
    assert prompt_length(tok, inst) <= 200 and inst.meta["context_tokens"] > 0
    assert res.max_tokens == 200


def test_middle_truncation_keeps_head_and_tail_and_relocates_answers(tok, source):
    res = import_tasks(str(source), ImportOptions(max_tokens=200, truncate="middle"), tokenizer=tok)
    (c,) = res.summary
    assert (c.instances, c.skipped_too_long, c.truncated, c.with_spans, c.evidence_none) == (4, 0, 3, 3, 1)
    short, head, middle, both = res.instances
    assert "truncated" not in short.meta
    for inst in (head, middle, both):
        assert prompt_length(tok, inst) <= 200
        t = inst.meta["truncated"]
        assert t["original_tokens"] > 200 and t["removed_chars"][0] < t["removed_chars"][1]
    assert head.context.startswith("The code is 4471.") and len(head.answer_spans) == 1
    assert middle.meta["evidence"] == "none" and middle.answer_spans == ()  # the only occurrence was cut
    assert [both.span_text(s) for s in both.answer_spans] == ["4471", "4471"]
    assert both.context.endswith("Again the code is 4471.")


def test_cut_middle_is_at_token_boundaries(tok):
    text = FILL * 10
    cut = cut_middle(tok, text, 20)
    assert cut is not None and cut.kept_context_tokens == 20
    s, e = cut.removed
    assert cut.context == text[:s] + text[e:]
    assert len(tok.encode(cut.context, add_special_tokens=False)) <= 22  # BPE may merge a token at the seam
    assert cut_middle(tok, text, 4) is None  # too little left to keep
    assert cut_middle(tok, "short", 100).context == "short"


def test_raw_prompt_is_kvpress_exact(tok, tmp_path):
    from kvpress.pipeline import KVPressTextGenerationPipeline

    (inst,) = import_tasks(str(write(tmp_path / "r.jsonl", [row("Intro. The code is 4471. Outro.\n")]))).instances
    p = build_prompt(tok, inst)
    pipe = KVPressTextGenerationPipeline.__new__(KVPressTextGenerationPipeline)
    pipe.tokenizer = tok
    ref = pipe.preprocess(inst.context, [inst.question], "Answer:", max_context_length=10**9)
    assert p.context_ids == ref["context_ids"][0].tolist()
    assert p.question_ids == ref["questions_ids"][0][0].tolist()
    assert p.kvpress_context == inst.context and p.kvpress_question == inst.question and p.answer_prefix == "Answer:"
    assert "4471" in tok.decode([p.input_ids[i] for i in p.answer_positions])
    assert inst.question in tok.decode([p.input_ids[i] for i in p.question_positions])
    aware = build_prompt(tok, inst, regime="aware")
    assert inst.question in tok.decode([aware.input_ids[i] for i in aware.question_positions])
    assert all(q < aware.n_context for q in aware.question_positions)
    assert build_prompt(tok, inst, answer_prefix="A:").question_text.endswith("A:")  # the caller's prefix wins


def test_hub_offline_fails_at_once_pointing_to_local_files(monkeypatch):
    import kvroute.hub as hub

    monkeypatch.setattr(hub, "hub_reachable", lambda timeout=3.0: False)
    with pytest.raises(NetworkError) as e:
        import_tasks("simonjegou/ruler", ImportOptions(config="4096", split="test"))
    msg = str(e.value)
    assert "unreachable" in msg and "simonjegou/ruler" in msg and "Parquet" in msg and "\n" not in msg
    assert is_hub_id("org/name") and is_hub_id("squad")
    assert not is_hub_id("data/file.jsonl") and not is_hub_id("./x") and not is_hub_id("a b")
