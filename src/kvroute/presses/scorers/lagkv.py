from kvroute.presses.params import Param
from kvroute.presses.scorers.kvpress_adapter import register_kvpress

# Scores each lag_size partition against the next one's min–max range (keys and values); contexts
# shorter than n_sink + 2·lag_size get kvpress's fallback (sinks, then a recency ramp).
register_kvpress(
    "lagkv", "LagKVPress",
    "Lag-relative spread of keys and values against the next partition's range; "
    "sinks and the tail kept (LagKV, kvpress).",
    schema={"n_sink": Param(lo=0, why="a count of sink tokens"),
            "lag_size": Param(lo=2, why="a partition's min-max range needs two tokens, one gives 0/0")},
)
