"""One source row → one :class:`TaskInstance`, with answers located in the context.

Imported instances use the ``raw`` prompt style (context and question passed to the model as the
dataset has them, ``meta["answer_prefix"]`` appended after the chat template — kvpress's exact
prompt). Their ``meta`` records:

==========================  ======================================================================
``prompt_style``            ``"raw"``
``answer_prefix``           the source's answer prefix (``""`` when it has none)
``max_new_tokens``          the source's answer budget, when it has one
``evidence``                ``"located"`` (answer spans found) or ``"none"`` (no answer occurs in
                            the context: kept, with empty spans; its GER is undefined)
``answer_occurrences``      occurrences found per gold answer, in order
``source`` / ``layout``     the file or hub id, and the layout it was read with
``source_row``              1-based record number in the source
others                      the source's other scalar columns (``length``, ``index``, ``depth``…);
                            a name kvroute uses itself gets a ``source_`` prefix
==========================  ======================================================================

``answer_type`` is inferred simply: every answer a number (digits with ``,`` ``.`` or spaces) →
``Numeral``; every answer a date or time (``2021-03-04``, ``4 March 2021``, ``March 2021``,
``3/4/21``, ``14:30``) → ``Date/Time``; otherwise ``Thing``. ``question_type`` is ``Standard``
(direct retrieval). Imported rows are never unanswerable: their gold answers are the dataset's.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from kvroute.tasks.importers.base import SourceRow
from kvroute.tasks.instance import TaskInstance
from kvroute.tasks.locate import MAX_EVIDENCE_CHARS, locate

IMPORT_VERSION = 1
"""Version of the import conversion (the instance ``version``); bump when its output changes."""

RESERVED_META = frozenset({"format", "prompt_style", "answer_prefix", "max_new_tokens", "evidence",
                           "answer_occurrences", "source", "layout", "source_row", "truncated", "context_tokens",
                           "tokens_counted_with", "difficulty"})

_MONTH = (r"(?:jan(?:uary)?|feb(?:ruary)?|mar(?:ch)?|apr(?:il)?|may|june?|july?|aug(?:ust)?|sep(?:t(?:ember)?)?"
          r"|oct(?:ober)?|nov(?:ember)?|dec(?:ember)?)\.?")
_NUMERAL = re.compile(r"[+-]?\d+(?:[ ,.]\d+)*%?")
_DATE = re.compile("|".join([
    r"\d{4}-\d{1,2}-\d{1,2}",
    r"\d{1,2}/\d{1,2}/\d{2,4}",
    rf"\d{{1,2}}(?:st|nd|rd|th)? {_MONTH},? \d{{3,4}}",
    rf"{_MONTH} \d{{1,2}}(?:st|nd|rd|th)?,? \d{{3,4}}",
    rf"{_MONTH},? \d{{3,4}}",
    r"\d{1,2}:\d{2}(?::\d{2})?(?: ?[ap]\.?m\.?)?",
]), re.IGNORECASE)


def infer_answer_type(answers: Sequence[str]) -> str:
    """``Numeral``, ``Date/Time`` or ``Thing`` (see the module docstring)."""
    clean = [a.strip() for a in answers]
    if all(_NUMERAL.fullmatch(a) for a in clean):
        return "Numeral"
    if all(_DATE.fullmatch(a) for a in clean):
        return "Date/Time"
    return "Thing"


def to_instance(row: SourceRow, *, family: str, source: str, layout: str, context: str | None = None,
                extra_meta: dict[str, Any] | None = None,
                max_evidence_chars: int = MAX_EVIDENCE_CHARS) -> TaskInstance:
    """The instance of ``row`` (``context`` replaces the row's, e.g. after truncation)."""
    ctx = row.context if context is None else context
    found = locate(ctx, row.answers, max_evidence_chars=max_evidence_chars)
    meta: dict[str, Any] = {(f"source_{k}" if k in RESERVED_META else k): v for k, v in row.extra.items()}
    meta.update(prompt_style="raw", answer_prefix=row.answer_prefix, evidence="located" if found.found else "none",
                answer_occurrences=list(found.counts), source=source, layout=layout, source_row=row.where.row)
    if row.max_new_tokens is not None:
        meta["max_new_tokens"] = row.max_new_tokens
    meta.update(extra_meta or {})
    return TaskInstance.create(
        family=family, version=IMPORT_VERSION, seed=None, context=ctx, question=row.question,
        answers=list(row.answers), unanswerable=False, answer_spans=found.answer_spans,
        evidence_spans=found.evidence_spans, distractors=[], answer_type=infer_answer_type(row.answers),
        question_type="Standard", meta=meta)
