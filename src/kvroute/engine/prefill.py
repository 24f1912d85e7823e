"""One full-attention prefill per prompt, with every requested scorer computed in a capture hook.

kvpress compresses each layer's cache in a forward hook *after* the layer has seen the full
context; later layers are unaffected. So one uncompressed prefill that records each scorer's
scores per layer gives exactly the scores every kvpress press would have used, and any
(press, ratio) cell is then just a KeepMask over the same cache.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch import nn
from transformers import DynamicCache
from transformers.models.llama.modeling_llama import repeat_kv

from kvroute import heap
from kvroute.engine.hooks import RowReuse, attention_hooks, base_model
from kvroute.errors import CELL_ERRORS, EngineError
from kvroute.models.queries import require_query_projection, rotate_queries, rotated_queries
from kvroute.presses.fence import finite_scores
from kvroute.presses.press import Press
from kvroute.presses.scorers import ScoreInputs, Scorer
from kvroute.presses.scorers.base import ModelScoreInputs
from kvroute.presses.selection import Selection
from kvroute.presses.selection.base import ScoreVariant

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ScoreKey:
    """What one score computation of the prefill is: equal keys are computed once and shared by their cells.

    ``scorer``: the scorer's canonical spec; ``variant``: how the selection runs it (None for a selection's
    auxiliary scores, always whole-context); ``ratio``: set only where the scores depend on it.
    """

    scorer: str
    variant: ScoreVariant | None
    ratio: float | None


@dataclass(frozen=True)
class ScoreRequest:
    """One score computation in the prefill: a scorer, the selection that runs it on each layer, a ratio."""

    key: ScoreKey
    scorer: Scorer
    selection: Selection | None = None  # its score_layer runs the scorer (None: the whole context)
    ratio: float | None = None  # only for ratio-dependent scorers and selections that score per ratio

    @classmethod
    def for_press(cls, press: Press, ratio: float) -> ScoreRequest:
        """The request that scores ``press`` for ``ratio`` (kept in the key only where the scores depend on it)."""
        r = ratio if (press.scorer.ratio_dependent or press.selection.scores_per_ratio) else None
        key = ScoreKey(str(press.scorer.spec()), press.selection.score_variant(), r)
        return cls(key, press.scorer, press.selection, r)


class PrefillCapture(Protocol):
    """A consumer of per-layer prefill tensors (metrics use these, e.g. evidence leakage)."""

    def on_layer(self, layer_idx: int, module: nn.Module, hidden_states: torch.Tensor, keys: torch.Tensor,
                 values: torch.Tensor, kwargs: dict[str, Any], queries: torch.Tensor | None = None) -> None:
        """``queries``: the layer's post-RoPE queries ``[1, H, T, D]`` (as the model computed them)."""


@dataclass
class PrefillResult:
    """The shared context cache and every requested score, for one prompt prefix."""

    context_ids: torch.Tensor  # long [T]
    keys: list[torch.Tensor]  # per layer [1, Hkv, T, D], post-RoPE (shared by all cells, never copied)
    values: list[torch.Tensor]  # per layer [1, Hkv, T, D]
    scores: dict[ScoreKey, torch.Tensor] = field(default_factory=dict)  # key -> [L, Hkv, T] (scorer's dtype)
    seconds: float = 0.0
    # the part of ``seconds`` spent computing scores (the scorers' own code, and the attention map for those that read
    # it), beside the model's forward
    score_seconds: float = 0.0

    @property
    def num_tokens(self) -> int:
        return int(self.context_ids.numel())


