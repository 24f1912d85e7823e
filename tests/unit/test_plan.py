"""The memory planner's arithmetic on hand-worked shapes, and its refusals."""

from dataclasses import replace

import pytest

from kvroute.engine.attention.streaming import MIN_CHUNK, one_shot_bytes
from kvroute.engine.plan import HEADROOM, MAX_BATCH, MemoryShape, check_instance, instance_bytes, plan_batch
from kvroute.errors import EngineError, InsufficientMemoryError
from kvroute.models import tiny_model

# 2 layers, 4 query heads over 2 KV heads of 8 dims, hidden 32, MLP 64, vocab 100, float32
SHAPE = MemoryShape(layers=2, heads=4, kv_heads=2, head_dim=8, hidden=32, intermediate=64, vocab=100, dtype_bytes=4)


def test_the_counts_are_the_tensors_they_name():
    T, q, new = 1000, 10, 5
    assert SHAPE.context_bytes(T) == 2 * 2 * 2 * 1000 * 8 * 4  # K and V, layers, KV heads, tokens, dims, float32
    per_cell = SHAPE.batch_cell_bytes(T, q, new, capture=True)
    assert per_cell == (2 * 2 * 1000 * (1 + 2)  # keep mask, one byte per (layer, KV head, token); its additive form, 2
                        + 2 * 2 * 2 * (10 + 2 * 5 + 1) * 8 * 4  # suffix K/V: question, answer and a draft
                        + 3 * 10 * 32 * 4  # hidden states of every layer (and the embeddings) kept
                        + 3 * 10 * 64 * 4  # MLP transient
                        + 6 * 100 * (4 + 8)  # logits of new + 1 positions and their float32 log-softmax
                        + 3 * 4 * 4 * 10 * (MIN_CHUNK + 10 + 10)  # attention rows at the smallest chunk
                        + 3 * 4 * 4 * (1000 + 10 + 10))  # the captured row being computed
    # where the kept-entries kernel runs, each cell's kept positions too: at most T int32 per (layer, KV head)
    kept = replace(SHAPE, kept_index=True).batch_cell_bytes(T, q, new, capture=True)
    assert kept - per_cell == 2 * 2 * 1000 * 4
    assert SHAPE.kept_cell_bytes(T, q, new, capture=False) == 0
    assert SHAPE.kept_cell_bytes(T, q, new, capture=True, tracks=1) == 2 * 4 * 1010 * 4 + 3 * 32 * 4 + 5 * 2 * 4 * 4
    assert SHAPE.prefill_bytes(T, attention_map=True) - SHAPE.prefill_bytes(T) == 4 * 1000 * 1000 * 8


def test_the_batch_is_what_fits_capped():
    kw = dict(T=1000, q=10, new=5, capture=True, attention=1 << 20)
    big = plan_batch(SHAPE, cells=200, available=1 << 40, **kw)
    assert big.batch == MAX_BATCH and big.fits > MAX_BATCH
    assert plan_batch(SHAPE, cells=7, available=1 << 40, **kw).batch == 7
    # room for exactly three cells beside the fixed part
    fixed = 20 * SHAPE.kept_cell_bytes(1000, 10, 5, capture=True) + min(1 << 20, one_shot_bytes(20, 4, 10, 1020))
    per_cell = SHAPE.batch_cell_bytes(1000, 10, 5, capture=True)
    available = int((fixed + 3 * per_cell + 1) / (1 - HEADROOM)) + 1
    plan = plan_batch(SHAPE, cells=20, available=available, **kw)
    assert (plan.batch, plan.fits, plan.per_cell, plan.fixed) == (3, 3, per_cell, fixed)
    assert plan_batch(SHAPE, cells=20, available=available, requested=16, **kw).batch == 16  # the user's number


def test_too_little_memory_is_refused_with_the_size_needed():
    with pytest.raises(InsufficientMemoryError, match=r"needs about [\d.]+ GiB .*0.00 GiB is free"):
        plan_batch(SHAPE, T=1000, q=10, new=5, cells=20, available=1000, attention=1 << 20, capture=True)
    kw = dict(T=100_000, q=10, new=5, cells=64, capture=True)
    need = instance_bytes(SHAPE, **kw) / (1 - HEADROOM)
    check_instance(SHAPE, available=int(need) + 1, **kw)
    with pytest.raises(InsufficientMemoryError, match="100000 context tokens and 64 cells needs about"):
        check_instance(SHAPE, available=int(need) - 1, **kw)
    assert issubclass(InsufficientMemoryError, EngineError)


def test_the_shape_is_read_from_the_model():
    lm = tiny_model("qwen2", seed=0)
    s = MemoryShape.of(lm.model)
    c = lm.model.config
    assert (s.layers, s.heads, s.kv_heads, s.hidden, s.vocab) == (c.num_hidden_layers, c.num_attention_heads,
                                                                  c.num_key_value_heads, c.hidden_size, c.vocab_size)
    assert s.dtype_bytes == 4 and s.kv_heads < s.heads


def test_no_cells_plan_a_batch_of_one():
    plan = plan_batch(SHAPE, T=100, q=5, new=2, cells=0, available=1 << 30, attention=1 << 20, capture=False)
    assert plan.batch == 1


def test_the_shape_counts_the_kept_index_where_the_kernel_runs():
    """MemoryShape.of marks a float32 CPU model with a head size the kept-entries kernel has when the CPU can run it
    and it is built, and never a tiny head size or a bfloat16 model."""
    import torch

    from kvroute.engine.attention.kept import kept_ready

    assert not MemoryShape.of(tiny_model("llama").model).kept_index  # head_dim 16
    big = tiny_model("llama", hidden=256, heads=4, kv_heads=2).model  # head_dim 64
    assert MemoryShape.of(big).kept_index == kept_ready(torch.device("cpu"), torch.float32, 64)
    assert not MemoryShape.of(big.to(torch.bfloat16)).kept_index
