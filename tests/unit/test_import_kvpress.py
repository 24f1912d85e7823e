"""Importing kvpress-layout files (JSONL, JSON, CSV, Parquet) written here: spans, evidence none, errors by row."""

import csv
import json

import pytest

from kvroute.errors import ConfigError, TaskFormatError, UnknownNameError
from kvroute.tasks import TaskInstance, load_tasks, save_tasks
from kvroute.tasks.importers import ImportOptions, import_tasks, infer_answer_type

ROWS = [
    {"context": "The vault code is 4471. Later the code 4471 was changed back.\nNothing else.",
     "question": "What is the vault code?", "answer": ["4471"], "answer_prefix": "Answer:", "max_new_tokens": 8,
     "task": "codes"},
    {"context": "Tea with MRS.  O\u2019brien in\nnew york was lovely.", "question": "Who was it?",
     "answer": ["Mrs. O'Brien"], "answer_prefix": "", "max_new_tokens": 12, "task": "people"},
    {"context": "A text that never states the answer.", "question": "Where is the key?", "answer": "Velkirra",
     "answer_prefix": "", "max_new_tokens": 12, "task": "people"},
]


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def write_csv(path, rows):
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        for r in rows:
            w.writerow({k: (repr(v) if isinstance(v, list) else v) for k, v in r.items()})  # pandas-style lists
    return path


def write_parquet(path, rows):
    import pyarrow as pa
    import pyarrow.parquet as pq

    norm = [{**r, "answer": r["answer"] if isinstance(r["answer"], list) else [r["answer"]]} for r in rows]
    pq.write_table(pa.Table.from_pylist(norm), path)
    return path


def write_json(path, rows):
    path.write_text(json.dumps(rows), encoding="utf-8")
    return path


WRITERS = {"jsonl": write_jsonl, "csv": write_csv, "parquet": write_parquet, "json": write_json}


@pytest.mark.parametrize("kind", list(WRITERS))
def test_each_file_kind_imports_the_same_instances(tmp_path, kind):
    src = WRITERS[kind](tmp_path / f"data.{kind}", ROWS)
    res = import_tasks(str(src))
    assert res.layout == "kvpress" and len(res.instances) == 3
    a, b, c = res.instances
    # an answer occurring twice: both occurrences, each with its own sentence as evidence
    assert [a.span_text(s) for s in a.answer_spans] == ["4471", "4471"]
    assert [a.span_text(s) for s in a.evidence_spans] == ["The vault code is 4471.",
                                                         "Later the code 4471 was changed back."]
    assert a.meta["evidence"] == "located" and a.meta["answer_occurrences"] == [2]
    # different case, spacing and a curly apostrophe: found, offsets cover the original text
    assert [b.span_text(s) for s in b.answer_spans] == ["MRS.  O\u2019brien"]
    # absent: kept, marked evidence none, no spans
    assert c.answer_spans == () and c.evidence_spans == () and c.meta["evidence"] == "none"
    assert c.answers == ("Velkirra",) and not c.unanswerable
    # what kvpress needs to rebuild its prompt, and where the row came from
    assert a.meta["prompt_style"] == "raw" and a.meta["answer_prefix"] == "Answer:" and a.meta["max_new_tokens"] == 8
    assert [x.meta["source_row"] for x in res.instances] == [1, 2, 3]
    assert [x.family for x in res.instances] == ["codes", "people", "people"]
    assert a.answer_type == "Numeral" and b.answer_type == "Thing" and a.question_type == "Standard"
    summary = {t.task: t.as_dict() for t in res.summary}
    assert summary["codes"] == {"task": "codes", "rows": 1, "instances": 1, "with_spans": 1, "evidence_none": 0,
                                "skipped_too_long": 0, "truncated": 0, "duplicates": 0}
    assert summary["people"]["with_spans"] == 1 and summary["people"]["evidence_none"] == 1
    assert res.totals().instances == 3


def test_imported_instances_survive_a_save_load_round_trip(tmp_path):
    res = import_tasks(str(write_jsonl(tmp_path / "d.jsonl", ROWS)))
    save_tasks(res.instances, tmp_path / "out.jsonl")
    assert tuple(load_tasks(tmp_path / "out.jsonl")) == res.instances


def test_family_defaults_to_the_file_stem_and_extra_columns_go_to_meta(tmp_path):
    rows = [{"context": "Born on 4 March 1921 in Ostrelle.", "question": "When?", "answer": "4 March 1921",
             "length": 123, "source": "kept", "nested": {"x": 1}}]
    res = import_tasks(str(write_jsonl(tmp_path / "longbench_qa.jsonl", rows)))
    (inst,) = res.instances
    assert inst.family == "longbench_qa" and inst.answer_type == "Date/Time"
    assert inst.meta["length"] == 123 and inst.meta["source_source"] == "kept" and "nested" not in inst.meta
    assert inst.meta["answer_prefix"] == "" and "max_new_tokens" not in inst.meta
    res = import_tasks(str(tmp_path / "longbench_qa.jsonl"), ImportOptions(family="lb"))
    assert res.instances[0].family == "lb"


def test_exact_duplicates_are_counted_not_written_twice(tmp_path):
    res = import_tasks(str(write_jsonl(tmp_path / "d.jsonl", [ROWS[0], ROWS[0], ROWS[1]])))
    assert len(res.instances) == 2 and res.totals().duplicates == 1 and res.totals().rows == 3


@pytest.mark.parametrize("kind,row_no,where", [("jsonl", 2, "line 3"), ("csv", 2, "line 4"), ("parquet", 2, "row 2"),
                                               ("json", 2, "row 2")])  # csv: row 1 spans lines 2-3
