"""KVzip (kvpress KVzipPress): importance from reconstructing the context, scored after the prefill.

After the context is prefilled, the model is asked to repeat it ("Repeat the previous context
exactly.", chunk by chunk for long contexts) on top of the cache; an entry's score is the largest
attention any replay token gives it (over the query heads of its group), and the first ``n_sink``
entries are kept. This costs one extra forward over the whole context (plus its chunks' prompts)
beyond kvroute's one prefill. kvpress's own code runs here (``KVzipPress.prepare`` and its attention
hook) on a copy of the cache's layer list; the shared context K/V are never changed. Only the hook's
scoring is made differently: kvpress computes a pass's whole attention map at once ([Hkv, G, q, n] per
layer, 455 MB at 2,000 tokens for Qwen2.5-0.5B, and two more of its size alive), kvroute the same
entries a block of query rows at a time (:data:`BLOCK_BYTES`), each score equal to kvpress's bit for
bit (tests/unit/test_kvzip_blocks.py).

KVzip selects across layers and heads at once; its default selection is therefore ``global``
(``kvzip`` = ``kvzip+global``; ``global[per_layer=true]`` is KVzip's ``layerwise``). Any other
selection works on its scores too.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator
from typing import Any, ClassVar

import torch
from torch import nn

from kvroute import heap
from kvroute.errors import EngineError
from kvroute.presses.params import Param
from kvroute.presses.scorers.base import SCORERS, ModelScoreInputs, ScoreInputs
from kvroute.presses.scorers.kvpress_adapter import KvpressClass, KvpressScorer

# kvpress's replay prompts (KVzipPress.prepare) and the tail of the previous chunk a later prompt quotes
_FIRST, _LATER, _QUOTED = "\n\nRepeat the previous context exactly.", \
    "\n\nRepeat the part of the previous context exactly, starting with", 8


#: bytes of one block of a replay pass's attention map that kvpress's scoring would hold whole ([Hkv, G, q, n]
#: float32 per layer, and two more of its size: at 2,000 context tokens Qwen2.5-0.5B's was 455 MB); on a CPU at
#: float32 the map is computed this many bytes of query rows at a time instead, every entry as kvpress computes it
#: (None: kvpress's own ``score_kvzip``, the whole map at once, as on other devices and dtypes)
BLOCK_BYTES: int | None = 32 * 2**20
#: the fewest query rows in a block: CPU BLAS multiplies one to three rows by another path than many, whose sums can
#: differ in the last bit (with MIN_ROWS = 1, tests/unit/test_kvzip_blocks.py fails); on the AMD EPYC machine here
#: blocks of 4 rows and more of Qwen2.5-0.5B's shapes and of an 8-head, 128-dim model's matched the whole product bit
#: for bit, so 16 leaves a margin
MIN_ROWS = 16


def replay_passes(press: Any, model: nn.Module, tokenizer: Any) -> Iterator[tuple[torch.Tensor, int, int]]:
    """Each replay pass of kvpress's ``KVzipPress.prepare`` over the context it holds: ``(replay ids, chunk start,
    chunk end)``, the chunk being the context positions the pass scores (what ``press.start_idx``/``end_idx`` are set
    to for its forward)."""
    start = press.prefix_length
    for prefill_ids, repeat_ids in press.prepare(model, tokenizer):
        end = start + prefill_ids.shape[1]
        yield repeat_ids, start, end
        start = end


def _score_in_blocks(press: Any, module: nn.Module, hidden_states: torch.Tensor, keys: torch.Tensor,
                     values: torch.Tensor, attentions: Any,
                     kwargs: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    """kvpress's ``KVzipPress.score_kvzip`` (without KVzip+'s normalisation) with its attention map made a block of
    query rows at a time: each row's softmax is its own, so every score is the one kvpress computes from the whole
    map (the same products, scaling, causal mask and softmax per row; the maximum over rows and heads is exact).
    Stores the pass's scores in ``press.score_val`` and returns the context's keys and values, as kvpress does."""
    from kvpress.utils import get_prerope_query_states
    from transformers.models.llama.modeling_llama import rotate_half

    bsz, q_len, _ = hidden_states.shape
    sink, start, end = min(press.n_sink, press.start_idx), press.start_idx, press.end_idx
    config: Any = module.config
    kv_heads = config.num_key_value_heads
    head_dim = int(module.head_dim)  # type: ignore[arg-type]
    queries = get_prerope_query_states(module, hidden_states)
    cos, sin = kwargs["position_embeddings"]
    queries = (queries * cos.unsqueeze(1)) + (rotate_half(queries) * sin.unsqueeze(1))
    queries = queries.view(bsz, kv_heads, config.num_attention_heads // kv_heads, q_len, head_dim)
    scored = torch.cat([keys[:, :, :sink], keys[:, :, start:end], keys[:, :, -q_len:]], dim=2)
    scored = scored.unsqueeze(2).transpose(-2, -1).contiguous()  # [bsz, Hkv, 1, D, n]
    n = scored.shape[-1]
    # kvpress's own causal mask over the replay tokens' keys, made once per pass length and kept on the press for the
    # other layers as its _mask_causal keeps it: 0 up to the row's position, the dtype's minimum after it
    mask = press.causal_mask_score
    if mask is None or mask.size(-1) != q_len or mask.dtype != queries.dtype or mask.device != queries.device:
        press._make_mask(queries, q_len)
    causal = press.causal_mask_score[0, 0, 0]  # [q, q]
    rows = max(MIN_ROWS, int(BLOCK_BYTES or 0) // (queries.shape[1] * queries.shape[2] * n * queries.element_size()))
    starts = list(range(0, q_len, rows))
    if len(starts) > 1 and q_len - starts[-1] < MIN_ROWS:
        starts.pop()  # a short last block joins the one before it
    best: torch.Tensor | None = None
    for r0, r1 in zip(starts, [*starts[1:], q_len], strict=True):
        weights = torch.matmul(queries[..., r0:r1, :], scored) / math.sqrt(head_dim)
        weights[..., -q_len:] += causal[r0:r1]
        block = nn.functional.softmax(weights, dim=-1)[..., sink : sink + end - start].amax(dim=(-3, -2))
        best = block if best is None else torch.maximum(best, block)
    assert best is not None
    press.score_val[int(module.layer_idx)][..., start:end] = best  # type: ignore[arg-type]
    return keys[:, :, : press.context_length], values[:, :, : press.context_length]


@SCORERS.add
class KVzipScorer(KvpressScorer):
    name: ClassVar[str] = "kvzip"
    description: ClassVar[str] = ("Largest attention from a replay of the context onto each entry (KVzip, kvpress "
                                  "KVzipPress); default selection global.")
    press_cls: ClassVar[Any] = KvpressClass("KVzipPress")
    quiet_module: ClassVar[str | None] = "kvzip_press"  # its cost is stated in `presses list`
    scores_after_prefill: ClassVar[bool] = True
    default_selection: ClassVar[str] = "global"
    extra_cost: ClassVar[str] = "replays the context: one more forward over all T tokens (kvpress: 2–3× the prefill)"
    schema: ClassVar[dict[str, Param]] = {"n_sink": Param(lo=0, why="a count of protected first tokens"),
                                          "chunk_size": Param(lo=1, why="context tokens replayed per pass")}

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        self._window: int | None = None
        self._tokenizer: Any = None

    @classmethod
    def parameters(cls) -> dict[str, Any]:
        return {"n_sink": 4, "kvzip_plus_normalization": False, "chunk_size": 2048}

    def setup(self, model: nn.Module) -> None:
        config: Any = model.config
        self._window = getattr(config, "max_position_embeddings", None)

    def setup_tokenizer(self, tokenizer: Any) -> None:
        """The template head's length and tail ids, as ``KVzipPress.__call__`` derives them from the tokenizer."""
        if getattr(tokenizer, "chat_template", None) is None:
            prefix_text, suffix_text = "", "\n"
        else:
            dummy = "dummy context"
            sep = "\n" + "#" * len(dummy)
            rendered = tokenizer.apply_chat_template([{"role": "user", "content": dummy + sep}],
                                                     add_generation_prompt=True, tokenize=False, enable_thinking=False)
            context, suffix_text = rendered.split(sep)
            prefix_text = context.split(dummy)[0]
        self.press.prefix_length = len(tokenizer.encode(prefix_text, add_special_tokens=False))
        self.press._suffix_ids = tokenizer.encode(suffix_text, return_tensors="pt", add_special_tokens=False)
        self._overhead = (len(tokenizer.encode(_LATER, add_special_tokens=False)) + _QUOTED
                          + self.press._suffix_ids.shape[1])
        self._tokenizer = tokenizer

    def check(self, num_tokens: int) -> None:
        if self._window is None or self._tokenizer is None:
            return
        replay = min(int(self.chunk_size), max(1, num_tokens - self.press.prefix_length)) + self._overhead
        if num_tokens + replay > self._window:
            room = self._window - num_tokens - self._overhead
            hint = (f"use kvzip[chunk_size={room}] (shorter replay passes) or a shorter context" if room >= 1
                    else "use a shorter context")
            raise EngineError(f"kvzip replays the context after it: {num_tokens} context tokens plus a replay pass of "
                              f"{replay} exceed the model's context window of {self._window}; {hint}")

    def score(self, x: ScoreInputs, ratio: float) -> torch.Tensor:
        raise EngineError("kvzip scores every layer at once after the prefill (its replay); it cannot score one "
                          "layer on its own (e.g. as another scorer's base)")

    def score_model(self, x: ModelScoreInputs, ratio: float) -> torch.Tensor:
        if self._tokenizer is None:
            raise EngineError("kvzip needs the model's tokenizer to write its replay prompts; "
                              "run it through the engine")
        from transformers import DynamicCache

        from kvroute.models.layers import base_model, decoder_layers

        model: Any = x.model  # a transformers causal LM
        if any(c.__name__ == "Gemma3PreTrainedModel" for c in type(model).__mro__):
            raise EngineError("kvpress's KVzipPress does not support Gemma 3 (it refuses Gemma3PreTrainedModel models)")
        press = self.press
        T = x.context_ids.shape[1]
        self.check(T)
        cache = DynamicCache(config=model.config)
        for layer, (k, v) in enumerate(zip(x.keys, x.values, strict=True)):
            cache.update(k, v, layer)  # the shared tensors; the replay concatenates new ones, never writes these
        press._context_ids, press._cache, press.context_length = x.context_ids, cache, T
        attns: list[Any] = [layer.self_attn for layer in decoder_layers(model)]
        hooks = [attn.register_forward_hook(press.forward_hook, with_kwargs=True) for attn in attns]
        if (BLOCK_BYTES is not None and not press.kvzip_plus_normalization and x.keys[0].device.type == "cpu"
                and x.keys[0].dtype == torch.float32):
            press.score_kvzip = functools.partial(_score_in_blocks, press)  # (on the instance: undone below)
        try:
            for repeat_ids, start, end in replay_passes(press, model, self._tokenizer):
                press.start_idx, press.end_idx = start, end  # the chunk the forward hook scores
                base_model(model)(input_ids=repeat_ids.to(x.context_ids.device), past_key_values=cache)
                heap.release()  # each pass's cache and maps are larger than the last's: its freed blocks go back
            scores = press.score_val[:, 0]  # [L, 1, Hkv, T] -> [L, Hkv, T]
            scores[..., : int(self.n_sink)] = scores.amax() + 1.0  # sinks are never evicted (KVzipPress.compress_post)
            return scores
        finally:
            for h in hooks:
                h.remove()
            press._context_ids = press._cache = press.score_val = None
            vars(press).pop("score_kvzip", None)

