"""The kvpress side of equivalence checks: the same press and prompt through kvpress itself.

kvroute's masked engine must give exactly what kvpress's pipeline gives (DESIGN decision 1). This
module builds the kvpress press equivalent to a kvroute press spec and runs kvpress's own code
paths: its ``KVPressTextGenerationPipeline`` for answers, and its press hooks plus a plain forward
for logits.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import DynamicCache

from kvroute.errors import EngineError
from kvroute.presses import build_press
from kvroute.presses.scorers.kvpress_adapter import KvpressScorer
from kvroute.presses.selection.adakv import AdaKV
from kvroute.presses.selection.chunk import Chunk

_SELECTION_WRAPPERS = ("per_head", "adakv", "chunk")


def kvpress_press(spec: str, ratio: float) -> Any:
    """The kvpress press object for a kvroute press spec (kvpress scorers with per_head/adakv/chunk)."""
    import kvpress

    press = build_press(spec)
    if not isinstance(press.scorer, KvpressScorer):
        raise EngineError(f"{press.scorer.name} is kvroute's own scorer; kvpress has no equivalent")
    sel = press.selection.name
    if sel not in _SELECTION_WRAPPERS:
        raise EngineError(f"selection {sel!r} has no kvpress equivalent that runs here ({_SELECTION_WRAPPERS})")
    inner = press.scorer.press_cls(compression_ratio=ratio, **press.scorer.params)
    selection = press.selection
    if isinstance(selection, AdaKV):  # registered as "adakv"
        return kvpress.AdaKVPress(inner, alpha_safeguard=selection.alpha_safeguard)
    if isinstance(selection, Chunk):  # registered as "chunk"
        return kvpress.ChunkPress(inner, chunk_length=selection.chunk_length)
    return inner


def kvpress_pipeline(lm: Any) -> Any:
    from kvpress import KVPressTextGenerationPipeline

    return KVPressTextGenerationPipeline(model=lm.model, tokenizer=lm.tokenizer, device=lm.model.device)


def kvpress_answer(lm: Any, context: str, question: str, spec: str | None, ratio: float, *,
                   max_new_tokens: int = 32, answer_prefix: str = "", pipeline: Any = None) -> str:
    """kvpress pipeline's greedy answer (``spec=None``: no press)."""
    pipe = pipeline or kvpress_pipeline(lm)
    press = kvpress_press(spec, ratio) if spec and ratio > 0 else None
    with _attn(lm, spec):
        return pipe(context, question=question, press=press, max_new_tokens=max_new_tokens,
                    answer_prefix=answer_prefix)["answer"]


class _attn:
    """observed_attention in kvpress needs eager attention weights: switch for the call, then restore."""

    def __init__(self, lm: Any, spec: str | None) -> None:
        self.cfg = lm.model.config
        self.eager = bool(spec) and build_press(spec).scorer.needs_attentions  # type: ignore[arg-type]

    def __enter__(self) -> None:
        self.prev = self.cfg._attn_implementation
        if self.eager:
            self.cfg._attn_implementation = "eager"

    def __exit__(self, *exc: object) -> None:
        self.cfg._attn_implementation = self.prev


@torch.inference_mode()
def kvpress_logits(lm: Any, context_ids: list[int], question_ids: list[int], spec: str | None, ratio: float) -> torch.Tensor:
    """Logits ``[Q, V]`` of the question tokens after kvpress compressed the context's cache."""
    model = lm.model
    device = next(model.parameters()).device
    ctx = torch.tensor([context_ids], device=device)
    q = torch.tensor([question_ids], device=device)
    cache = DynamicCache(config=model.config)
    press = kvpress_press(spec, ratio) if spec and ratio > 0 else None
    with _attn(lm, spec):
        if press is not None:
            with press(model):
                model.model(input_ids=ctx, past_key_values=cache)
        else:
            model.model(input_ids=ctx, past_key_values=cache)
        T = ctx.shape[1]
        pos = torch.arange(T, T + q.shape[1], device=device).unsqueeze(0)
        out = model(input_ids=q, past_key_values=cache, position_ids=pos)
    for layer in model.model.layers:  # AdaKV leaves its indices on the modules; do not let them leak
        if hasattr(layer.self_attn, "masked_key_indices"):
            layer.self_attn.masked_key_indices = None
    return out.logits[0].float()


def kvpress_prompt_ids(tokenizer: Any, context: str, question: str, answer_prefix: str = "") -> tuple[list[int], list[int]]:
    """Token ids exactly as kvpress's pipeline preprocesses ``context`` and ``question``."""
    from kvpress import KVPressTextGenerationPipeline

    pre = KVPressTextGenerationPipeline.preprocess(
        _Shim(tokenizer), context, [question], answer_prefix, max_context_length=10**9)
    return pre["context_ids"][0].tolist(), pre["questions_ids"][0][0].tolist()


class _Shim:
    """Just enough of a pipeline object for kvpress's ``preprocess`` (it reads ``self.tokenizer``)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
