"""The compression engine: one prefill, KeepMasks, batched masked decoding.

Names are imported lazily (``kvroute.engine.cell`` holds the light ``Cell``; the engine's modules
import transformers), so planning cells does not import the engine.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kvroute.engine.cell import NO_PRESS, Cell
    from kvroute.engine.decode import CellOutput, DecodeSettings, decode_cells
    from kvroute.engine.engine import Engine, EngineResult
    from kvroute.engine.prefill import PrefillResult, ScoreRequest, prefill

_EXPORTS = {
    "NO_PRESS": "cell", "Cell": "cell",
    "CellOutput": "decode", "DecodeSettings": "decode", "decode_cells": "decode",
    "Engine": "engine", "EngineResult": "engine",
    "PrefillResult": "prefill", "ScoreRequest": "prefill", "prefill": "prefill",
}

__all__ = ["NO_PRESS", "Cell", "CellOutput", "DecodeSettings", "Engine", "EngineResult", "PrefillResult",
           "ScoreRequest", "decode_cells", "prefill"]


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"kvroute.engine.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'kvroute.engine' has no attribute {name!r}")
