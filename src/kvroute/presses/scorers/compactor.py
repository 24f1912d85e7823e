from kvroute.presses.params import Param
from kvroute.presses.scorers.kvpress_adapter import register_kvpress

# blending defaults to the compression ratio, so by default the scores depend on the ratio: scored
# once per ratio (with blending given they do not, and one score serves every ratio). Its leverage
# part draws a Gaussian sketch: seeded per (seed, layer), see kvpress_adapter. The middle (between
# the protected sinks and the recent tokens) needs two tokens for its z-scores.
register_kvpress(
    "compactor", "CompactorPress",
    "blending·leverage + non-causal chunked attention, first and last tokens kept; blending = the ratio unless "
    "given; sketch seeded per (seed, layer) (Compactor, kvpress).",
    ratio_dependent_if=lambda p: p["blending"] is None, random_draws=True,
    min_tokens_param=("sink_size_start", "sink_size_end"), min_tokens_extra=1,
    schema={"sink_size_start": Param(lo=0, why="a count of protected first tokens"),
            "sink_size_end": Param(lo=0, why="a count of protected last tokens"),
            "chunk_size": Param(lo=1, why="tokens per attention tile"),
            "sketch_dimension": Param(lo=1, why="the sketch has at least one column"),
            "blending": Param(lo=0, kind=float, why="the weight of the leverage scores; none = the ratio")},
)
