"""One task instance: the unit every later stage (prompt, engine, metrics, store) works on.

The JSONL format (one instance per line, ``FORMAT_VERSION`` 1) has exactly these fields:

========================  =====================================================================
``id``                    content hash (16 hex digits) of the canonical content; computed when
                          missing, any unique non-empty string is accepted for user tasks
``family``                task family name (``base``, ..., or a user's own name)
``version``               generator version of that family (an int, bumped when output changes)
``seed``                  the generator seed (int) or ``null``
``context``               the text a press compresses
``question``              the question about it
``answers``               list of acceptable gold answers (``["I don't know"]`` when unanswerable)
``unanswerable``          bool: the context does not determine the answer
``answer_spans``          ``[[start, end], ...]`` character offsets into ``context`` of answer
                          occurrences; each slice's text is one of ``answers``
``evidence_spans``        ``[[start, end], ...]``: the supporting sentence(s)
``distractors``           other values present in the context that a wrong binding would produce
``answer_type``           Person | Thing | Organization | Creature | Location | Numeral | Date/Time | Event
``question_type``         Standard | Manipulated | Part
``meta``                  free-form object; kvroute writes ``format`` (the format version),
                          ``difficulty`` and the generator's knobs there
========================  =====================================================================

Spans are half-open ``[start, end)`` offsets into ``context`` counted in Unicode code points
(Python string indices).
"""

from __future__ import annotations

import hashlib
import json
import unicodedata
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kvroute.bounds import value_problem
from kvroute.errors import TaskFormatError
from kvroute.tasks.locate import match_key
from kvroute.text import Span, normalize_answer

FORMAT_VERSION = 1
ANSWER_TYPES: tuple[str, ...] = ("Person", "Thing", "Organization", "Creature", "Location", "Numeral",
                                 "Date/Time", "Event")
QUESTION_TYPES: tuple[str, ...] = ("Standard", "Manipulated", "Part")
IDK = "I don't know"
#: the longest instance id the loader accepts (ids name files and rows; content hashes have 16 characters)
MAX_ID_LENGTH = 512
FIELDS: tuple[str, ...] = ("id", "family", "version", "seed", "context", "question", "answers", "unanswerable",
                           "answer_spans", "evidence_spans", "distractors", "answer_type", "question_type", "meta")
_OPTIONAL = {"id": None, "seed": None, "meta": None, "distractors": (), "evidence_spans": ()}



def content_hash(*, family: str, context: str, question: str, answers: Sequence[str], unanswerable: bool,
                 answer_spans: Sequence[Span], evidence_spans: Sequence[Span], distractors: Sequence[str],
                 answer_type: str, question_type: str) -> str:
    """16 hex digits of SHA-256 over the canonical JSON of the content (not id, seed, version or meta)."""
    canon = json.dumps([family, context, question, list(answers), bool(unanswerable),
                        [list(s) for s in answer_spans], [list(s) for s in evidence_spans], list(distractors),
                        answer_type, question_type], ensure_ascii=False, separators=(",", ":"))
    # surrogatepass: valid text hashes as UTF-8; a lone surrogate is refused by validate(), not by the encoder here
    return hashlib.sha256(canon.encode("utf-8", "surrogatepass")).hexdigest()[:16]