def prefill_attention(module: Any, hidden_states: torch.Tensor, keys: torch.Tensor,
                      position_embeddings: tuple[torch.Tensor, torch.Tensor],
                      queries: torch.Tensor | None = None) -> torch.Tensor:
    """The layer's causal attention map ``[1, H, T, T]``, computed as transformers' eager attention does.

    Only scorers with ``needs_attentions`` (observed_attention) trigger this: it is the one place
    kvroute materialises an N×N map. ``module`` is a transformers attention module.
    """
    T = hidden_states.shape[1]
    q = queries if queries is not None else rotated_queries(module, hidden_states, position_embeddings)  # [1, H, T, D]
    k = repeat_kv(keys, q.shape[1] // keys.shape[1])  # [1, H, T, D]
    w = torch.matmul(q, k.transpose(2, 3)) * module.scaling  # [1, H, T, T]
    causal = torch.ones(T, T, dtype=torch.bool, device=w.device).triu(1)
    w = w.masked_fill(causal, float("-inf"))
    return torch.softmax(w, dim=-1, dtype=torch.float32).to(q.dtype)


def _score_layer(req: ScoreRequest, x: ScoreInputs) -> torch.Tensor:
    """``[1, Hkv, T]`` scores for one layer, as the request's selection runs its scorer (whole context, chunked,
    ...)."""
    ratio = req.ratio if req.ratio is not None else 0.0
    if req.selection is None:
        return req.scorer.score(x, ratio)
    return req.selection.score_layer(req.scorer, x, ratio)


def _complete(req: ScoreRequest, scores: dict[ScoreKey, torch.Tensor], x: ModelScoreInputs) -> None:
    """After the forward: the request's ``[L, Hkv, T]`` scores in ``scores`` (a scorer with ``scores_after_prefill``
    scores now), checked finite, so no NaN or infinity reaches a keep mask (once per request rather than per layer:
    the check is a device sync)."""
    if req.scorer.scores_after_prefill:
        scores[req.key] = req.scorer.score_model(x, req.ratio if req.ratio is not None else 0.0)  # [L, Hkv, T]
    finite_scores(scores[req.key], f"scorer {req.key.scorer!r}")


def _filled_layers(cache: DynamicCache) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Per-layer keys and values ``[1, Hkv, T, D]`` of a cache the prefill has filled."""
    keys, values = [], []
    for i, layer in enumerate(cache.layers):
        if layer.keys is None or layer.values is None:
            raise EngineError(f"the prefill left cache layer {i} empty")
        keys.append(layer.keys)
        values.append(layer.values)
    return keys, values


def _queries(module: Any, proj: tuple[torch.Tensor, torch.Tensor] | None, pos: Any) -> torch.Tensor:
    """The layer's post-RoPE queries [1, H, T, D] from its query projection's output (``proj``: that projection's
    input and output; a fused qkv projection's query columns, as kvpress reads Phi-3's)."""
    if proj is None:
        raise EngineError(f"{type(module).__name__} has neither a q_proj nor a fused qkv_proj whose output the "
                          "scorers' queries come from")
    return rotate_queries(module, proj[1], pos)


@torch.inference_mode()
def prefill(model: nn.Module, context_ids: Sequence[int] | torch.Tensor, requests: Sequence[ScoreRequest] = (),
            *, evidence: Sequence[int] | None = None, seed: int = 0, question_window: int = 0,
            captures: Sequence[PrefillCapture] = (), errors: dict[ScoreKey, BaseException] | None = None,
            ) -> PrefillResult:
    """Run the context through ``model`` once with full attention; return its cache and all scores.

    Scorers with ``scores_after_prefill`` (KVzip's context replay) score after that forward, from
    the model and the filled cache (which they do not change). ``question_window``: the number of
    question tokens at the end of the context (question-aware regime), for scorers that read it.

    ``errors``: when given, a request whose scorer fails with one of :data:`kvroute.errors.CELL_ERRORS`
    is dropped (its exception stored under its key, its key absent from ``scores``) and the prefill goes
    on for the others; without it the error propagates.
    """
    device = next(model.parameters()).device
    ids = torch.as_tensor(list(context_ids) if not torch.is_tensor(context_ids) else context_ids,
                          dtype=torch.long, device=device).view(1, -1)
    ev = torch.as_tensor(list(evidence), dtype=torch.long, device=device) if evidence is not None else None
    layered = [r for r in requests if not r.scorer.scores_after_prefill]
    per_layer: dict[ScoreKey, list[torch.Tensor]] = {r.key: [] for r in layered}
    need_attn = any(r.scorer.needs_attentions for r in layered)
    need_queries = need_attn or bool(captures)
    # the current layer's q_proj input and output, kept by a hook: the queries need no recompute, and scorers that
    # recompute them from the layer's input get the forward's rows (RowReuse)
    projected: list[tuple[torch.Tensor, torch.Tensor]] = []
    reuse = RowReuse()
    scoring = [0.0]  # seconds in the scorers (PrefillResult.score_seconds)

    def hook(module: Any, args: Any, kwargs: dict[str, Any], output: Any) -> None:
        hidden = kwargs["hidden_states"]
        cache = kwargs["past_key_values"]
        layer: int = module.layer_idx
        keys, values = cache.layers[layer].keys, cache.layers[layer].values
        pos = kwargs["position_embeddings"]
        proj = projected.pop() if projected else None
        q = _queries(module, proj, pos) if need_queries else None  # [1, H, T, D]
        if layered:
            t = time.perf_counter()
            with reuse.rows(require_query_projection(module), *proj) if proj is not None else contextlib.nullcontext():
                score(module, layer, hidden, keys, values, kwargs, pos, q)
            scoring[0] += time.perf_counter() - t
        for c in captures:
            c.on_layer(layer, module, hidden, keys, values, kwargs, queries=q)

    def score(module: Any, layer: int, hidden: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
              kwargs: dict[str, Any], pos: Any, q: torch.Tensor | None) -> None:
        attn = prefill_attention(module, hidden, keys, pos, q) if need_attn else None
        for r in layered:
            if errors is not None and r.key in errors:
                continue
            x = ScoreInputs(module, layer, hidden, keys, values, kwargs,
                            attn if r.scorer.needs_attentions else None, ev, seed, question_window)
            try:
                per_layer[r.key].append(_score_layer(r, x))
            except CELL_ERRORS as e:
                if errors is None:
                    raise
                errors[r.key] = e

    def keep_projection(module: Any, args: Any, output: torch.Tensor) -> None:
        projected[:] = [(args[0], output)]

    t0 = time.perf_counter()
    config: Any = model.config  # a transformers config
    cache = DynamicCache(config=config)
    with attention_hooks(model, hook, q_proj_hook=keep_projection if need_queries or layered else None):
        base_model(model)(input_ids=ids, past_key_values=cache, use_cache=True)
    keys, values = _filled_layers(cache)
    scores = {k: torch.cat(v, dim=0) for k, v in per_layer.items()
              if errors is None or k not in errors}  # [L, Hkv, T] each
    t = time.perf_counter()
    for r in requests:
        if errors is not None and r.key in errors:
            continue
        heap.release()  # the forward's (or the last scorer's) freed blocks go back before a scorer's own forwards
        try:
            _complete(r, scores, ModelScoreInputs(model, ids, keys, values, seed))
        except CELL_ERRORS as e:
            if errors is None:
                raise
            errors[r.key] = e
            scores.pop(r.key, None)
    if len(layered) < len(requests):
        scoring[0] += time.perf_counter() - t
    return PrefillResult(ids[0], keys, values, scores, time.perf_counter() - t0, scoring[0])
