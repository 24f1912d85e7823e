"""Bounds at the door: what every value read from a user's file or command line must satisfy.

Checked where a value enters (a task file, a config, a records file, an option), so nothing past
the door meets a value it cannot handle: no recursion error on JSON nested a hundred thousand deep,
no encoder error on a lone surrogate (``"\\ud800"`` is valid JSON but no UTF-8 text), no SQLite
overflow on a seed of 23 digits. Each check returns a problem as a phrase (None when fine) or raises
:class:`~kvroute.errors.KvrouteError`; the caller names the file, line and field.
"""

from __future__ import annotations

import json
import unicodedata
from typing import Any

from kvroute.errors import ConfigError

#: the deepest nesting of lists and objects accepted in any JSON value read (task meta, configs, records)
MAX_DEPTH = 64
#: the largest seed anywhere (a run's, a generator's, the report's bootstrap): a 32-bit unsigned integer,
#: what every random generator kvroute feeds (Python, NumPy, torch) takes and SQLite stores
MAX_SEED = 2**32 - 1


def check_seed(value: object, name: str = "seed") -> int:
    """``value`` as a seed (an int in 0 … :data:`MAX_SEED`); otherwise ConfigError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_SEED:
        raise ConfigError(f"{name} must be an integer from 0 to {MAX_SEED}; got {value!r}")
    return value


def text_problem(text: str) -> str | None:
    """Why ``text`` cannot be kvroute text (a lone surrogate: no UTF-8 encoding exists), else None."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        bad = text[e.start]
        if unicodedata.category(bad) == "Cs":
            return (f"has a lone surrogate {bad!r} at character {e.start} (an escape such as \\ud800 that is not "
                    "half of a pair; no UTF-8 text can hold it); remove it or write the character it was meant to be")
        return f"cannot be encoded as UTF-8 at character {e.start}"
    return None


def value_problem(value: Any, max_depth: int = MAX_DEPTH) -> str | None:
    """Why a decoded JSON value cannot be accepted (nested deeper than ``max_depth``, a string or key with a lone
    surrogate), else None. Iterative, so a deep value cannot exhaust the stack here."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        v, depth = stack.pop()
        if isinstance(v, str):
            problem = text_problem(v)
            if problem:
                return f"holds a string that {problem}"
        elif isinstance(v, dict | list | tuple):
            if depth >= max_depth:
                return f"is nested more than {max_depth} levels deep"
            items = v.items() if isinstance(v, dict) else enumerate(v)
            for k, x in items:
                if isinstance(k, str) and text_problem(k):
                    return f"holds a key that {text_problem(k)}"
                stack.append((x, depth + 1))
    return None


def loads_json(text: str) -> Any:
    """``json.loads`` with the bounds above: raises :class:`ValueError` (a :class:`json.JSONDecodeError` for bad
    syntax) with a one-line reason when the text is nested too deep or holds a lone surrogate."""
    try:
        value = json.loads(text)
    except RecursionError:
        raise ValueError(f"is nested more than {MAX_DEPTH} levels deep") from None
    problem = value_problem(value)
    if problem:
        raise ValueError(problem)
    return value
