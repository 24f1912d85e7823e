"""The memory planner for cells: how many fit a decoding batch, and whether an instance fits at all.

The masked engine holds, for one instance, the model, the prefill's context K/V (shared by every cell),
and per cell: its keep mask, its own suffix K/V, the activations and logits of its rows in a forward,
and what it keeps until the instance's records are made (the captured attention rows and hidden
states). The attention's transient tensors have their own budget (:mod:`kvroute.engine.attention.streaming`
chunks the context to fit it). :class:`MemoryShape` counts these bytes from the model's config;
:func:`plan_batch` turns the free memory (device memory on CUDA, available RAM on the CPU) into a
batch size, and refuses — before the prefill, with the size needed — an instance that would not fit
even one cell at a time. ``benchmarks/cell_memory.py`` compares the counts with measured peaks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvroute.engine.attention.kept import kept_ready
from kvroute.engine.attention.streaming import MIN_CHUNK, ONE_SHOT_COPIES, one_shot_bytes
from kvroute.errors import InsufficientMemoryError

#: a decoding batch is never larger than this (beyond it a CPU gains nothing, and the cells of one instance
#: of the demo's grid, 63 presses × ratios and the full cache, fit one batch)
MAX_BATCH = 64
#: the share of the free memory the planner leaves unplanned (allocator fragmentation, the tokenizer, Python)
HEADROOM = 0.10


def gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB"


@dataclass(frozen=True)
class MemoryShape:
    """What the memory count reads from a model's config (``dtype_bytes``: its weights' element size)."""

    layers: int
    heads: int  # query heads
    kv_heads: int
    head_dim: int
    hidden: int
    intermediate: int
    vocab: int
    dtype_bytes: int
    # the kept-entries kernel runs (kvroute.engine.attention.kept): each cell's kept positions are held as an index
    # per layer
    kept_index: bool = False

    @classmethod
    def of(cls, model: Any) -> MemoryShape:
        config = getattr(model.config, "text_config", model.config)
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        param = next(model.parameters())
        return cls(config.num_hidden_layers, config.num_attention_heads,
                   getattr(config, "num_key_value_heads", None) or config.num_attention_heads, head_dim,
                   config.hidden_size, getattr(config, "intermediate_size", 4 * config.hidden_size),
                   config.vocab_size, param.element_size(), kept_ready(param.device, param.dtype, head_dim))

    def context_bytes(self, T: int) -> int:
        """The prefill's K/V of ``T`` context tokens, shared by every cell of the instance."""
        return 2 * self.layers * self.kv_heads * T * self.head_dim * self.dtype_bytes

    def prefill_bytes(self, T: int, *, attention_map: bool = False, score_sets: int = 1) -> int:
        """The prefill's peak beside the weights: its K/V, one layer's activations, the scores (float32 per layer,
        KV head and token, ``score_sets`` of them), and with ``attention_map`` one layer's full ``[H, T, T]``
        map (observed_attention's scorer) with its float32 scores."""
        act = T * (4 * self.hidden + 3 * self.intermediate) * self.dtype_bytes
        scores = score_sets * self.layers * self.kv_heads * T * 4
        amap = self.heads * T * T * (4 + self.dtype_bytes) if attention_map else 0
        return self.context_bytes(T) + act + scores + amap

    def batch_cell_bytes(self, T: int, q: int, new: int, *, capture: bool) -> int:
        """One cell's share of a decoding batch: keep mask, its additive form and its kept positions (kept per layer
        for the batch), suffix K/V (question, answer, a draft of ``new``), one forward's activations for its ``q``
        rows (hidden states of every layer kept when ``capture``), the logits of ``new + 1`` positions, its
        attention rows at the smallest context chunk, and with ``capture`` the captured attention row of its last
        prompt token while it is computed."""
        # bool; its additive form (two bytes, cached); where the kept-entries kernel runs, its kept positions
        # (kvroute.engine.attention.kept: int32, cached, at most T of them)
        mask = self.layers * self.kv_heads * T * (1 + 2 + (4 if self.kept_index else 0))
        suffix = 2 * self.layers * self.kv_heads * (q + 2 * new + 1) * self.head_dim * self.dtype_bytes
        states = (self.layers + 1 if capture else 4) * q * self.hidden * self.dtype_bytes
        mlp = 3 * q * self.intermediate * self.dtype_bytes
        # logits of the last question position, the teacher-forced ones and a verified draft (at most ``new`` each):
        # the logits, their float32 log-softmax and one more float32 copy
        logits = (new + 1) * self.vocab * (self.dtype_bytes + 8)
        attention = ONE_SHOT_COPIES * 4 * self.heads * q * (MIN_CHUNK + q + 2 * new)
        # the captured row of the last prompt token while it is computed (scores, probabilities, the copy kept)
        rows = ONE_SHOT_COPIES * 4 * self.heads * (T + q + 2 * new) if capture else 0
        return mask + suffix + states + mlp + logits + attention + rows

    def kept_cell_bytes(self, T: int, q: int, new: int, *, capture: bool, tracks: int = 0) -> int:
        """What a decoded cell keeps until the instance's records are made: with ``capture``, its last prompt
        token's attention rows (float32, every layer and query head) and hidden states, and ``tracks`` sets of
        generated-token masses."""
        if not capture:
            return 0
        rows = self.layers * self.heads * (T + q) * 4
        hidden = (self.layers + 1) * self.hidden * 4
        return rows + hidden + tracks * new * self.layers * self.heads * 4


