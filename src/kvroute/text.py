"""Text shared by tasks and metrics, torch-free: character spans and SQuAD's answer normalisation.

The lowest layer of the package: :mod:`kvroute.tasks` (instances, answer location) and
:mod:`kvroute.metrics` (exact match, F1, hallucination) both build on it, and it imports nothing
of kvroute's.
"""

from __future__ import annotations

import re
import string

Span = tuple[int, int]
"""Half-open character offsets ``(start, end)`` into a task's context (Unicode code points)."""

_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)
_PUNCT = set(string.punctuation) | {"“", "”", "‘", "’", "—", "–", "…"}


def normalize_answer(text: str) -> str:
    """Lower-case, drop punctuation and articles, collapse whitespace (SQuAD's normalisation)."""
    text = text.lower()
    text = "".join(ch if ch not in _PUNCT else " " for ch in text)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())
