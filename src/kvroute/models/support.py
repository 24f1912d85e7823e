"""Which architectures kvroute studies, and how each agrees with kvpress: the rows of ``kvroute models architectures``.

The rows are generated, never written by hand: ``python benchmarks/support_table.py`` reads the equivalence
benchmark's report of each tiny architecture (``benchmarks/results/equivalence_tiny-ARCH.md``) and writes them to
``architectures.json`` beside this module, and the same rows to docs/models.md (a test fails where either is stale).
"""

from __future__ import annotations

import functools
import json
from importlib import resources
from typing import Any


@functools.cache
def architecture_support() -> tuple[dict[str, Any], ...]:
    """One row per architecture of :data:`kvroute.models.tiny.TINY_ARCHITECTURES`: ``architecture``, ``stands_for``,
    ``traits``, ``head_dims``, ``studied``, ``agreement`` (cells equal to kvpress's pipeline, ``X/Y``; None where not
    run), ``presses_that_differ`` (press -> ``X/Y``), ``differences``, ``not_compared``, ``refusal`` (the load-time
    line of an architecture kvroute cannot study yet) and ``report``."""
    text = resources.files("kvroute.models").joinpath("architectures.json").read_text(encoding="utf-8")
    return tuple(json.loads(text))
