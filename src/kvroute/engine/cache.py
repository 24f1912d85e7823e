"""The per-cell suffix cache used while decoding many cells against one shared context."""

from __future__ import annotations

import torch


class SuffixCache:
    """Holds only the cells' own question/answer K/V; the context K/V stay in the prefill result.

    Duck-types the part of transformers' ``Cache`` that a forward pass uses: ``update`` appends the
    new tokens' K/V for a layer and returns the suffix so far (``[B, Hkv, s, D]``);
    ``get_seq_length`` counts the context too, so positions continue after it.
    """

    is_compileable = False
    is_initialized = True  # the context is cached (Gemma3ForConditionalGeneration's forward asks, to mask images)

    def __init__(self, num_layers: int, batch: int, num_kv_heads: int, head_dim: int, capacity: int,
                 context_len: int, dtype: torch.dtype, device: torch.device) -> None:
        shape = (batch, num_kv_heads, capacity, head_dim)
        self.k = [torch.empty(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v = [torch.empty(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.lens = [0] * num_layers
        self.context_len = context_len
        self.capacity = capacity

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int,
               cache_kwargs: dict | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        n = key_states.shape[2]
        start = self.lens[layer_idx]
        if start + n > self.capacity:
            raise RuntimeError(f"suffix cache full ({self.capacity} tokens)")
        self.k[layer_idx][:, :, start : start + n] = key_states
        self.v[layer_idx][:, :, start : start + n] = value_states
        self.lens[layer_idx] = start + n
        end = start + n
        return self.k[layer_idx][:, :, :end], self.v[layer_idx][:, :, :end]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.context_len + self.lens[layer_idx]

    def truncate(self, length: int) -> None:
        """Forget everything after the first ``length`` suffix tokens (e.g. teacher-forced gold tokens)."""
        self.lens = [min(n, length) for n in self.lens]

    def keep_rows(self, rows: torch.Tensor) -> None:
        """Keep only batch rows ``rows`` (cells still decoding)."""
        self.k = [t.index_select(0, rows) for t in self.k]
        self.v = [t.index_select(0, rows) for t in self.v]

    def __len__(self) -> int:
        return len(self.k)
