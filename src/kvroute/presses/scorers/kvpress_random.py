from kvroute.presses.params import Param
from kvroute.presses.scorers.kvpress_adapter import register_kvpress

# kvpress's own random baseline, next to kvroute's `random`: with seed given, kvpress re-seeds its
# generator identically on every layer (all layers keep the same positions); without one it draws
# from torch's generator, which kvroute seeds per (seed, layer), see kvpress_adapter.
register_kvpress(
    "kvpress_random", "RandomPress",
    "kvpress's RandomPress: uniform scores; with seed given every layer draws the same (kvpress).",
    random_draws=True,
    schema={"seed": Param(lo=0, kind=int, why="a generator seed; none = torch's generator, seeded per layer")},
)