@dataclass(frozen=True)
class BatchPlan:
    batch: int  # cells per decoding batch
    per_cell: int  # bytes one cell adds to a batch
    fixed: int  # bytes held whatever the batch: the cells' kept captures and the attention's transient tensors
    available: int  # free memory the plan started from
    fits: int  # the most cells the memory would take in one batch (before the MAX_BATCH cap)


def plan_batch(shape: MemoryShape, *, T: int, q: int, new: int, cells: int, available: int, attention: int,
               capture: bool, tracks: int = 0, requested: int | None = None) -> BatchPlan:
    """The batch size for decoding ``cells`` cells of one instance after its prefill (T context tokens, whose K/V
    are already allocated; q question + teacher-forced tokens; ``new`` generated ones) in ``available`` free
    bytes, beside an ``attention`` budget for the masked attention's transient tensors: the most that fit (at
    most :data:`MAX_BATCH` and ``cells``), or ``requested`` when given. Raises InsufficientMemoryError, with the memory
    needed, when not even one cell at a time fits."""
    per_cell = shape.batch_cell_bytes(T, q, new, capture=capture)
    need_attention = one_shot_bytes(min(cells, MAX_BATCH), shape.heads, q, T + q + 2 * new)
    fixed = cells * shape.kept_cell_bytes(T, q, new, capture=capture, tracks=tracks) + min(attention, need_attention)
    room = int(available * (1 - HEADROOM)) - fixed
    fits = max(room // per_cell, 0)
    if fits < 1:
        raise InsufficientMemoryError(f"decoding {cells} cells of {T} context tokens needs about "
                          f"{gib((fixed + per_cell) / (1 - HEADROOM))} beside the prefill, one cell at a time; "
                          f"{gib(available)} is free. Run fewer cells per instance, turn the captures off "
                          "(answers-only metrics), lower decoding.attention_memory, or use a larger device")
    batch = requested if requested is not None else int(max(1, min(MAX_BATCH, cells, fits)))
    return BatchPlan(batch, per_cell, fixed, available, int(fits))


def instance_bytes(shape: MemoryShape, *, T: int, q: int, new: int, cells: int, capture: bool, tracks: int = 0,
                   attention_map: bool = False, score_sets: int = 1) -> int:
    """The least memory beside the weights that one instance needs: the larger of its prefill and its decode of
    one cell at a time (the context K/V, every cell's kept captures, one cell's batch share and its attention
    at the smallest chunk)."""
    decode = (shape.context_bytes(T) + cells * shape.kept_cell_bytes(T, q, new, capture=capture, tracks=tracks)
              + shape.batch_cell_bytes(T, q, new, capture=capture))
    return max(shape.prefill_bytes(T, attention_map=attention_map, score_sets=score_sets), decode)


def check_instance(shape: MemoryShape, *, available: int, **kw: Any) -> None:
    """Refuse (InsufficientMemoryError, with the memory needed) an instance that would not fit ``available`` free
    bytes even one cell at a time (``kw``: as :func:`instance_bytes`)."""
    need = instance_bytes(shape, **kw) / (1 - HEADROOM)
    if need > available:
        raise InsufficientMemoryError(
            f"an instance of {kw['T']} context tokens and {kw['cells']} cells needs about {gib(need)} beside the "
            f"model; {gib(available)} is free. Shorten the context, run fewer cells per instance, turn the captures "
            "off (answers-only metrics), or use a larger device")
