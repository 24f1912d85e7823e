"""The settings of a run: everything that changes a record besides (model, instance, press, ratio, regime, seed).

Free of the engine, so that a config can be checked (``kvroute sweep --dry-run``) without importing
the engine and transformers; :mod:`kvroute.runner` runs instances with it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kvroute.config import DEFAULT_MAX_NEW_TOKENS, check_max_new_tokens
from kvroute.metrics import DEFAULT_METRICS, METRICS, MetricSettings

#: the attention backends' names, kept here so that a config is checked without importing the engine
#: (tests/unit/test_attention_backends.py checks it against kvroute.engine.attention.BACKENDS)
ATTENTION_BACKENDS = ("auto", "reference", "sdpa", "gathered", "chunked", "fused", "kept")
#: what a conversation's later turns hold of the earlier ones (RunSettings.history); None: no conversations
HISTORIES = (None, "own", "gold")


def attention_backend_problem(name: object) -> str | None:
    """What is wrong with ``name`` as an attention backend setting (the closest names), None if nothing."""
    if isinstance(name, str) and name in ATTENTION_BACKENDS:
        return None
    from kvroute.errors import suggest

    close = suggest(name, ATTENTION_BACKENDS) if isinstance(name, str) else []
    hint = f"did you mean {' or '.join(repr(c) for c in close)}? " if close else ""
    return f"not an attention backend; {hint}(one of {', '.join(ATTENTION_BACKENDS)})"


def check_attention_backend(name: str) -> str:
    """``name`` if it is an attention backend's name or "auto", else a ConfigError naming the closest ones."""
    problem = attention_backend_problem(name)
    if problem is not None:
        from kvroute.errors import ConfigError

        raise ConfigError(f"attention_backend {name!r}: {problem}")
    return name


if TYPE_CHECKING:
    from kvroute.engine.decode import DecodeSettings


@dataclass(frozen=True)
class RunSettings:
    """Everything that changes a record besides (model, instance, press, ratio, regime, seed)."""

    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    batch_size: int | None = None  # cells per decoding batch; None ("auto"): as many as the free memory takes
    metrics: tuple[str, ...] = DEFAULT_METRICS
    metric: MetricSettings = field(default_factory=MetricSettings)
    system_prompt: str | None = None
    answer_prefix: str = ""
    # bytes the masked attention's transient tensors may take per forward (None: a quarter of the free memory);
    # past it the context is attended in chunks (kvroute.engine.attention.streaming), equal to float32 rounding
    attention_memory: int | None = None
    # verify the full cache's answer as a draft for every cell in one forward before decoding step by step
    # (kvroute.engine.decode); the tokens are greedy decoding's either way. Off by default: see
    # docs/performance.md, "Draft verification"
    draft: bool = False
    # forwards with several queries per cell (the question, a draft) attend each cell's kept context entries only,
    # gathered (kvroute.engine.attention.gather), equal to float32 rounding; False: all T entries, masked
    gather: bool = True
    # which form computes the masked attention (kvroute.engine.attention.backend): "auto" (the documented rule,
    # docs/performance.md) or one backend's name; equal to float32 rounding either way
    attention_backend: str = "auto"
    # several questions over one context (kvroute.tasks.conversation): None asks every instance alone; "own"
    # asks a conversation's questions in turn after one compression, each cell's own earlier answers kept in the
    # cache uncompressed, as a chat server would; "gold" keeps the gold answers there instead (the same history
    # for every cell, so each turn measures the context's loss alone)
    history: str | None = None

    def __post_init__(self) -> None:
        check_max_new_tokens(self.max_new_tokens)
        check_attention_backend(self.attention_backend)
        if self.history not in HISTORIES:
            from kvroute.errors import ConfigError, suggest

            close = suggest(str(self.history), [h for h in HISTORIES if h]) if isinstance(self.history, str) else []
            hint = f"did you mean {' or '.join(repr(c) for c in close)}? " if close else ""
            raise ConfigError(f"history {self.history!r}: {hint}use \"own\" (each cell's own answers), \"gold\" or "
                              "leave it unset (every question asked alone)")
        for m in self.metrics:
            METRICS.get(m)  # unknown names fail with suggestions

    @property
    def needs(self) -> frozenset[str]:
        out: set[str] = set()
        for m in self.metrics:
            out |= METRICS.get(m).needs
        return frozenset(out)

    def decode_settings(self) -> DecodeSettings:
        from kvroute.engine.decode import DecodeSettings  # (the engine imports transformers: only when decoding)

        return DecodeSettings(max_new_tokens=self.max_new_tokens, batch_size=self.batch_size,
                              capture=bool(self.needs & {"attention", "hidden", "argmax"}),
                              argmax="argmax" in self.needs,
                              attention_memory=self.attention_memory, draft=self.draft, gather=self.gather,
                              attention_backend=self.attention_backend)
