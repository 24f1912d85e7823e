"""Registered scorers: one file each. ``SCORERS`` maps the config/CLI name to the scorer class."""

from kvroute.presses.scorers import (  # noqa: F401  (registration side effects)
    cap,
    compactor,
    cur,
    expected_attention,
    expected_attention_stats,
    finch,
    keydiff,
    knorm,
    kvpress_random,
    kvzap,
    kvzip,
    lagkv,
    leverage,
    non_causal_attention,
    observed_attention,
    oracle,
    qfilter,
    random,
    snapkv,
    streaming_llm,
    tova,
)
from kvroute.presses.scorers.base import SCORERS, ScoreInputs, Scorer, build_scorer
from kvroute.presses.scorers.kvpress_adapter import KvpressScorer, register_kvpress

# import paths and installed plugins as the registry's fallback (plugins builds on the scorers above)
from kvroute.presses import plugins  # noqa: E402, F401  isort: skip

__all__ = ["SCORERS", "KvpressScorer", "ScoreInputs", "Scorer", "build_scorer", "register_kvpress"]