def test_a_malformed_row_is_an_error_with_its_row_number(tmp_path, kind, row_no, where):
    bad = {**ROWS[1], "question": "   "}
    rows = [ROWS[0], bad, ROWS[2]]
    src = WRITERS[kind](tmp_path / f"bad.{kind}", rows)
    if kind == "jsonl":  # a blank line before the bad row: errors name the physical line
        src.write_text(src.read_text().replace("\n", "\n\n", 1))
    with pytest.raises(TaskFormatError) as e:
        import_tasks(str(src))
    assert where in str(e.value) and "'question'" in str(e.value) and "empty" in str(e.value)
    assert str(src) in str(e.value)


def test_more_malformed_rows(tmp_path):
    p = tmp_path / "m.jsonl"
    p.write_text(json.dumps(ROWS[0]) + "\n{not json\n")
    with pytest.raises(TaskFormatError, match="line 2.*invalid JSON"):
        import_tasks(str(p))
    write_jsonl(p, [ROWS[0], {**ROWS[1], "answer": []}])
    with pytest.raises(TaskFormatError, match="line 2, field 'answer': has no non-empty answer"):
        import_tasks(str(p))
    write_jsonl(p, [ROWS[0], {k: v for k, v in ROWS[1].items() if k != "context"}])
    with pytest.raises(TaskFormatError, match="line 2, field 'context': missing value"):
        import_tasks(str(p))
    write_jsonl(p, [{**ROWS[0], "max_new_tokens": "many"}])
    with pytest.raises(TaskFormatError, match="line 1, field 'max_new_tokens': must be a whole number"):
        import_tasks(str(p))
    c = tmp_path / "m.csv"
    c.write_text('context,question,answer\n"a b",q,a\n"c d",q,a,EXTRA\n')
    with pytest.raises(TaskFormatError, match="line 3: has 4 fields but the header has 3"):
        import_tasks(str(c))


def test_csv_lists_and_multiline_fields(tmp_path):
    c = tmp_path / "multi.csv"
    c.write_text('context,question,answer\n"line one\nline two with Zed",who?,"[""zed"", ""Zedd""]"\n'
                 '"bad row",q,\n')
    with pytest.raises(TaskFormatError, match="line 4, field 'answer': missing|line 4, field 'answer': has no"):
        import_tasks(str(c))  # the second record starts on line 4 (the first spans lines 2-3)
    c.write_text('context,question,answer\n"line one\nline two with Zed",who?,"[""zed"", ""Zedd""]"\n')
    (inst,) = import_tasks(str(c)).instances
    assert inst.answers == ("zed", "Zedd") and [inst.span_text(s) for s in inst.answer_spans] == ["Zed"]
    assert inst.meta["answer_occurrences"] == [1, 0]


def test_layout_detection_and_override(tmp_path):
    p = write_jsonl(tmp_path / "x.jsonl", [{"text": "a", "label": "b"}])
    with pytest.raises(TaskFormatError, match="fit no known layout.*kvpress: context, question, answer"):
        import_tasks(str(p))
    with pytest.raises(UnknownNameError, match="did you mean 'ruler'"):
        ImportOptions(layout="rular")
    with pytest.raises(TaskFormatError, match="field 'input': missing value"):
        import_tasks(str(write_jsonl(tmp_path / "k.jsonl", ROWS)), ImportOptions(layout="ruler"))


def test_bad_sources_and_options(tmp_path):
    with pytest.raises(TaskFormatError, match="no such file"):
        import_tasks(str(tmp_path / "missing.parquet"))
    (tmp_path / "x.xlsx").write_text("x")
    with pytest.raises(TaskFormatError, match="unknown file type '.xlsx'"):
        import_tasks(str(tmp_path / "x.xlsx"))
    with pytest.raises(ConfigError, match="--config and --split"):
        import_tasks(str(write_jsonl(tmp_path / "d.jsonl", ROWS)), ImportOptions(split="test"))
    with pytest.raises(ConfigError, match="truncate"):
        ImportOptions(truncate="middle")
    with pytest.raises(ConfigError, match="truncate"):
        ImportOptions(truncate="head", max_tokens=100)
    with pytest.raises(ConfigError, match="give a tokenizer"):
        import_tasks(str(tmp_path / "d.jsonl"), ImportOptions(max_tokens=100))
    assert len(import_tasks(str(tmp_path / "d.jsonl"), ImportOptions(limit=2)).instances) == 2


def test_validation_still_rejects_wrong_spans_of_kvroute_families():
    base = dict(family="base", version=1, seed=0, context="Ann lives in Oslo.", question="Where does Ann live?",
                answers=["Oslo"], unanswerable=False, evidence_spans=[[0, 18]], distractors=[],
                answer_type="Location", question_type="Standard")
    assert TaskInstance.create(answer_spans=[[13, 17]], **base).answer_spans == ((13, 17),)
    with pytest.raises(TaskFormatError, match="covers 'Ann ', which is not one of the answers"):
        TaskInstance.create(answer_spans=[[0, 4]], **base)


@pytest.mark.parametrize("answers,kind", [(["42"], "Numeral"), (["1,234.5", "7"], "Numeral"),
                                          (["2021-03-04"], "Date/Time"), (["March 4, 2021"], "Date/Time"),
                                          (["14:30"], "Date/Time"), (["42 apples"], "Thing"), (["Oslo"], "Thing"),
                                          (["42", "Oslo"], "Thing")])
def test_answer_type_inference(answers, kind):
    assert infer_answer_type(answers) == kind
