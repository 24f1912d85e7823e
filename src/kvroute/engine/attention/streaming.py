"""Masked attention over the shared context in chunks (online softmax), and its memory planner.

The masked attention function (:mod:`kvroute.engine.attention`) computes, for the B cells of a decoding
batch, ``softmax([q·K_ctxᵀ masked by each cell's keep mask, q·K_sufᵀ causal]) · [V_ctx; V_suf]``. Done at
once it materialises float32 scores and probabilities ``[Hkv, B, G·q, T + s]`` per layer: O(B·H·q·T)
transient memory, ~13 GB for the scores alone for an 8B model (32 query heads) at 32k tokens, 64 cells
and a 50-token question. :func:`chunked_context_attention` gives the same result chunk by chunk of the
context with a running maximum and sum (the online softmax of FlashAttention), so the transient memory
is O(B·H·q·chunk); the one probability row per cell that the metrics capture is computed on its own
(:func:`probability_rows`, B·H·(T + s) floats).

:func:`context_chunk` is the planner: ``None`` (the whole context at once) whenever the one-shot
tensors fit the budget, else the largest chunk that does. (Forwards with many queries per cell attend
the kept entries only, :mod:`kvroute.engine.attention.gather`, and chunk only where even that would not fit.)
Results agree with the one-shot function to float32 rounding (tests/unit/test_streaming.py); the
order of the sums differs, so a near-tie between two next tokens could in principle resolve
differently: the planner chunks only where the one-shot form would not fit.

On a CPU, where PyTorch has its fused attention kernel (``_scaled_dot_product_flash_attention_for_cpu``,
which returns each row's log-sum-exp), the one-shot form of a forward that captures nothing and each slice
of the gathered form run the context part through it (:func:`fused_context`: no score or probability
tensor is materialised) and join the cells' own suffix afterwards (:func:`with_suffix`), again equal to
float32 rounding (tests/unit/test_streaming.py; ``KVROUTE_FUSED_ATTENTION=0`` turns it off). The operator is private to
PyTorch: it is reached only through :func:`kvroute.engine.private_ops.flash_attention_cpu`.
``benchmarks/attention_kernels.py`` times both side by side.
"""

from __future__ import annotations

import os

import torch

from kvroute.engine.private_ops import flash_attention_cpu

#: float32 tensors of the one-shot form alive at once, per (row, key): scores, masked scores, probabilities
ONE_SHOT_COPIES = 3
#: the smallest chunk worth its loop
MIN_CHUNK = 64
#: the share of the free memory the masked attention's transient tensors may take by default
ATTENTION_SHARE = 0.25


def keep_bias(keep: torch.Tensor, scores: torch.dtype) -> torch.Tensor:
    """``keep`` bool → an additive mask of the same shape: 0 where kept, −inf where masked, in two bytes (float16
    for float16 scores, else bfloat16: both hold 0 and −inf exactly). Adding it to fresh scores of dtype
    ``scores`` gives exactly what ``masked_fill(~keep, −inf)`` does, and on a CPU the add runs 10–20 times faster
    than a masked fill broadcast over a KV group's query rows (the masked attention keeps it per layer for a batch,
    :meth:`kvroute.engine.attention.MaskedContext.context_bias`)."""
    dtype = torch.float16 if scores == torch.float16 else torch.bfloat16
    return torch.zeros(keep.shape, dtype=dtype, device=keep.device).masked_fill_(~keep, float("-inf"))


def suffix_causal(q: int, G: int, s: int, device: torch.device) -> torch.Tensor:
    """bool ``[G·q, s]``: True where a query row (the last ``q`` of ``s`` suffix positions, rows in (g, i)
    order for the G query heads of a KV group) may not see a suffix key (it lies after the row's own position)."""
    qpos = torch.arange(q, device=device).repeat(G) + (s - q)  # suffix index of each row
    return torch.arange(s, device=device)[None, :] > qpos[:, None]


