"""kvroute's error hierarchy.

Every error a user can cause is a :class:`KvrouteError` whose message says what went wrong *and*
what to do about it. The CLI prints these messages without a traceback; anything else is a bug.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class KvrouteError(Exception):
    """Base class of every error kvroute raises on purpose."""


class ConfigError(KvrouteError, ValueError):
    """A configuration value is missing, malformed or out of range."""


def did_you_mean(close: Iterable[str]) -> str:
    """``did you mean 'a' or 'b'?`` for the closest names (see :func:`suggest`)."""
    return f"did you mean {' or '.join(repr(c) for c in close)}?"


class UnknownNameError(KvrouteError, KeyError):
    """A name (model, press, scorer, task family, metric, ...) is not registered."""

    def __init__(self, kind: str, name: str, choices: Iterable[str], hint: str = "", plural: str | None = None) -> None:
        self.kind = kind
        self.name = name
        self.choices = sorted(choices)
        close = suggest(name, self.choices)
        msg = f"unknown {kind} {name!r}"
        if close:
            msg += f"; {did_you_mean(close)}"
        elif self.choices or hint:
            msg += "."
        if self.choices:
            msg += f" Known {plural or plural_of(kind)}: {', '.join(self.choices)}."
        if hint:
            msg += f" {hint}"
        super().__init__(msg)

    def __str__(self) -> str:  # KeyError would quote the message otherwise
        return str(self.args[0])


def with_article(noun: str) -> str:
    """``noun`` after its indefinite article by its first letter: an int, a list, an Exception, a str."""
    return f"{'an' if noun[:1].lower() in 'aeiou' else 'a'} {noun}"


def plural_of(noun: str) -> str:
    """English plural of a (possibly multi-word) noun: family → families, strategy → strategies, box → boxes."""
    head, _, last = noun.rpartition(" ")
    if len(last) > 1 and last.endswith("y") and last[-2].lower() not in "aeiou":
        last = last[:-1] + "ies"
    elif last.endswith(("s", "x", "z", "ch", "sh")):
        last += "es"
    else:
        last += "s"
    return f"{head} {last}" if head else last


class Interrupted(KvrouteError):
    """The user interrupted a command (Ctrl-C); the message says what was kept and how to go on."""


class ModelLoadError(KvrouteError):
    """A model could not be loaded from the given source."""


class DownloadError(KvrouteError):
    """Fetching an embedded model's files failed."""


class NetworkError(DownloadError):
    """The package index (or the model hub) cannot be reached."""


class IntegrityError(DownloadError):
    """A downloaded or cached file does not match its pinned SHA-256 digest."""


class TaskFormatError(KvrouteError, ValueError):
    """A task file or task instance is malformed; the message names the line and field."""

    def __init__(self, message: str, *, path: str | None = None, line: int | None = None,
                 field: str | None = None) -> None:
        self.path, self.line, self.field = path, line, field
        where = []
        if path is not None:
            where.append(str(path))
        if line is not None:
            where.append(f"line {line}")
        if field is not None:
            where.append(f"field {field!r}")
        prefix = ", ".join(where)
        super().__init__(f"{prefix}: {message}" if prefix else message)


class EngineError(KvrouteError):
    """The compression engine was asked for something it cannot do."""


class PressPluginError(EngineError):
    """A press kvroute did not write (import path, entry point) raised, edited its inputs or returned unusable
    scores (kvroute.presses.fence), or kvpress's own score() raised on a model it does not handle
    (kvroute.presses.scorers.guard); the message names the press and the call. A per-cell error."""


class PromptTooLongError(EngineError):
    """A prompt does not fit in the model's context window."""


class InsufficientMemoryError(EngineError):
    """An instance would not fit the free memory even one cell at a time (kvroute.engine.plan); says how much
    it needs."""


class AnalysisError(KvrouteError, ValueError):
    """Records cannot be analysed as asked (missing columns, too little data, bad parameters)."""


class StoreError(KvrouteError):
    """A run store cannot be opened, read or written."""


class StoreLockedError(StoreError):
    """Another sweep is writing to the same run directory."""


class SweepError(KvrouteError):
    """A sweep could not finish a work unit; the message names the model, instance and cause."""


#: the errors one cell of a run may fail with while the other cells and instances go on: kvroute's own
#: (a press's precondition, a prompt that does not fit, a task it cannot align) and ValueError (what
#: scorers and metrics raise on inputs they cannot handle). Anything else — RuntimeError (out of
#: memory, a shape bug), KeyboardInterrupt, SystemExit — is not a cell's fault and stops the run, except
#: from a press kvroute did not write, or kvpress's score(): whatever that raises is a PressPluginError
#: (kvroute.presses.scorers.guard).
CELL_ERRORS: tuple[type[BaseException], ...] = (KvrouteError, ValueError)


def error_reason(e: BaseException, limit: int = 500) -> str:
    """One line for a record's ``error`` field: ``"ExceptionType: message"`` (whitespace collapsed, cut at
    ``limit``)."""
    text = " ".join(f"{type(e).__name__}: {e}".split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def suggest(name: str, choices: Iterable[str], n: int = 3) -> list[str]:
    """The registered names closest to ``name`` (case-insensitive), best first."""
    choices = list(choices)
    lowered = {c.lower(): c for c in choices}
    key = name.lower()
    close = difflib.get_close_matches(key, list(lowered), n=n, cutoff=0.5)
    # prefixes and substrings count too: "smollm2" should find "smollm2-135m"
    extra = [c for k, c in lowered.items() if (key and (k.startswith(key) or key in k)) and c not in close]
    out = [lowered[c] for c in close] + extra
    seen: list[str] = []
    for c in out:
        if c not in seen:
            seen.append(c)
    return seen[:n]
