"""Find gold answers in real text: tolerant matching that maps back to exact character offsets.

Imported datasets give a context and gold answers but no spans. :func:`locate` finds every
occurrence of every answer in the context and returns exact ``[start, end)`` offsets into the
*original* string, plus an evidence span per occurrence (its enclosing sentence, never crossing a
line break). Matching is done on a normalised copy of the text:

- case-insensitive (``str.casefold`` after Unicode NFKC, so full-width digits and ligatures match);
- curly quotes, primes and guillemets become ``'`` or ``"``; Unicode dashes and minus become ``-``;
- every run of whitespace (spaces, tabs, newlines, non-breaking spaces) becomes one space;
- whole words only: a match that starts (ends) with a letter or digit must not be preceded
  (followed) by one, so the answer ``5`` is not found inside ``1995``.

:class:`NormalizedText` keeps, for every character of the normalised text, the index of the
original character it came from; a match ``[i, j)`` in normalised text is the original slice
``[index[i], index[j - 1] + 1)``.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from kvroute.text import Span

_QUOTES = {c: "'" for c in "\u2018\u2019\u201a\u201b\u2032\u2035\u02bc\u0060\u00b4"}
_QUOTES.update({c: '"' for c in "\u201c\u201d\u201e\u201f\u2033\u2036\u00ab\u00bb"})
_QUOTES.update({c: "-" for c in "\u2010\u2011\u2012\u2013\u2014\u2015\u2212"})

MAX_EVIDENCE_CHARS = 600
"""An enclosing sentence longer than this (a list, a table, text without punctuation) is cut to a
window of about this many characters around the answer, at word boundaries."""

# a sentence ends at . ! ? or … (possibly repeated), optionally followed by closing quotes/brackets,
# and then whitespace
_SENT_END = re.compile(r"[.!?\u2026]+[\"'\u201d\u2019)\]]*(?=\s)")


def _fold(c: str) -> str:
    c = _QUOTES.get(c, c)
    out = unicodedata.normalize("NFKC", c).casefold()
    return "".join(_QUOTES.get(x, x) for x in out)


@dataclass(frozen=True)
class NormalizedText:
    """``text`` normalised for matching, with ``index[k]`` = original offset of normalised char ``k``."""

    original: str
    text: str
    index: tuple[int, ...]

    @classmethod
    def of(cls, original: str) -> NormalizedText:
        out: list[str] = []
        index: list[int] = []
        space = False
        for i, c in enumerate(original):
            if c.isspace():
                if not space:
                    out.append(" ")
                    index.append(i)
                space = True
                continue
            space = False
            for x in _fold(c):
                if x.isspace():  # NFKC can turn some characters into spaces
                    continue
                out.append(x)
                index.append(i)
        return cls(original, "".join(out), tuple(index))

    def span(self, start: int, end: int) -> Span:
        """The original ``[start, end)`` of the normalised slice ``[start, end)`` (``end > start``)."""
        return self.index[start], self.index[end - 1] + 1


def match_key(text: str) -> str:
    """The normalised form two strings are compared in (also used to validate imported spans)."""
    return NormalizedText.of(text).text.strip()


def _is_word(c: str) -> bool:
    return c.isalnum()


def find_all(norm: NormalizedText, answer: str) -> list[Span]:
    """Every non-overlapping whole-word occurrence of ``answer`` in ``norm``, as original offsets."""
    key = match_key(answer)
    if not key:
        return []
    hay = norm.text
    left, right = _is_word(key[0]), _is_word(key[-1])
    out: list[Span] = []
    i = hay.find(key)
    while i != -1:
        j = i + len(key)
        ok = not (left and i > 0 and _is_word(hay[i - 1])) and not (right and j < len(hay) and _is_word(hay[j]))
        if ok:
            out.append(norm.span(i, j))
            i = hay.find(key, j)
        else:
            i = hay.find(key, i + 1)
    return out


def enclosing_sentence(text: str, start: int, end: int, *, max_chars: int = MAX_EVIDENCE_CHARS) -> Span:
    """The sentence of ``text`` around ``[start, end)``, within its line, whitespace-trimmed.

    A sentence ends at ``.``, ``!``, ``?`` or ``…`` followed by whitespace (closing quotes and brackets
    stay with it). Abbreviations ("Dr. Smith") can end a sentence early; the evidence then starts
    later than a human would say, never later than the answer.
    """
    line_start = text.rfind("\n", 0, start) + 1
    line_end = text.find("\n", end)
    line_end = len(text) if line_end == -1 else line_end
    s = line_start
    for m in _SENT_END.finditer(text, line_start, start):
        if m.end() <= start:
            s = m.end()
    after = _SENT_END.search(text, end, line_end)
    e = after.end() if after else line_end
    while s < start and text[s].isspace():
        s += 1
    while e > end and text[e - 1].isspace():
        e -= 1
    if e - s > max_chars:
        s, e = _window(text, s, e, start, end, max_chars)
    return s, e


def _window(text: str, s: int, e: int, start: int, end: int, max_chars: int) -> Span:
    """About ``max_chars`` characters of ``[s, e)`` centred on ``[start, end)``, cut at whitespace."""
    room = max(0, max_chars - (end - start))
    ws = max(s, start - room // 2)
    we = min(e, end + (room - (start - ws)))
    ws = max(s, min(ws, we - max_chars))
    if ws > s:  # move forward to the next word start, but not past the answer
        k = text.find(" ", ws, start)
        ws = k + 1 if k != -1 else ws
    if we < e:
        k = text.rfind(" ", end, we)
        we = k if k != -1 else we
    return ws, we


def merge(spans: Iterable[Span]) -> tuple[Span, ...]:
    """Sorted union of overlapping or touching spans."""
    out: list[list[int]] = []
    for s, e in sorted(spans):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return tuple((s, e) for s, e in out)


@dataclass(frozen=True)
class Located:
    """Where the answers of one instance occur: answer spans, evidence spans, per-answer counts."""

    answer_spans: tuple[Span, ...]
    evidence_spans: tuple[Span, ...]
    counts: tuple[int, ...]  # occurrences of each answer, in the order given

    @property
    def found(self) -> bool:
        return bool(self.answer_spans)


def locate(context: str, answers: Sequence[str], *, max_evidence_chars: int = MAX_EVIDENCE_CHARS) -> Located:
    """All occurrences of every answer in ``context`` and their enclosing sentences.

    Answer spans are sorted and unique (two answers may give overlapping spans, e.g. "Paris" and
    "Paris, France"); evidence spans are the merged enclosing sentences.
    """
    norm = NormalizedText.of(context)
    found: set[Span] = set()
    counts = []
    for a in answers:
        spans = find_all(norm, a)
        counts.append(len(spans))
        found.update(spans)
    answer_spans = tuple(sorted(found))
    evidence = merge(enclosing_sentence(context, s, e, max_chars=max_evidence_chars) for s, e in answer_spans)
    return Located(answer_spans, evidence, tuple(counts))