def suffix_scores(qg: torch.Tensor, key: torch.Tensor, q: int, scale: float,
                   own: torch.Tensor | None = None) -> torch.Tensor:
    """Causal scores of the cells' own suffix tokens, ``[Hkv, B, G·q, s]`` float32 (rows in (g, i) order);
    ``own`` bool ``[B, s]``: the suffix slots each cell may see (None: all)."""
    s_suf = torch.matmul(qg, key.transpose(2, 3)).transpose(0, 1).float() * scale  # [Hkv, B, G·q, s]
    s_suf = s_suf.masked_fill(suffix_causal(q, qg.shape[2] // q, key.shape[2], qg.device), float("-inf"))
    return s_suf if own is None else s_suf.masked_fill(~own[None, :, None, :], float("-inf"))


#: the fused kernel is used where this PyTorch has it (:func:`kvroute.engine.private_ops.flash_attention_cpu`); a
#: switch for the tests and benchmarks that time the explicit forms beside it (``KVROUTE_FUSED_ATTENTION=0`` is read
#: when a decode's backend is resolved, :func:`kvroute.engine.attention.backend.resolve_backend`)
FUSED = True


def fused_available(query: torch.Tensor) -> bool:
    """Whether :func:`fused_context` runs for ``query``: on a CPU, float32 or bfloat16, with the kernel present."""
    return (FUSED and query.device.type == "cpu" and query.dtype in (torch.float32, torch.bfloat16)
            and flash_attention_cpu() is not None)


def fused_context(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None, *,
                  scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of ``query`` ``[N, Hkv, R, D]`` over ``key``/``value`` ``[N, Hkv, W, D]`` (strides free: a shared
    context may be expanded over N) with the additive ``mask`` (0 or −inf, in the query's dtype, broadcastable to
    ``[N, Hkv, R, W]``; None: every key) in one fused kernel that never materialises the scores: the output
    ``[N, Hkv, R, D]`` and each row's float32 log-sum-exp ``[N, Hkv, R]`` (both 0 where the mask leaves no key:
    :func:`with_suffix` must be told those rows), for :func:`with_suffix` to join the cells' suffix part. Check
    :func:`fused_available` first."""
    flash = flash_attention_cpu()
    assert flash is not None
    return flash(query, key, value, attn_mask=mask, scale=scale)


def with_suffix(out: torch.Tensor, lse: torch.Tensor, empty: torch.Tensor, s_suf: torch.Tensor, v_suf: torch.Tensor,
                dtype: torch.dtype) -> torch.Tensor:
    """The softmax over [context; suffix] from its two parts (:func:`joined`), its output alone."""
    return joined(out, lse, empty, s_suf, v_suf, dtype)[0]


def joined(out: torch.Tensor, lse: torch.Tensor, empty: torch.Tensor, s_suf: torch.Tensor, v_suf: torch.Tensor,
           dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """The softmax over [context; suffix] from its two parts: the context part as :func:`fused_context` gives it
    (``out`` ``[Hkv, B, R, D]``, ``lse`` ``[Hkv, B, R]``), the suffix part as float32 scores ``s_suf``
    ``[Hkv, B, R, s]`` (:func:`suffix_scores`) with values ``v_suf`` ``[Hkv, B, s, D]``. ``empty`` bool
    ``[Hkv, B, 1]``: the (KV head, cell) pairs that keep no context entry, whose context part weighs 0 (the kernel
    reports 0 for their output and their log-sum-exp alike, so they are named, not read from ``lse``). Every row
    sees its own suffix position, so the joint maximum is finite. Returns the output ``[Hkv, B, R, D]`` in ``dtype``
    and the joint log-sum-exp ``[Hkv, B, R]`` float32."""
    lse = lse.masked_fill(empty, float("-inf"))
    m = torch.maximum(lse, s_suf.amax(-1))  # [Hkv, B, R]
    wc = torch.exp(lse - m)  # the context part's share of the normaliser (0 where nothing is kept)
    es = torch.exp(s_suf - m.unsqueeze(-1))
    total = wc + es.sum(-1)
    ctx = out.float()
    joint = ctx * (wc / total).unsqueeze(-1) + torch.matmul(es / total.unsqueeze(-1), v_suf.float())
    return joint.to(dtype), m.float() + torch.log(total.float())


def chunked_context_attention(qg: torch.Tensor, k_ctx: torch.Tensor, v_ctx: torch.Tensor, bias: torch.Tensor,
                              key: torch.Tensor, value: torch.Tensor, *, q: int, scale: float,
                              chunk: int, own: torch.Tensor | None = None) -> torch.Tensor:
    """The masked attention output ``[Hkv, B, G·q, D]`` (in the query's dtype), ``chunk`` context keys at a time.

    ``qg`` ``[B, Hkv, G·q, D]``: each KV head's query rows, (g, i) order; ``k_ctx``/``v_ctx`` ``[Hkv, T, D]``:
    the shared context; ``bias`` ``[Hkv, B, 1, T]``: 0 where a cell keeps an entry, −inf where not (:func:`keep_bias`);
    ``key``/``value`` ``[B, Hkv, s, D]``: the cells' own
    suffix, whose last ``q`` positions are the queries'; ``own`` bool ``[B, s]``: the suffix slots each cell may
    see (None: all). Every row sees at least its own suffix position, so
    the running maximum starts finite from the suffix part, and a cell that keeps no context entry is fine.
    """
    B, Hkv, R, D = qg.shape
    T = k_ctx.shape[1]
    s_suf = suffix_scores(qg, key, q, scale, own)  # [Hkv, B, R, s]
    m = s_suf.amax(-1, keepdim=True)  # [Hkv, B, R, 1] running maximum
    e = torch.exp(s_suf - m)
    total = e.sum(-1, keepdim=True)  # running sum of exp
    acc = torch.matmul(e, value.transpose(0, 1).float())  # [Hkv, B, R, D] running output, float32
    q_rows = qg.transpose(0, 1).reshape(Hkv, B * R, D)  # cells folded into rows: one bmm per KV head
    for a in range(0, T, chunk):
        b = min(T, a + chunk)
        sc = torch.bmm(q_rows, k_ctx[:, a:b].transpose(1, 2)).view(Hkv, B, R, b - a).float() * scale
        sc.add_(bias[..., a:b])
        m_new = torch.maximum(m, sc.amax(-1, keepdim=True))
        fix = torch.exp(m - m_new)
        e = torch.exp(sc - m_new)
        total = total * fix + e.sum(-1, keepdim=True)
        acc = acc * fix + torch.bmm(e.reshape(Hkv, B * R, b - a), v_ctx[:, a:b].float()).view(Hkv, B, R, D)
        m = m_new
    return (acc / total).to(qg.dtype)


def row_scores(qg: torch.Tensor, k_ctx: torch.Tensor, bias: torch.Tensor, key: torch.Tensor, *, q: int, index: int,
               scale: float, own: torch.Tensor | None = None, positions: torch.Tensor | None = None) -> torch.Tensor:
    """The masked scores of query ``index`` (of the ``q``) of every cell and query head, ``[Hkv, B, G, P]`` in the
    query's dtype: over all ``T + s`` keys (context, then the cells' own suffix), or at ``positions`` only (int64
    ``[P]`` into those ``T + s``), −inf where the key is masked (not kept, after the query, or a suffix slot ``own``
    leaves out). ``bias``: the cells' additive keep mask ``[Hkv, B, 1, T]`` (:func:`keep_bias`)."""
    B, Hkv, R, D = qg.shape
    G, T, s = R // q, k_ctx.shape[1], key.shape[2]
    qi = qg[:, :, index::q]  # [B, Hkv, G, D]: query ``index`` of each head of the group
    visible = torch.arange(s, device=qg.device) <= s - q + index  # [s]: the suffix keys the query may see (causal)
    if positions is None:
        sc = torch.bmm(qi.transpose(0, 1).reshape(Hkv, B * G, D), k_ctx.transpose(1, 2)).view(Hkv, B, G, T) * scale
        sc.add_(bias)
        ss = torch.matmul(qi, key.transpose(2, 3)).transpose(0, 1) * scale  # [Hkv, B, G, s]
        ss = ss.masked_fill(~visible, float("-inf"))
        if own is not None:
            ss = ss.masked_fill(~own[None, :, None, :], float("-inf"))
        return torch.cat([sc, ss], dim=-1)
    # only the keys at ``positions``: context ones from the shared keys, suffix ones from each cell's own
    in_ctx = positions < T
    at_ctx, at_suf = positions[in_ctx], positions[~in_ctx] - T
    sc = torch.matmul(qi.transpose(0, 1), k_ctx[:, at_ctx].transpose(1, 2)[:, None]) * scale  # [Hkv, B, G, Pc]
    sc.add_(bias[..., at_ctx])
    ss = torch.matmul(qi, key[:, :, at_suf].transpose(2, 3)).transpose(0, 1) * scale  # [Hkv, B, G, Ps]
    hidden = ~visible[at_suf]  # [Ps]
    if own is not None:
        hidden = hidden[None, :] | ~own[:, at_suf]  # [B, Ps]
    ss = ss.masked_fill(hidden[None, :, None, :] if hidden.dim() == 2 else hidden, float("-inf"))
    out = torch.empty(Hkv, B, G, positions.numel(), dtype=sc.dtype, device=qg.device)
    out[..., in_ctx], out[..., ~in_ctx] = sc, ss
    return out


def probability_rows(qg: torch.Tensor, k_ctx: torch.Tensor, bias: torch.Tensor, key: torch.Tensor, *, q: int,
                     index: int, scale: float, own: torch.Tensor | None = None) -> torch.Tensor:
    """The float32 attention probabilities of query ``index`` (of the ``q``) of every cell and query head,
    ``[B, H, T + s]`` (query head = kv·G + g): the rows the metrics capture, without the other queries'. ``bias``:
    the cells' additive keep mask ``[Hkv, B, 1, T]`` (:func:`keep_bias`)."""
    B, Hkv, R, _ = qg.shape
    sc = row_scores(qg, k_ctx, bias, key, q=q, index=index, scale=scale, own=own)  # [Hkv, B, G, T + s]
    probs = torch.softmax(sc, dim=-1, dtype=torch.float32)
    return probs.transpose(0, 1).reshape(B, Hkv * (R // q), sc.shape[-1])


def probability_at(qg: torch.Tensor, k_ctx: torch.Tensor, bias: torch.Tensor, key: torch.Tensor, lse: torch.Tensor,
                   positions: torch.Tensor, *, q: int, index: int, scale: float,
                   own: torch.Tensor | None = None) -> torch.Tensor:
    """The same probabilities as :func:`probability_rows`, at ``positions`` (int64 ``[P]`` into ``T + s``) only,
    ``[B, H, P]``: ``exp(score − lse)`` from the scores there and the rows' log-sum-exp over every key ``lse``
    ``[Hkv, B, G·q]`` (float32, rows in (g, i) order; the joint normaliser a backend with
    :attr:`~kvroute.engine.attention.backend.Backend.lse` returns), so a row's other T + s − P keys are never
    scored again. A masked key's probability is 0."""
    B, Hkv, R, _ = qg.shape
    sc = row_scores(qg, k_ctx, bias, key, q=q, index=index, scale=scale, own=own, positions=positions)
    probs = torch.exp(sc.float() - lse[:, :, index::q, None])  # [Hkv, B, G, P]
    return probs.transpose(0, 1).reshape(B, Hkv * (R // q), positions.numel())


def one_shot_bytes(cells: int, heads: int, queries: int, keys: int) -> int:
    """Transient bytes of the one-shot masked attention of one layer's forward (float32 scores and probabilities)."""
    return ONE_SHOT_COPIES * 4 * cells * heads * queries * keys


def context_chunk(cells: int, heads: int, queries: int, keys: int, budget: int) -> int | None:
    """The context chunk for a forward of ``cells`` × ``heads`` × ``queries`` rows over ``keys`` keys: None (one
    shot) when :func:`one_shot_bytes` fits ``budget``, else the largest chunk that does (at least MIN_CHUNK)."""
    if one_shot_bytes(cells, heads, queries, keys) <= budget:
        return None
    per_key = one_shot_bytes(cells, heads, queries, 1)
    return max(MIN_CHUNK, budget // max(per_key, 1))


def available_memory(device: torch.device) -> int:
    """Free memory where the attention runs: on CUDA the device's free memory plus what PyTorch's allocator holds
    unused; on the CPU the RAM the kernel says is available (free plus reclaimable caches: ``MemAvailable``). Memory
    that glibc holds free while the engine retains it (:mod:`kvroute.heap`) is not counted: a block freed
    there serves only requests that fit in it, so counting it could plan past what the system has."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device))
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):  # not a POSIX system: assume 8 GiB
        return 8 << 30


def attention_budget(device: torch.device, share: float = ATTENTION_SHARE) -> int:
    """The default budget for the masked attention's transient tensors: ``share`` of the free memory."""
    return int(available_memory(device) * share)
