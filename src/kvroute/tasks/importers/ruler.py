"""RULER's prepared-data layout: ``input``, ``outputs``, ``length`` (+ ``answer_prefix``, ``index``).

RULER (``scripts/data/prepare.py``) writes one JSONL file per task whose ``input`` is the whole
prompt — instructions, the haystack and the question — and ``outputs`` the gold answers. kvroute
splits ``input`` into context and question the way kvpress prepared its RULER dataset: the
question starts at the *last* match of the task's question pattern (below); without one, at the
last ``Question:``; without that, at the last non-empty line. ``context + question == input``
exactly, so nothing is lost or added. An ``answer_prefix`` that ``input`` ends with is cut from
the question (it is appended after the chat template instead, as kvpress does).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from kvroute.tasks.importers.base import LAYOUTS, Layout, SourceRow, Where, answer_list, optional_int, text

QUESTION_PATTERNS: dict[str, re.Pattern[str]] = {
    "niah": re.compile(r"What (?:is|are all) the special magic"),
    "vt": re.compile(r"Question: Find all variables that are assigned the value"),
    "cwe": re.compile(r"Question: What are the 10 most common words in the above list\?"),
    "fwe": re.compile(r"Question: Do not provide any explanation\."),
    "qa": re.compile(r"Answer the question based on the given documents\. Only give me the answer and do not "
                     r"output any other words\.\s*Question:"),
}
"""RULER's question openings per task kind (from RULER's templates, as kvpress splits them)."""
_GENERIC = re.compile(r"Question:")


def split_input(prompt: str) -> int | None:
    """Where the question starts in a RULER ``input``; ``None`` when it cannot be told."""
    starts = [m.start() for p in QUESTION_PATTERNS.values() for m in p.finditer(prompt)]
    if not starts:
        starts = [m.start() for m in _GENERIC.finditer(prompt)]
    if starts:
        return max(starts) if max(starts) > 0 else None
    body = prompt.rstrip()  # its last line is not blank
    cut = body.rfind("\n")
    return cut + 1 if cut > 0 and body[:cut].strip() else None


@LAYOUTS.add
class RulerLayout(Layout):
    name = "ruler"
    summary = "RULER prepared data: input (instructions + haystack + question), outputs, length"
    required = ("input", "outputs")
    optional = ("length", "answer_prefix", "task")

    def read(self, row: Mapping[str, Any], where: Where) -> SourceRow:
        prompt = text(row, "input", where)
        prefix = text(row, "answer_prefix", where, required=False)
        at = split_input(prompt)
        if at is None:
            raise where.error("cannot tell the question from the context (no RULER question pattern, no "
                              "'Question:', a single line); use the kvpress layout with separate context and "
                              "question columns", "input")
        context, question = prompt[:at], prompt[at:]
        if prefix and question.endswith(prefix):
            question = question[: -len(prefix)]
        if not question.strip():
            raise where.error("the question part of input is empty", "input")
        extra = self.extras(row)
        length = optional_int(row, "length", where)
        if length is not None:
            extra["length"] = length
        return SourceRow(where=where, context=context, question=question, answers=answer_list(row, "outputs", where),
                         task=text(row, "task", where, required=False) or None, answer_prefix=prefix, extra=extra)
