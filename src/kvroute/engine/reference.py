"""The kvpress side of equivalence checks: the same press and prompt through kvpress itself.

kvroute's masked engine must give exactly what kvpress's pipeline gives (DESIGN decision 1). This
module builds the kvpress press equivalent to a kvroute press spec and runs kvpress's own code
paths: its ``KVPressTextGenerationPipeline`` for answers, and its press hooks plus a plain forward
for logits.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from transformers import DynamicCache

from kvroute.config import DEFAULT_MAX_NEW_TOKENS
from kvroute.models.layers import DefaultLayerType, base_model, decoder_layers
from kvroute.presses import build_press

if TYPE_CHECKING:
    from kvroute.models.loading import LoadedModel


def kvpress_press(spec: str, ratio: float, question_window: int = 0) -> Any:
    """The kvpress press object for a kvroute press spec, from its selection's and scorer's counterparts.

    Raises :class:`~kvroute.errors.EngineError` saying why when kvpress has no such press.
    ``question_window``: the question's tokens at the end of the context (finch's window).
    """
    press = build_press(spec)
    return press.selection.kvpress_counterpart(press.scorer, ratio, question_window)


def kvpress_pipeline(lm: LoadedModel) -> Any:
    from kvpress import KVPressTextGenerationPipeline

    return KVPressTextGenerationPipeline(model=lm.model, tokenizer=lm.tokenizer, device=lm.model.device)


def kvpress_answer(lm: LoadedModel, context: str, question: str, spec: str | None, ratio: float, *,
                   max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS, answer_prefix: str = "", pipeline: Any = None,
                   question_window: int = 0) -> str:
    """kvpress pipeline's greedy answer (``spec=None``: no press)."""
    pipe = pipeline or kvpress_pipeline(lm)
    press = kvpress_press(spec, ratio, question_window) if spec and ratio > 0 else None
    with _attn(lm, spec):
        return pipe(context, question=question, press=press, max_new_tokens=max_new_tokens,
                    answer_prefix=answer_prefix)["answer"]


REFERENCE_ATTENTION = "kvroute_reference"


class _attn:
    """The attention kvpress's side runs with, for the duration of a call (then restored).

    - observed_attention in kvpress needs eager attention weights: eager for such presses.
    - Gemma 3's rotary module needs a layer type (transformers 5.2) that kvpress's scorers (Expected Attention and
      others reading ``module.rotary_emb``) do not pass: they raise AttributeError. For the call, calls without one
      read the global layers' (the layers kvpress compresses in Gemma3ForConditionalGeneration).
    - Presses whose layers keep different numbers of entries (pyramid, chunkkv's partial chunk) leave a
      cache whose layers differ in length. transformers 5.2 builds one causal mask from layer 0's length,
      so sdpa fails on the other layers (size mismatch) and eager crops the mask from the wrong end (the
      question's causal triangle shifts). The model's own attention function (as kvpress patched it, fake
      keys included) is therefore called through a wrapper that aligns the causal mask to each layer's own
      key length. Where all layers have one length the mask is passed on untouched. Gemma 3 (global layers
      pruned, sliding layers whole): kvpress's pipeline (a cache without the config) gets layer 0's, the
      sliding layer's, length, which sdpa refuses (aligned as above); a cache built with the config
      (:func:`kvpress_logits`) gets the global layers' length built from the sliding layer's positions, in
      which every question token sees the whole question: the wrapper restores the causal triangle.
    """

    def __init__(self, lm: LoadedModel, spec: str | None) -> None:
        self.model = lm.model
        self.cfg = lm.model.config.get_text_config()  # the config the attention layers read (Gemma 3's text_config)
        self.eager = bool(spec) and build_press(spec).scorer.needs_attentions  # type: ignore[arg-type]

    def __enter__(self) -> None:
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

        self.prev = self.cfg._attn_implementation
        self.head_dim_set = False
        self.rotary = getattr(base_model(self.model), "rotary_emb", None)
        if not hasattr(self.rotary, "full_attention_inv_freq"):
            self.rotary = None
        if self.rotary is not None:  # Gemma 3: kvpress's scorers call its rotary without a layer type
            base_model(self.model).rotary_emb = DefaultLayerType(self.rotary, "full_attention")
        if self.eager:  # transformers' eager is each model's own function, not in the registry (nor patched by kvpress)
            self.cfg._attn_implementation = "eager"
            return
        from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

        inner = ALL_ATTENTION_FUNCTIONS[self.prev]
        self.had = REFERENCE_ATTENTION in ALL_ATTENTION_FUNCTIONS._local_mapping
        ALL_ATTENTION_FUNCTIONS[REFERENCE_ATTENTION] = _aligned_mask(inner)
        # transformers builds masks only for implementations its mask registry knows (read from _global_mapping)
        ALL_MASK_ATTENTION_FUNCTIONS._global_mapping[REFERENCE_ATTENTION] = ALL_MASK_ATTENTION_FUNCTIONS[self.prev]
        self.head_dim_set = not hasattr(self.cfg, "head_dim")
        if self.head_dim_set:  # kvpress's CriticalKV reads config.head_dim, which Qwen2's config lacks
            self.cfg.head_dim = self.cfg.hidden_size // self.cfg.num_attention_heads
        self.cfg._attn_implementation = REFERENCE_ATTENTION

    def __exit__(self, *exc: object) -> None:
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

        self.cfg._attn_implementation = self.prev
        if self.rotary is not None:
            base_model(self.model).rotary_emb = self.rotary
        if self.head_dim_set:
            del self.cfg.head_dim
        if not self.eager:
            from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

            ALL_MASK_ATTENTION_FUNCTIONS._global_mapping.pop(REFERENCE_ATTENTION, None)
            if not self.had:
                del ALL_ATTENTION_FUNCTIONS[REFERENCE_ATTENTION]


