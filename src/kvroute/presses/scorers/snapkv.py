from kvroute.presses.params import Param
from kvroute.presses.scorers.kvpress_adapter import register_kvpress

register_kvpress(
    "snapkv", "SnapKVPress",
    "Attention of the last window_size prompt tokens, pooled (SnapKV, kvpress).",
    min_tokens_param="window_size",
    schema={"window_size": Param(lo=1, why="the observation window holds at least one query"),
            "kernel_size": Param(lo=1, odd=True, why="the pooling keeps the length only for odd kernels")},
)
