from kvroute.presses.params import Param
from kvroute.presses.scorers.kvpress_adapter import register_kvpress

# kvpress's StreamingLLM reads compression_ratio inside score(): scored once per ratio.
register_kvpress(
    "streaming_llm", "StreamingLLMPress",
    "Keep the first n_sink tokens and the most recent ones (StreamingLLM, kvpress).",
    ratio_dependent=True, min_tokens_param="n_sink",
    schema={"n_sink": Param(lo=0, why="a count of sink tokens")},
)
