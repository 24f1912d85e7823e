"""Abstention: does an answer decline to answer ("I don't know" and its variants)?

Used to score unanswerable items (gold "I don't know": an abstention is correct) and by the
hallucination taxonomy (``abstained``). Matching is on whole words of the lower-cased answer with
curly apostrophes straightened, so "I don’t know." and "The text does not say." both count, while
"Unknowlton" does not.
"""

from __future__ import annotations

import re

ABSTENTION_PHRASES: tuple[str, ...] = (
    "i don't know", "i do not know", "i dont know", "don't know", "do not know", "no idea", "not sure",
    "unknown", "not known",
    "not mentioned", "isn't mentioned", "is not mentioned", "never mentioned", "not stated", "not specified",
    "not provided", "not given", "not indicated", "not included", "no mention",
    "does not say", "doesn't say", "not say", "does not state", "doesn't state", "does not mention",
    "doesn't mention", "does not specify", "doesn't specify", "does not provide", "doesn't provide",
    "does not tell", "doesn't tell", "not tell",
    "cannot be determined", "can't be determined", "cannot determine", "can't determine", "not possible to determine",
    "impossible to determine", "cannot be answered", "can't be answered", "cannot answer", "can't answer",
    "unable to answer", "unable to determine",
    "no information", "not enough information", "insufficient information", "no answer", "unanswerable",
    "ambiguous", "unclear", "not clear",
)
_EXACT: tuple[str, ...] = ("none", "n/a", "na", "nobody", "no one", "nothing")
_PATTERN = re.compile(r"(?<![\w'])(?:" + "|".join(re.escape(p) for p in ABSTENTION_PHRASES) + r")(?![\w'])")


def _clean(text: str) -> str:
    text = text.lower().replace("\u2019", "'").replace("\u2018", "'").replace("`", "'")
    return " ".join(text.split())


def is_abstention(text: str) -> bool:
    """Whether ``text`` declines to answer (see :data:`ABSTENTION_PHRASES`)."""
    t = _clean(text)
    if t.strip(" .!") in _EXACT:
        return True
    return bool(_PATTERN.search(t))