@dataclass(frozen=True)
class TaskInstance:
    """A validated task instance; construct with :meth:`create` (computes ``id``) or :meth:`from_dict`."""

    id: str
    family: str
    version: int
    seed: int | None
    context: str
    question: str
    answers: tuple[str, ...]
    unanswerable: bool
    answer_spans: tuple[Span, ...]
    evidence_spans: tuple[Span, ...]
    distractors: tuple[str, ...]
    answer_type: str
    question_type: str
    meta: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # coerce JSON shapes (lists) to the frozen ones (tuples); ``meta`` always records the format
        coerce: dict[str, Any] = {"answers": _str_tuple(self.answers, "answers"),
                                  "distractors": _str_tuple(self.distractors, "distractors"),
                                  "answer_spans": _spans(self.answer_spans, "answer_spans"),
                                  "evidence_spans": _spans(self.evidence_spans, "evidence_spans")}
        if not isinstance(self.meta, Mapping):
            raise TaskFormatError("must be a JSON object", field="meta")
        coerce["meta"] = {"format": FORMAT_VERSION, **self.meta}
        for k, v in coerce.items():
            object.__setattr__(self, k, v)
        validate(self)

    @classmethod
    def create(cls, **fields: Any) -> TaskInstance:
        """Build an instance from field values, computing ``id`` from the content when it is missing."""
        return cls.from_dict(fields)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, path: str | None = None, line: int | None = None) -> TaskInstance:
        """Parse and validate one JSON object; errors name ``path``, ``line`` and the field."""

        def fail(msg: str, fld: str | None = None) -> TaskFormatError:
            return TaskFormatError(msg, path=path, line=line, field=fld)

        if not isinstance(data, Mapping):
            raise fail(f"expected a JSON object, got {type(data).__name__}")
        unknown = sorted(set(data) - set(FIELDS))
        if unknown:
            raise fail(f"unknown field(s) {', '.join(map(repr, unknown))}; the format has {', '.join(FIELDS)}",
                       unknown[0])
        missing = [f for f in FIELDS if f not in data and f not in _OPTIONAL]
        if missing:
            raise fail(f"missing required field (also missing: {', '.join(missing[1:]) or 'nothing else'})",
                       missing[0])
        d = {f: data.get(f, _OPTIONAL.get(f)) for f in FIELDS}
        d["meta"] = d["meta"] if d["meta"] is not None else {}
        try:
            if d["id"] is None:
                for name in ("answers", "distractors"):
                    d[name] = _str_tuple(d[name], name)
                for name in ("answer_spans", "evidence_spans"):
                    d[name] = _spans(d[name], name)
                d["id"] = content_hash(**{k: d[k] for k in _HASHED})
            return cls(**d)
        except TaskFormatError as e:
            raise fail(_bare(e), e.field) from None

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready dict in the canonical field order (spans as lists, meta keys sorted)."""
        meta = self.meta
        return {
            "id": self.id, "family": self.family, "version": self.version, "seed": self.seed,
            "context": self.context, "question": self.question, "answers": list(self.answers),
            "unanswerable": self.unanswerable, "answer_spans": [list(s) for s in self.answer_spans],
            "evidence_spans": [list(s) for s in self.evidence_spans], "distractors": list(self.distractors),
            "answer_type": self.answer_type, "question_type": self.question_type,
            "meta": {k: meta[k] for k in sorted(meta)},
        }

    def to_json(self) -> str:
        """One JSONL line (no trailing newline): fixed key order, ``ensure_ascii=False``, compact."""
        return json.dumps(self.to_dict(), ensure_ascii=False, separators=(",", ":"))

    def content_id(self) -> str:
        """The content hash of this instance (:func:`content_hash`): the id a generator would give it, whatever
        id a hand-written file gives it. Two instances with one id and different content ids hold different tasks."""
        d = self.to_dict()
        return content_hash(**{k: d[k] for k in _HASHED})

    @property
    def difficulty(self) -> int | None:
        d = self.meta.get("difficulty")
        return d if isinstance(d, int) else None

    def span_text(self, span: Span) -> str:
        return self.context[span[0]:span[1]]


_HASHED = ("family", "context", "question", "answers", "unanswerable", "answer_spans", "evidence_spans",
           "distractors", "answer_type", "question_type")


def _bare(e: TaskFormatError) -> str:
    """The message of ``e`` without its location prefix (re-raised with the caller's location)."""
    msg = str(e)
    prefix = f"field {e.field!r}: " if e.field is not None else ""
    return msg[len(prefix):] if prefix and msg.startswith(prefix) else msg


def _str_tuple(value: Any, name: str) -> tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, Sequence):
        raise TaskFormatError(f"must be a list of strings, got {type(value).__name__}", field=name)
    if not all(isinstance(v, str) for v in value):
        raise TaskFormatError("must be a list of strings", field=name)
    return tuple(value)


def _spans(value: Any, name: str) -> tuple[Span, ...]:
    if isinstance(value, str) or not isinstance(value, Sequence):
        raise TaskFormatError(f"must be a list of [start, end] pairs, got {type(value).__name__}", field=name)
    out = []
    for i, s in enumerate(value):
        if (isinstance(s, str) or not isinstance(s, Sequence) or len(s) != 2
                or not all(isinstance(x, int) and not isinstance(x, bool) for x in s)):
            raise TaskFormatError(f"item {i} must be a [start, end] pair of integers, got {s!r}", field=name)
        out.append((int(s[0]), int(s[1])))
    return tuple(out)