def _aligned_mask(inner: Any) -> Any:
    def forward(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                attention_mask: torch.Tensor | None, *args: Any, **kwargs: Any) -> Any:
        q, k = query.shape[2], key.shape[2]
        # a mask of another length, or (Gemma 3: positions from a whole sliding layer over a pruned global one's keys)
        # of this length but not the question's causal triangle: one prompt, no padding, so the triangle is the mask
        if attention_mask is not None and (attention_mask.shape[-1] != k or 1 < q < k and not bool(
                (_allowed(attention_mask, query, k) == _causal(q, k, query.device)).all())):
            allowed = _causal(q, k, query.device)
            if attention_mask.dtype == torch.bool:
                attention_mask = allowed
            else:
                attention_mask = torch.zeros(allowed.shape, dtype=attention_mask.dtype, device=query.device)
                attention_mask = attention_mask.masked_fill(~allowed, torch.finfo(attention_mask.dtype).min)
        probe = _PROBE[0]
        masked = getattr(module, "masked_key_indices", None)
        if probe is None or masked is None or q == k:
            return inner(module, query, key, value, attention_mask, *args, **kwargs)
        allowed, kept = _allowed(attention_mask, query, k), _kept(masked, query, key)
        out = inner(module, query, key, value, _additive(allowed & kept, query.dtype) if probe.exact
                    else attention_mask, *args, **kwargs)
        # kvpress's wrapper (inside ``inner``) wrote its fake keys into ``key`` at the masked entries
        groups = query.shape[1] // key.shape[1]
        scores = query.float() @ key.float().repeat_interleave(groups, 1).transpose(-1, -2) * module.scaling
        weights = scores.masked_fill(~allowed, float("-inf")).softmax(-1)
        leak = weights.masked_fill(kept, 0).sum(-1)  # [B, H, q]: mass on masked entries
        worst = float(leak.max())
        probe.forwards += 1
        if worst > probe.leak or probe.layer is None:
            probe.leak, probe.layer = worst, getattr(module, "layer_idx", None)
        return out

    return forward


