from kvroute.presses.params import Param
from kvroute.presses.scorers.kvpress_adapter import register_kvpress

# use_random_leverage=true projects keys and values with a Gaussian matrix drawn from torch's
# generator: seeded per (seed, layer), see kvpress_adapter.
register_kvpress(
    "cur", "CURPress",
    "CUR leverage of keys and values (squared norms, locally normalised), first num_sinks kept; "
    "use_random_leverage seeded per (seed, layer) (CurDKV, kvpress).",
    random_draws=True,
    schema={"num_sinks": Param(lo=0, why="a count of sink tokens"),
            "local_window_size": Param(lo=1, why="tokens per local normalisation window"),
            "leverage_type": Param(choices=("key", "value", "kv_avg", "kv_product"), why="CURPress's combinations")},
)
