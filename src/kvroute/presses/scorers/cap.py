from kvroute.presses.params import Param
from kvroute.presses.scorers.kvpress_adapter import register_kvpress

# Recomputes the layer's queries (an averaged-RoPE query anchor) from its input; kvpress raises
# when the context is not longer than n_sink.
register_kvpress(
    "cap", "CapPress",
    "Capacity leverage of values weighted by key alignment with a historical-query anchor (CAPKV, kvpress).",
    min_tokens_param="n_sink",
    schema={"tau": Param(lo=0, why="a temperature; negative values would favour keys pointing away from the anchor"),
            "n_future_positions": Param(lo=1, why="the averaged RoPE spans at least one future position"),
            "n_sink": Param(lo=0, why="a count of sink tokens"),
            "epsilon": Param(lo=0, why="a non-negative stabiliser under a square root")},
)
