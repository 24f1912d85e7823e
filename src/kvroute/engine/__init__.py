"""The compression engine: one prefill, KeepMasks, batched masked decoding."""

from kvroute.engine.decode import CellOutput, DecodeSettings, decode_cells
from kvroute.engine.engine import NO_PRESS, Cell, Engine, EngineResult
from kvroute.engine.prefill import PrefillResult, ScoreRequest, prefill

__all__ = ["NO_PRESS", "Cell", "CellOutput", "DecodeSettings", "Engine", "EngineResult", "PrefillResult",
           "ScoreRequest", "decode_cells", "prefill"]
