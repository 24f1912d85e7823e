"""The settings of a run: everything that changes a record besides (model, instance, press, ratio, regime, seed).

Free of the engine, so that a config can be checked (``kvroute sweep --dry-run``) without importing
the engine and transformers; :mod:`kvroute.runner` runs instances with it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kvroute.config import DEFAULT_MAX_NEW_TOKENS, check_max_new_tokens
from kvroute.metrics import DEFAULT_METRICS, METRICS, MetricSettings

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
    # past it the context is attended in chunks (kvroute.engine.streaming), equal to float32 rounding
    attention_memory: int | None = None
    # verify the full cache's answer as a draft for every cell in one forward before decoding step by step
    # (kvroute.engine.decode); the tokens are greedy decoding's either way. Off by default: see
    # docs/performance.md, "Draft verification"
    draft: bool = False
    # forwards with several queries per cell (the question, a draft) attend each cell's kept context entries only,
    # gathered (kvroute.engine.gather), equal to float32 rounding; False: all T entries, masked
    gather: bool = True

    def __post_init__(self) -> None:
        check_max_new_tokens(self.max_new_tokens)
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
                              attention_memory=self.attention_memory, draft=self.draft, gather=self.gather)
