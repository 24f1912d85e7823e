"""kvpress's evaluation layout: ``context``, ``question``, ``answer``, ``answer_prefix``, ``max_new_tokens``, ``task``.

This is the layout of the datasets kvpress's ``evaluation/evaluate.py`` runs (RULER, LooGLE,
InfiniteBench, Zero-SCROLLS, ... as prepared by kvpress): ``context`` already holds everything
before the question (instructions included), ``question`` is asked after it and ``answer_prefix``
is appended after the chat template's assistant header. ``answer`` is one string or a list;
``answer_prefix``, ``max_new_tokens`` and ``task`` may be missing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvroute.tasks.importers.base import LAYOUTS, Layout, SourceRow, Where, answer_list, optional_int, text


@LAYOUTS.add
class KvpressLayout(Layout):
    name = "kvpress"
    summary = "kvpress evaluation datasets: context, question, answer[, answer_prefix, max_new_tokens, task]"
    required = ("context", "question", "answer")
    optional = ("answer_prefix", "max_new_tokens", "task")

    def read(self, row: Mapping[str, Any], where: Where) -> SourceRow:
        task = text(row, "task", where, required=False) or None
        return SourceRow(where=where, context=text(row, "context", where), question=text(row, "question", where),
                         answers=answer_list(row, "answer", where), task=task,
                         answer_prefix=text(row, "answer_prefix", where, required=False),
                         max_new_tokens=optional_int(row, "max_new_tokens", where), extra=self.extras(row))
