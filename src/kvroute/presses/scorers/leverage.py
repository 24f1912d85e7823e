from kvroute.presses.params import Param
from kvroute.presses.scorers.kvpress_adapter import register_kvpress

# Draws a Gaussian sketch from torch's generator on every layer: seeded per (seed, layer), see
# kvpress_adapter. Needs two tokens (its z-score divides by the scores' standard deviation).
register_kvpress(
    "leverage", "LeverageScorePress",
    "Approximate statistical leverage of the pre-RoPE keys, z-scored; its Gaussian sketch seeded per (seed, layer) "
    "(Compactor's leverage, kvpress).",
    random_draws=True, min_tokens_extra=1,
    schema={"sketch_dimension": Param(lo=1, why="the sketch has at least one column")},
)