class FakeKeyProbe:
    """Watches kvpress's fake-key decode (AdaKV-style presses) inside the reference wrapper.

    kvpress does not drop a masked entry: it overwrites its key with a fake key chosen so that every
    current query's dot product with it is negative, scaled by ``1e5 / ||Y||²``, assuming that such a
    logit's weight underflows to zero. Softmax compares logits with each other, not with zero: a
    query whose real logits are all lower still puts its weight on the fake keys. ``leak`` is the largest
    attention weight any query of any decode forward put on masked entries (the question's forward included), in
    ``layer`` (Qwen2.5-0.5B's first layer has queries that put all of it there). ``exact=True`` also masks those entries
    exactly (−inf), which is what physically dropping them does and what kvroute's masked decode does.
    """

    def __init__(self, exact: bool = False) -> None:
        self.exact = exact
        self.leak = 0.0
        self.layer: int | None = None  # where ``leak`` was seen
        self.forwards = 0  # attention calls watched (0: the press's decode never reached the reference wrapper)

    def __enter__(self) -> FakeKeyProbe:
        if _PROBE[0] is not None:
            raise RuntimeError("a fake-key probe is already active")
        _PROBE[0] = self
        return self

    def __exit__(self, *exc: object) -> None:
        _PROBE[0] = None


_PROBE: list[FakeKeyProbe | None] = [None]


def _causal(q: int, k: int, device: torch.device) -> torch.Tensor:
    """``[1, 1, q, k]``: the last ``q`` of ``k`` positions, each attending to itself and everything before."""
    return torch.ones(q, k, dtype=torch.bool, device=device).tril(k - q)[None, None]


def _allowed(attention_mask: torch.Tensor | None, query: torch.Tensor, k: int) -> torch.Tensor:
    """Where each query may attend ``[B or 1, 1 or H, q, k]`` (bool) from the mask passed on, or causal when None."""
    q = query.shape[2]
    if attention_mask is None:
        return _causal(q, k, query.device)
    if attention_mask.dtype == torch.bool:
        return attention_mask[..., -q:, -k:]
    return attention_mask[..., -q:, -k:] > torch.finfo(attention_mask.dtype).min / 2


def _kept(masked: Any, query: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
    """``[B, H, 1, k]`` False at kvpress's ``masked_key_indices`` (KV heads expanded to their query heads)."""
    b, hkv, k = key.shape[:3]
    batch, head, pos = masked
    keep = torch.ones(b, hkv, k, dtype=torch.bool, device=query.device)
    keep[batch, head, pos] = False
    return keep.repeat_interleave(query.shape[1] // hkv, 1)[:, :, None, :]


def _additive(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill(~allowed, float("-inf"))


@torch.inference_mode()
def kvpress_logits(lm: LoadedModel, context_ids: list[int], question_ids: list[int], spec: str | None, ratio: float,
                   question_window: int = 0) -> torch.Tensor:
    """Logits ``[Q, V]`` of the question tokens after kvpress compressed the context's cache."""
    model = lm.model
    device = next(model.parameters()).device
    ctx = torch.tensor([context_ids], device=device)
    q = torch.tensor([question_ids], device=device)
    cache = DynamicCache(config=model.config)
    press = kvpress_press(spec, ratio, question_window) if spec and ratio > 0 else None
    with _attn(lm, spec):
        if press is not None:
            with press(model):
                model.model(input_ids=ctx, past_key_values=cache)
        else:
            model.model(input_ids=ctx, past_key_values=cache)
        T = ctx.shape[1]
        pos = torch.arange(T, T + q.shape[1], device=device).unsqueeze(0)
        out = model(input_ids=q, past_key_values=cache, position_ids=pos)
    for layer in decoder_layers(model):  # AdaKV leaves its indices on the modules; do not let them leak
        if hasattr(layer.self_attn, "masked_key_indices"):
            layer.self_attn.masked_key_indices = None
    return out.logits[0].float()


def kvpress_prompt_ids(tokenizer: Any, context: str, question: str,
                       answer_prefix: str = "") -> tuple[list[int], list[int]]:
    """Token ids exactly as kvpress's pipeline preprocesses ``context`` and ``question``."""
    from kvpress import KVPressTextGenerationPipeline

    pre = KVPressTextGenerationPipeline.preprocess(
        _Shim(tokenizer), context, [question], answer_prefix, max_context_length=10**9)
    return pre["context_ids"][0].tolist(), pre["questions_ids"][0][0].tolist()


class _Shim:
    """Just enough of a pipeline object for kvpress's ``preprocess`` (it reads ``self.tokenizer``)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
