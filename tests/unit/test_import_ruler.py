"""Importing RULER-layout JSONL (input, outputs, length) written here: the question split, spans, errors."""

import json

import pytest

from kvroute.errors import TaskFormatError
from kvroute.tasks.importers import import_tasks
from kvroute.tasks.importers.ruler import split_input

HEADER = ("Some special magic numbers are hidden within the following text. Make sure to memorize it. "
          "I will quiz you about the numbers afterwards.\n")
NIAH_Q = "What are all the special magic numbers for jittery-hospital mentioned in the provided text?"


def niah_input(haystack: str) -> str:
    return HEADER + haystack + "\n" + NIAH_Q


ROWS = [
    {"index": 0, "input": niah_input("The grass is green. One of the special magic numbers for jittery-hospital is: "
                                     "5437923. The sky is blue. One of the special magic numbers for "
                                     "jittery-hospital is: 1234567."),
     "outputs": ["5437923", "1234567"], "length": 80,
     "answer_prefix": " The special magic numbers for jittery-hospital mentioned in the provided text are"},
    {"index": 1, "input": niah_input("The grass is green. A number: 5 437 923. Nothing more."),
     "outputs": ["5 437  923"], "length": 40},
    {"index": 2, "input": niah_input("The grass is green and the needle is gone."), "outputs": ["9999999"],
     "length": 40},
    {"index": 3, "input": "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n"
                          "VAR QPE = 64024 VAR SGF = VAR QPE\nQuestion: Find all variables that are assigned the "
                          "value 64024 in the text above.", "outputs": ["QPE", "sgf"], "length": 50},
]


def write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_ruler_rows_become_instances_with_all_occurrences(tmp_path):
    res = import_tasks(str(write(tmp_path / "niah_multivalue.jsonl", ROWS)))
    assert res.layout == "ruler" and len(res.instances) == 4
    a, b, c, d = res.instances
    assert a.family == "niah_multivalue"  # no task column: the file stem
    assert a.question == NIAH_Q and a.context + a.question == ROWS[0]["input"]
    assert [a.span_text(s) for s in a.answer_spans] == ["5437923", "1234567"]
    assert [a.span_text(s) for s in a.evidence_spans] == [
        "One of the special magic numbers for jittery-hospital is: 5437923.",
        "One of the special magic numbers for jittery-hospital is: 1234567."]
    assert a.meta["answer_prefix"] == ROWS[0]["answer_prefix"] and a.meta["length"] == 80
    assert a.meta["index"] == 0 and a.meta["source_row"] == 1 and a.answer_type == "Numeral"
    assert [b.span_text(s) for s in b.answer_spans] == ["5 437 923"]  # spacing differs from the gold
    assert c.meta["evidence"] == "none" and c.answer_spans == ()
    # variable tracking: question split at its own pattern; case-insensitive answers
    assert d.question.startswith("Question: Find all variables") and d.context.endswith("VAR QPE\n")
    assert [d.span_text(s) for s in d.answer_spans] == ["QPE", "SGF", "QPE"]
    (counts,) = res.summary
    assert (counts.rows, counts.with_spans, counts.evidence_none) == (4, 3, 1)


def test_split_input_patterns_and_fallbacks():
    qa = ("Answer the question based on the given documents. Only give me the answer and do not output any other "
          "words.\n\nThe following are given documents.\n\nDoc\n\nAnswer the question based on the given documents. "
          "Only give me the answer and do not output any other words.\n\nQuestion: who?")
    at = split_input(qa)
    assert qa[at:].startswith("Answer the question") and "Doc" in qa[:at]
    assert split_input("Some text.\nQuestion: what?") == len("Some text.\n")
    assert split_input("Some text here.\nWhich one is it?") == len("Some text here.\n")
    assert split_input("one single line with no question") is None


def test_answer_prefix_at_the_end_of_input_is_moved_out_of_the_question(tmp_path):
    prefix = " Answer: the words are"
    rows = [{"input": "Words: apple pear apple.\nQuestion: What are the 10 most common words in the above list?"
                      + prefix, "outputs": ["apple"], "answer_prefix": prefix}]
    (inst,) = import_tasks(str(write(tmp_path / "cwe.jsonl", rows))).instances
    assert inst.question == "Question: What are the 10 most common words in the above list?"
    assert inst.meta["answer_prefix"] == prefix


def test_malformed_ruler_rows_name_their_line(tmp_path):
    rows = [ROWS[0], {"input": "no question in one line", "outputs": ["x"]}]
    with pytest.raises(TaskFormatError, match=r"line 2, field 'input': cannot tell the question"):
        import_tasks(str(write(tmp_path / "r.jsonl", rows)))
    rows = [ROWS[0], ROWS[1], {"input": ROWS[0]["input"], "outputs": "  "}]
    with pytest.raises(TaskFormatError, match=r"line 3, field 'outputs': has no non-empty answer"):
        import_tasks(str(write(tmp_path / "r.jsonl", rows)))
    rows = [{**ROWS[0], "length": "long"}]
    with pytest.raises(TaskFormatError, match=r"line 1, field 'length': must be a whole number"):
        import_tasks(str(write(tmp_path / "r.jsonl", rows)))
    rows = [{**ROWS[0], "outputs": [{"a": 1}]}]
    with pytest.raises(TaskFormatError, match=r"answer 0 must be text or a number"):
        import_tasks(str(write(tmp_path / "r.jsonl", rows)))
