"""The task JSONL format: round trips, content-hash ids, and validation errors with line and field."""

import json

import pytest

from kvroute.errors import TaskFormatError
from kvroute.tasks import FORMAT_VERSION, TaskInstance, dumps_tasks, load_tasks, save_tasks
from kvroute.tasks.instance import FIELDS, content_hash

CONTEXT = "Maren Oskvold was born in Velkirra. She works for the Brasswind Guild."


def good(**over):
    d = {
        "family": "custom", "version": 1, "seed": None, "context": CONTEXT,
        "question": "In which town was Maren Oskvold born?", "answers": ["Velkirra"], "unanswerable": False,
        "answer_spans": [[26, 34]], "evidence_spans": [[0, 35]], "distractors": ["Brasswind Guild"],
        "answer_type": "Location", "question_type": "Standard", "meta": {"difficulty": 1},
    }
    d.update(over)
    return d


def test_round_trip_and_canonical_line():
    inst = TaskInstance.from_dict(good())
    line = inst.to_json()
    assert list(json.loads(line)) == list(FIELDS)  # fixed key order
    assert json.loads(line)["meta"]["format"] == FORMAT_VERSION
    again = TaskInstance.from_dict(json.loads(line))
    assert again.to_json() == line
    assert inst.span_text(inst.answer_spans[0]) == "Velkirra"
    assert inst.difficulty == 1


def test_id_is_a_content_hash_not_of_seed_or_meta():
    a = TaskInstance.from_dict(good())
    b = TaskInstance.from_dict(good(seed=7, version=3, meta={"x": 1}))
    c = TaskInstance.from_dict(good(question="Where was Maren Oskvold born?"))
    assert a.id == b.id != c.id
    assert len(a.id) == 16 and int(a.id, 16) >= 0
    assert a.id == content_hash(**{k: getattr(a, k) for k in (
        "family", "context", "question", "answers", "unanswerable", "answer_spans", "evidence_spans",
        "distractors", "answer_type", "question_type")})


def test_user_ids_are_kept():
    assert TaskInstance.from_dict(good(id="squad-001")).id == "squad-001"


def test_unicode_is_written_unescaped(tmp_path):
    ctx = "Ærø Ødegård was born in Ålvik."
    inst = TaskInstance.from_dict(good(context=ctx, answer_spans=[[24, 29]], evidence_spans=[[0, 30]],
                                       answers=["Ålvik"], distractors=[]))
    save_tasks([inst], tmp_path / "t.jsonl")
    raw = (tmp_path / "t.jsonl").read_bytes()
    assert "Ålvik".encode() in raw and raw.endswith(b"\n") and b"\r" not in raw
    assert load_tasks(tmp_path / "t.jsonl")[0] == inst


@pytest.mark.parametrize("change,field,fragment", [
    ({"answer_spans": [[26, 99]]}, "answer_spans", "out of range"),
    ({"answer_spans": [[-1, 3]]}, "answer_spans", "out of range"),
    ({"answer_spans": [[5, 5]]}, "answer_spans", "out of range"),
    ({"answer_spans": [[0, 5]]}, "answer_spans", "not one of the answers"),
    ({"answer_spans": [["a", 3]]}, "answer_spans", "pair of integers"),
    ({"evidence_spans": [[0, 500]]}, "evidence_spans", "out of range"),
    ({"answers": []}, "answers", "non-empty"),
    ({"answers": "Velkirra"}, "answers", "list of strings"),
    ({"answer_type": "Colour"}, "answer_type", "not one of"),
    ({"question_type": "Hard"}, "question_type", "not one of"),
    ({"distractors": ["Dunmarrow"]}, "distractors", "does not occur"),
    ({"unanswerable": True}, "answer_spans", "no answer spans"),
    ({"unanswerable": "no"}, "unanswerable", "true or false"),
    ({"version": "1"}, "version", "integer"),
    ({"context": "  "}, "context", "non-empty"),
    ({"meta": []}, "meta", "object"),
    ({"meta": {"format": FORMAT_VERSION + 1}}, "meta", "newer"),
    ({"colour": "red"}, "colour", "unknown field"),
])
def test_validation_names_the_field(change, field, fragment):
    with pytest.raises(TaskFormatError) as e:
        TaskInstance.from_dict(good(**change))
    assert e.value.field == field
    assert fragment in str(e.value)


def test_answer_span_may_differ_from_the_answer_only_by_normalisation():
    inst = TaskInstance.from_dict(good(answers=["velkirra"]))
    assert inst.span_text(inst.answer_spans[0]) == "Velkirra"


def test_missing_field_reports_line_and_field(tmp_path):
    d = good()
    del d["question"]
    p = tmp_path / "tasks.jsonl"
    p.write_text(json.dumps(good()) + "\n\n" + json.dumps(d) + "\n")
    with pytest.raises(TaskFormatError) as e:
        load_tasks(p)
    assert (e.value.line, e.value.field) == (3, "question")
    assert str(p) in str(e.value) and "line 3" in str(e.value) and "'question'" in str(e.value)


def test_span_out_of_range_reports_line(tmp_path):
    p = tmp_path / "tasks.jsonl"
    p.write_text(json.dumps(good()) + "\n" + json.dumps(good(question="Q?", answer_spans=[[60, 80]])) + "\n")
    with pytest.raises(TaskFormatError) as e:
        load_tasks(p)
    assert (e.value.line, e.value.field) == (2, "answer_spans")


def test_bad_json_and_duplicates(tmp_path):
    p = tmp_path / "bad.jsonl"
    p.write_text(json.dumps(good()) + "\n{not json\n")
    with pytest.raises(TaskFormatError, match="line 2: invalid JSON"):
        load_tasks(p)
    p.write_text(json.dumps(good()) + "\n" + json.dumps(good()) + "\n")
    with pytest.raises(TaskFormatError) as e:
        load_tasks(p)
    assert (e.value.line, e.value.field) == (2, "id")
    with pytest.raises(TaskFormatError, match="no such file"):
        load_tasks(tmp_path / "missing.jsonl")


def test_json_list_files(tmp_path):
    p = tmp_path / "tasks.json"
    p.write_text(json.dumps([good(), good(question="Where does Maren Oskvold come from?")]))
    assert len(load_tasks(p)) == 2
    p.write_text(json.dumps([good(), good(answer_type="Colour")]))
    with pytest.raises(TaskFormatError) as e:
        load_tasks(p)
    assert (e.value.line, e.value.field) == (2, "answer_type")
    p.write_text(json.dumps(good()))
    with pytest.raises(TaskFormatError, match="must hold a list"):
        load_tasks(p)


def test_save_is_byte_stable(tmp_path):
    insts = [TaskInstance.from_dict(good()), TaskInstance.from_dict(good(question="Where?"))]
    save_tasks(insts, tmp_path / "a.jsonl")
    save_tasks(list(load_tasks(tmp_path / "a.jsonl")), tmp_path / "b.jsonl")
    assert (tmp_path / "a.jsonl").read_bytes() == (tmp_path / "b.jsonl").read_bytes()
    assert (tmp_path / "a.jsonl").read_text() == dumps_tasks(insts)
