from kvroute.presses.params import Param
from kvroute.presses.scorers.kvpress_adapter import register_kvpress

# Recomputes the layer's queries from its input (no N×N map is kept): non-causal attention inside
# chunk_size tiles, summed over queries, times ||V||, pooled, z-scored over the layer.
register_kvpress(
    "non_causal_attention", "NonCausalAttnPress",
    "Non-causal attention within chunks, summed over queries, times ||V|| (Compactor's attention part, kvpress).",
    min_tokens_extra=1,
    schema={"chunk_size": Param(lo=1, why="tokens per attention tile")},
)
