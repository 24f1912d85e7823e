from kvroute.presses.params import Param
from kvroute.presses.scorers.kvpress_adapter import register_kvpress

register_kvpress(
    "expected_attention", "ExpectedAttentionPress",
    "Expected attention of future queries (mean/covariance of queries, averaged RoPE), times ||V|| (kvpress).",
    min_tokens_param="n_sink",
    schema={"n_sink": Param(lo=0, why="a count of sink tokens"),
            "n_future_positions": Param(lo=1, why="the expectation averages over at least one future position"),
            "epsilon": Param(lo=0, why="a non-negative offset added to the scores")},
)
