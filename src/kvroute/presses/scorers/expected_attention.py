from kvpress import ExpectedAttentionPress

from kvroute.presses.scorers.kvpress_adapter import register_kvpress

register_kvpress(
    "expected_attention", ExpectedAttentionPress,
    "Expected attention of future queries (mean/covariance of queries, averaged RoPE), times ||V|| (kvpress).",
    min_tokens_param="n_sink",
)
