from kvpress import SnapKVPress

from kvroute.presses.scorers.kvpress_adapter import register_kvpress

register_kvpress(
    "snapkv", SnapKVPress,
    "Attention of the last window_size prompt tokens, pooled (SnapKV, kvpress).",
    min_tokens_param="window_size",
)
