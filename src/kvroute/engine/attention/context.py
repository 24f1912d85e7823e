"""What the masked attention needs besides its arguments, per decoding batch: :class:`MaskedContext`, with the
backend setting it carries (:class:`BackendChoice`) and the per-layer keep-mask forms it caches (the additive bias,
the kept-entries index). Imports no backend, so that the backends can all read it."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from kvroute.engine.attention.streaming import keep_bias

AUTO = "auto"
#: a forward gathers the kept entries when it has at least this many queries per cell (benchmarks/attention_kernels.py:
#: from 16 the gathered form is the faster at 2,048 and 8,192 context tokens; below, its per-group work is not repaid
#: (at 8 queries: 1.3× slower at 2,048, 7% faster at 8,192); at 512 tokens the fused one-shot form is 1.4× faster at
#: 16 queries, a few ms a layer)
GATHER_MIN_QUERIES = 16


@dataclass(frozen=True)
class BackendChoice:
    """The resolved setting: ``name`` (``"auto"`` or a backend), and whether the kept-entries kernel and PyTorch's
    private fused CPU kernel may run at all (``KVROUTE_KEPT_KERNEL=0`` and ``KVROUTE_FUSED_ATTENTION=0`` say no)."""

    name: str = AUTO
    kept: bool = True
    fused: bool = True

    @classmethod
    def from_env(cls, name: str = AUTO, env: Mapping[str, str] | None = None) -> BackendChoice:
        """``name`` (not checked: :func:`kvroute.engine.attention.backend.resolve_backend` checks it) with the two
        environment overrides read now (``env``: default the process's)."""
        env = os.environ if env is None else env
        return cls(name, kept=env.get("KVROUTE_KEPT_KERNEL", "1") != "0",
                   fused=env.get("KVROUTE_FUSED_ATTENTION", "1") != "0")


def kept_index(keep: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``keep`` bool ``[Hkv, B, T]`` → the CSR form the kernel reads: ``offsets`` int64 ``[Hkv·B + 1]`` and the kept
    positions ``index`` int32 (pair ``h·B + b``'s in ascending order at ``index[offsets[p]:offsets[p + 1]]``)."""
    Hkv, B, T = keep.shape
    flat = keep.reshape(Hkv * B, T)
    offsets = torch.zeros(Hkv * B + 1, dtype=torch.long, device=keep.device)
    torch.cumsum(flat.sum(-1), 0, out=offsets[1:])
    return offsets, flat.nonzero()[:, 1].to(torch.int32)


def select_index(offsets: torch.Tensor, index: torch.Tensor, heads: int, rows: torch.Tensor) -> tuple[torch.Tensor,
                                                                                                       torch.Tensor]:
    """The CSR form (:func:`kept_index`) of the cells ``rows`` (ascending batch rows) of ``heads`` KV heads, sliced
    from the whole batch's without rebuilding it from the mask."""
    counts = (offsets[1:] - offsets[:-1]).view(heads, -1)  # [Hkv, B]
    B = counts.shape[1]
    alive = torch.zeros(B, dtype=torch.bool, device=offsets.device)
    alive[rows] = True
    take = alive.repeat(heads).repeat_interleave(counts.flatten(), output_size=index.numel())
    new = counts.index_select(1, rows).flatten()
    out = torch.zeros(new.numel() + 1, dtype=torch.long, device=offsets.device)
    torch.cumsum(new, 0, out=out[1:])
    return out, index[take]


@dataclass
class MaskedContext:
    """What the attention function needs besides its arguments, per decoding batch."""

    keys: list[torch.Tensor]  # per layer [1, Hkv, T, D]
    values: list[torch.Tensor]  # per layer [1, Hkv, T, D]
    keep: torch.Tensor  # bool [B, L, Hkv, T]
    # called with (layer_idx, rows [B, H, T + s], query index) when set: the float32 attention of query index
    # ``capture_query`` of the forward (negative counts from the end), every query head; with
    # ``capture_query=None``, once per query index of the forward, in order
    on_probs: Callable[[int, torch.Tensor, int], None] | None = None
    capture_query: int | None = -1
    # context keys per step of the chunked (online-softmax) form; None: the whole context at once
    # (see kvroute.engine.attention.streaming: the planner sets it only where the one-shot tensors would not fit)
    context_chunk: int | None = None
    # bool [B, capacity] over the cells' suffix cache slots: False where a slot holds no token of that cell
    # (a draft token the cell rejected, see kvroute.engine.decode); None: every slot so far is the cell's
    suffix_keep: torch.Tensor | None = None
    # bytes the masked attention's transient tensors may take: the chunked form's chunk comes from it, and a gathered
    # slice takes at most this and kvroute.engine.attention.gather.GATHER_SLICE_BYTES; None: no limit but that cap
    budget: int | None = None
    # forwards of at least this many queries per cell attend each cell's kept context entries only (gathered,
    # kvroute.engine.attention.gather); None: every forward multiplies all T context keys (one-shot or chunked)
    gather_from: int | None = GATHER_MIN_QUERIES
    # which backend computes each forward (kvroute.engine.attention.backend): "auto" (the rule) unless a setting names
    # one; resolved, environment overrides included, when the context is made (never at import)
    backend: BackendChoice = field(default_factory=BackendChoice.from_env)
    # called with (layer_idx, masses [B, H, n], query index) when set, for the same query indices as ``on_probs``:
    # the attention probability each query head puts on each of the ``n`` position sets ``mass_sets`` (int64
    # positions into the T + s keys, context then suffix), summed. Unlike ``on_probs`` it needs no whole row: a
    # backend that returns its rows' log-sum-exp serves it with the scores at those positions only (capture.py)
    on_masses: Callable[[int, torch.Tensor, int], None] | None = None
    mass_sets: tuple[torch.Tensor, ...] = ()
    # per layer, the additive form of ``keep`` (kvroute.engine.attention.streaming.keep_bias, two bytes an entry) and
    # which
    # (KV head, cell) pairs keep nothing, built on first use and reused by every forward of the batch; emptied when
    # ``keep`` is replaced (see __setattr__)
    _bias: dict[int, torch.Tensor] = field(default_factory=dict, repr=False)
    _empty: dict[int, torch.Tensor] = field(default_factory=dict, repr=False)
    # per layer, the kept positions of every (KV head, cell) in the CSR form the kept-entries kernel reads
    # (kvroute.engine.attention.kept.kept_index), built on first use like the bias
    _index: dict[int, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict, repr=False)

    def __setattr__(self, name: str, value: Any) -> None:
        super().__setattr__(name, value)
        if name == "keep":
            super().__setattr__("_bias", {})
            super().__setattr__("_empty", {})
            super().__setattr__("_index", {})

    def context_bias(self, layer: int, dtype: torch.dtype) -> torch.Tensor:
        """``[Hkv, B, 1, T]``: 0 where a cell keeps a context entry of ``layer``, −inf where not, to add to scores of
        ``dtype`` (:func:`kvroute.engine.attention.streaming.keep_bias`; two bytes an entry, cached)."""
        bias = self._bias.get(layer)
        if bias is None:
            bias = self._bias[layer] = keep_bias(self.keep[:, layer].transpose(0, 1).unsqueeze(2), dtype)
        return bias

    def context_empty(self, layer: int) -> torch.Tensor:
        """bool ``[Hkv, B, 1]``: the (KV head, cell) pairs that keep no context entry of ``layer`` (cached)."""
        empty = self._empty.get(layer)
        if empty is None:
            empty = self._empty[layer] = ~self.keep[:, layer].transpose(0, 1).any(-1, keepdim=True)
        return empty

    def context_index(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The kept positions of every (KV head, cell) of ``layer``, as (offsets, index) (cached)."""
        index = self._index.get(layer)
        if index is None:
            index = self._index[layer] = kept_index(self.keep[:, layer].transpose(0, 1))
        return index

    def select(self, rows: torch.Tensor) -> None:
        """Keep only the cells ``rows`` (ascending: the ones still decoding), their cached masks included. Each layer's
        cached tensors are replaced one layer at a time, so the old and new caches are never both held whole."""
        cached: list[dict[int, torch.Tensor]] = [{}, {}]
        for old, new in zip((self._bias, self._empty), cached, strict=True):
            for layer in list(old):
                new[layer] = old.pop(layer).index_select(1, rows)
        heads, ascending = self.keep.shape[2], bool((rows[1:] > rows[:-1]).all())
        index: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        for layer in list(self._index) if ascending else []:
            index[layer] = select_index(*self._index.pop(layer), heads, rows)
        self.keep = self.keep.index_select(0, rows)
        self._bias, self._empty, self._index = *cached, index
        if self.suffix_keep is not None:
            self.suffix_keep = self.suffix_keep.index_select(0, rows)

    @contextlib.contextmanager
    def rows_of(self, rows: torch.Tensor) -> Iterator[None]:
        """Within the block, row i of a forward is cell ``rows[i]`` (cells may repeat) and nothing is captured;
        afterwards ``keep``, ``on_probs``, ``on_masses`` and the cached masks are as before."""
        saved = self.keep, self.on_probs, self.on_masses, self._bias, self._empty, self._index
        self.keep, self.on_probs, self.on_masses = self.keep.index_select(0, rows), None, None
        try:
            yield
        finally:
            self.keep, self.on_probs, self.on_masses = saved[:3]
            super().__setattr__("_bias", saved[3])  # (replacing keep emptied the caches)
            super().__setattr__("_empty", saved[4])
            super().__setattr__("_index", saved[5])

    def captured(self, q: int) -> range:
        """The query indices of a forward of ``q`` queries whose attention rows ``on_probs`` (or masses ``on_masses``)
        receives."""
        if self.on_probs is None and self.on_masses is None:
            return range(0)
        return range(q) if self.capture_query is None else range(self.capture_query % q, self.capture_query % q + 1)