def _same_normalised(text: str, answers: Sequence[str]) -> bool:
    if match_key(text) in {match_key(a) for a in answers}:
        return True
    return normalize_answer(text) in {normalize_answer(a) for a in answers}


def validate(inst: TaskInstance) -> None:
    """Check every field of ``inst``; raise :class:`TaskFormatError` naming the first bad field."""
    _validate_identity(inst)
    _validate_content(inst)
    _validate_spans(inst)


def _fail(fld: str, msg: str) -> TaskFormatError:
    return TaskFormatError(msg, field=fld)


def _validate_identity(inst: TaskInstance) -> None:
    """id, family, version, seed."""
    if not isinstance(inst.id, str) or not inst.id:
        raise _fail("id", "must be a non-empty string")
    bad = next((c for c in inst.id if unicodedata.category(c) in ("Cc", "Cs", "Zl", "Zp")), None)
    if bad is not None:
        raise _fail("id", f"holds the control character {bad!r} (ids are names: no NUL, newline, tab or escape "
                         "characters); use printable text")
    if len(inst.id) > MAX_ID_LENGTH:
        raise _fail("id", f"is {len(inst.id)} characters long; ids may have at most {MAX_ID_LENGTH}")
    if not isinstance(inst.family, str) or not inst.family:
        raise _fail("family", "must be a non-empty string")
    if not isinstance(inst.version, int) or isinstance(inst.version, bool) or inst.version < 0:
        raise _fail("version", f"must be a non-negative integer, got {inst.version!r}")
    if inst.seed is not None and (not isinstance(inst.seed, int) or isinstance(inst.seed, bool)):
        raise _fail("seed", f"must be an integer or null, got {inst.seed!r}")


def _validate_content(inst: TaskInstance) -> None:
    """context, question, unanswerable, answers, answer and question types; every string UTF-8 text."""
    for name in ("context", "question"):
        if not isinstance(getattr(inst, name), str) or not getattr(inst, name).strip():
            raise _fail(name, "must be a non-empty string")
    for name in ("family", "context", "question", "answers", "distractors", "meta"):
        problem = value_problem(getattr(inst, name))  # a lone surrogate would fail every encoder downstream
        if problem:
            raise _fail(name, problem.removeprefix("holds a string that "))
    if not isinstance(inst.unanswerable, bool):
        raise _fail("unanswerable", f"must be true or false, got {inst.unanswerable!r}")
    if not inst.answers or not all(isinstance(a, str) and a.strip() for a in inst.answers):
        raise _fail("answers", "must be a non-empty list of non-empty strings")
    if inst.answer_type not in ANSWER_TYPES:
        raise _fail("answer_type", f"{inst.answer_type!r} is not one of {', '.join(ANSWER_TYPES)}")
    if inst.question_type not in QUESTION_TYPES:
        raise _fail("question_type", f"{inst.question_type!r} is not one of {', '.join(QUESTION_TYPES)}")


def _validate_spans(inst: TaskInstance) -> None:
    """answer and evidence spans, distractors, meta."""
    n = len(inst.context)
    for name in ("answer_spans", "evidence_spans"):
        for i, (s, e) in enumerate(getattr(inst, name)):
            if not 0 <= s < e <= n:
                raise _fail(name, f"span {i} [{s}, {e}] is out of range for a context of {n} characters "
                                 "(need 0 <= start < end <= len(context))")
    if inst.unanswerable and inst.answer_spans:
        raise _fail("answer_spans", "an unanswerable instance has no answer spans; use []")
    golds = set(inst.answers)
    for i, sp in enumerate(inst.answer_spans):
        text = inst.context[sp[0]:sp[1]]
        if text not in golds and not _same_normalised(text, inst.answers):
            raise _fail("answer_spans", f"span {i} [{sp[0]}, {sp[1]}] covers {text!r}, which is not one of the "
                                       f"answers {list(inst.answers)!r}")
    for i, d in enumerate(inst.distractors):
        if not d.strip() or d not in inst.context:
            raise _fail("distractors", f"item {i} {d!r} does not occur in the context")
    if not isinstance(inst.meta, Mapping):
        raise _fail("meta", "must be a JSON object")
    fmt = inst.meta.get("format", FORMAT_VERSION)
    if not isinstance(fmt, int) or fmt > FORMAT_VERSION:
        raise _fail("meta", f"format {fmt!r} is newer than this kvroute reads ({FORMAT_VERSION}); upgrade kvroute")
