"""Accessibility: can attention still reach the evidence?

- evidence (answer) attention mass: attention from the last prompt token onto T_ev (T_ans), per
  layer and query head, compressed and full cache; also from each generated token;
- direct reachability: some (layer, query head) gives a *kept* evidence token attention above ε;
- routed reachability: the same through the kept tokens that carry evidence content, where a
  token's evidence content at layer ℓ is its share under attention rollout over the prefill
  (Abnar & Zuidema, with the residual: r⁽ℓ⁺¹⁾ = ½ r⁽ℓ⁾ + ½ Ā⁽ℓ⁾ r⁽ℓ⁾, Ā the head-averaged causal
  attention, r⁽⁰⁾ = 1 on evidence tokens). This catches answers that survive through information
  the prefill already copied into other tokens ("leakage") when the evidence itself is evicted.

Rollout spreads any source over every later token, so a raw "carries evidence" rule is true almost
everywhere (the former rule, kept as ``routed_reachable_uncalibrated``). The evidence is therefore
compared with null sources: mutually disjoint shifted copies of the evidence pattern at nearby
document positions (same-count disjoint scattered sets of the other document tokens when the document
has no room for enough copies), rolled out in the same prefill pass. Per layer, two statistics for
every source: the direct attention mass of the last prompt token onto its positions and the routed
read of its rollout share through the surviving entries, both averaged over query heads. Each is
standardised against the other sources, and a cell is routed-reachable when the evidence's largest
standardised statistic beats the null sources' own maxima at the rank-test level ``route_alpha``
(with the default 19 draws: above all of them, p = 1/20 = 0.05; undecided when the document holds
fewer disjoint null sources than that level needs). The former reading pooled over every layer and
head is kept as ``routed_reachable_pooled``.

ε is relative: ``κ / n_visible`` (n_visible = keys the head can see: kept context + suffix), i.e.
κ times what uniform attention would give; κ = 5 by default.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.nn.functional as F

from kvroute.metrics.base import CellContext, Metric, register
from kvroute.models.queries import rotated_queries

#: the smallest difference in attention mass a statistic resolves: float32's epsilon. A head's attention row sums to
#: 1, so a share below it cannot change the attention output in float32
MASS_RESOLUTION = float(torch.finfo(torch.float32).eps)
#: the relative resolution of a statistic: about the rounding of a float32 sum over 10⁴ terms (√n · ε); captured
#: attention summed in another order moves a statistic by less
RELATIVE_RESOLUTION = 1e-5


def resolution(values: torch.Tensor, dim: int = 0) -> torch.Tensor:
    """The resolution of statistics read along ``dim`` (for :func:`max_test`, per column): the larger of
    :data:`MASS_RESOLUTION` and :data:`RELATIVE_RESOLUTION` times their largest magnitude. Sources closer than this
    are tied, and a reference spread below it is no spread the data can tell from rounding."""
    top = values.double().abs().amax(dim)
    return torch.clamp(RELATIVE_RESOLUTION * top, min=MASS_RESOLUTION)


def standardise(diff: torch.Tensor, sd: torch.Tensor, res: torch.Tensor) -> torch.Tensor:
    """z = diff / max(sd, res), and 0 where |diff| ≤ res (a tie at the statistics' resolution). A reference without
    spread beyond ``res`` counts resolution units (at most 2 / RELATIVE_RESOLUTION) instead of dividing by rounding
    noise, which gave z of 10³–10⁶ that moved by percents when the same attention was summed in another order."""
    return torch.where(diff.abs() > res, diff / torch.maximum(sd, res), torch.zeros_like(diff))

if TYPE_CHECKING:
    from kvroute.tasks.instance import TaskInstance
    from kvroute.tasks.prompt import Prompt


def null_position_sets(evidence: Sequence[int], lo: int, hi: int, n: int, rng: random.Random, *,
                       exclude: Iterable[int] = (), window: int = 128) -> list[list[int]]:
    """``n`` null sources for the routed-reachability test: shifted copies of the evidence pattern, disjoint
    from the evidence, from ``exclude`` (e.g. question tokens) and from one another.

    A copy ``{p + s : p in evidence}`` is a candidate when it lies inside ``[lo, hi)`` and touches
    neither the evidence nor ``exclude``. Same count and same shape as the evidence (a sentence stays one
    contiguous span), and position-matched: the copies are packed at random (each candidate in a random
    order, kept when it touches no copy kept before) from the shifts with ``|s| ≤ W``, half of them before
    the evidence and half after it where both sides have room (the rollout statistic trends with position:
    earlier sources reach more tokens, so a one-sided null would be biased); W starts at ``window`` and
    doubles until the packing holds ``n`` copies or covers the range. Mutually disjoint sources are what
    makes the evidence exchangeable with them (the evidence shares no position with any null, so no null
    may share one with another). Fewer than ``n`` sets when the range has no room for more.
    """
    ev = np.array(sorted(set(evidence)), dtype=np.int64)
    if not len(ev) or n <= 0 or hi <= lo:
        return []
    banned = np.zeros(hi - lo, dtype=bool)
    for p in itertools.chain(ev.tolist(), exclude):
        if lo <= p < hi:
            banned[p - lo] = True
    shifts = np.arange(lo - ev[0], hi - ev[-1], dtype=np.int64)
    shifts = shifts[shifts != 0]
    if not len(shifts):
        return []
    cand = shifts[~banned[(ev[None, :] + shifts[:, None]) - lo].any(axis=1)]
    if not len(cand):
        return []
    reach = int(np.abs(cand).max())
    w = max(1, window)
    while True:
        before = [int(s) for s in cand if -w <= s < 0]
        after = [int(s) for s in cand if 0 < s <= w]
        rng.shuffle(before)
        rng.shuffle(after)
        used = banned.copy()
        chosen = _pack(ev - lo, before, n // 2, used)
        chosen += _pack(ev - lo, after, n - len(chosen), used)
        chosen += _pack(ev - lo, before, n - len(chosen), used)  # the after side ran short: more before
        if len(chosen) >= n or w >= reach:
            return [(ev + s).tolist() for s in sorted(chosen)]
        w *= 2


def _pack(pattern: np.ndarray, shifts: list[int], limit: int, used: np.ndarray) -> list[int]:
    """Up to ``limit`` of ``shifts``, in their order, whose copy of ``pattern`` touches no ``used`` entry
    (each kept copy marks its entries used)."""
    kept: list[int] = []
    for s in shifts:
        if len(kept) >= limit:
            break
        idx = pattern + s
        if not used[idx].any():
            used[idx] = True
            kept.append(s)
    return kept


def scattered_position_sets(evidence: Sequence[int], lo: int, hi: int, n: int, rng: random.Random, *,
                            exclude: Iterable[int] = ()) -> list[list[int]]:
    """Up to ``n`` mutually disjoint null sources of the evidence's count drawn uniformly from the tokens of
    ``[lo, hi)`` outside the evidence and ``exclude``: the fallback when the range cannot hold shifted
    copies. Count-matched, not shape-matched; as many sets as the remaining tokens hold (none when fewer
    than the evidence's count remain)."""
    k = len(set(evidence))
    banned = set(evidence) | set(exclude)
    pool = [p for p in range(lo, hi) if p not in banned]
    m = min(n, len(pool) // k) if k else 0
    if m <= 0:
        return []
    drawn = rng.sample(pool, m * k)
    return [sorted(drawn[i * k:(i + 1) * k]) for i in range(m)]


def document_range(tokenizer: Any, prompt: Prompt, instance: TaskInstance) -> tuple[int, int]:
    """Context tokens ``[lo, hi)`` that overlap the instance's document text (not the chat template or
    the instruction before it, not an in-context question after it)."""
    enc = tokenizer(prompt.context_text, add_special_tokens=False, return_offsets_mapping=True)
    c0 = prompt.context_char_offset
    c1 = c0 + len(instance.context)
    inside = [i for i, (s, e) in enumerate(enc["offset_mapping"]) if e > s and s < c1 and e > c0]
    inside = [i for i in inside if i < prompt.n_context]
    return (inside[0], inside[-1] + 1) if inside else (0, prompt.n_context)


class EvidenceRollout:
    """Prefill capture: evidence share ``r[ℓ, t]`` of every context token's input to layer ℓ, and the
    same share from each null source (``nulls``: position sets of the evidence's size elsewhere in the
    context), computed in the same pass: ``r`` is a ``[T, 1 + n_null]`` matrix of source indicators.

    Memory is linear in T: the head-averaged attention is applied to r as the values of a fused
    attention call, never materialising the T×T map; the queries are the ones the model computed in
    the prefill (handed over by the prefill's ``q_proj`` hook). Up to ``head_dim`` sources share one
    call (they fill value columns that would otherwise be zero padding), so the null costs nothing
    extra for ``n_null < head_dim``.
    """

    def __init__(self, evidence: Sequence[int], num_tokens: int, nulls: Sequence[Sequence[int]] = ()) -> None:
        self.nulls = [list(s) for s in nulls]
        self.r = torch.zeros(num_tokens, 1 + len(self.nulls))
        if evidence:
            self.r[list(evidence), 0] = 1.0
        for j, s in enumerate(self.nulls, start=1):
            if s:
                self.r[s, j] = 1.0
        self.rows: list[torch.Tensor] = []

    @classmethod
    def for_prompt(cls, prompt: Prompt, evidence: Sequence[int], *, settings: Any, seed: Any = 0,
                   doc_range: tuple[int, int] | None = None) -> EvidenceRollout:
        """The rollout of ``evidence`` plus ``settings.route_null`` null sources drawn for this prompt
        from the document's tokens ``doc_range`` (default: the context after the first ``n_sink``
        positions; the in-context question is always excluded), seeded by (instance id, ``seed``) so
        every cell and rerun of the instance sees the same null.

        Template and instruction tokens are never null sources: their rollout contributions are
        10–100× a document token's (secondary sinks), so one of them would dominate the null. A document
        with no room for ``route_null`` disjoint shifted copies draws disjoint same-count *scattered* sets
        of its other tokens instead (:func:`scattered_position_sets`) when those are more; either way the
        sources are disjoint, so a short document (a 3-sentence passage whose evidence is one sentence
        holds one or two) gets too few draws and the layer-max test reads undecided there."""
        T = prompt.n_context
        lo, hi = doc_range if doc_range is not None else (min(settings.n_sink, T), T)
        lo = max(lo, min(settings.n_sink, T))
        question = [p for p in prompt.question_positions if p < T]
        rng = random.Random(f"{prompt.instance_id}|{seed}|route-null")
        nulls = null_position_sets(evidence, lo, hi, settings.route_null, rng, exclude=question,
                                   window=settings.route_null_window)
        if len(nulls) < settings.route_null:
            scattered = scattered_position_sets(evidence, lo, hi, settings.route_null, rng, exclude=question)
            nulls = scattered if len(scattered) > len(nulls) else nulls
        return cls(evidence, T, nulls)

    def on_layer(self, layer_idx: int, module: Any, hidden_states: torch.Tensor, keys: torch.Tensor,
                 values: torch.Tensor, kwargs: dict[str, Any], queries: torch.Tensor | None = None) -> None:
        r = self.r.to(keys.device)  # [T, S]
        self.rows.append(r.cpu().clone())  # shares in the input of layer `layer_idx`
        T = hidden_states.shape[1]
        q = queries if queries is not None else rotated_queries(module, hidden_states, kwargs["position_embeddings"])
        H, Hkv = q.shape[1], keys.shape[1]
        # Ā r with Ā the head-averaged causal attention: attention whose values are r, averaged over heads.
        # The sources sit in the first columns of values as wide as the queries: with a narrower value
        # head the CPU kernel falls back to the math path and materialises the T×T map (10x slower and
        # quadratic memory at 4k); more sources than head_dim take several calls
        D, S = q.shape[-1], r.shape[1]
        qf, kf = q.float(), keys.float()
        out = torch.empty(T, S, dtype=torch.float32, device=keys.device)
        for c0 in range(0, S, D):
            c1 = min(S, c0 + D)
            v = torch.zeros(1, Hkv, T, D, dtype=torch.float32, device=keys.device)
            v[..., : c1 - c0] = r[:, c0:c1].float()
            mixed = F.scaled_dot_product_attention(qf, kf, v, is_causal=True, scale=module.scaling,
                                                   enable_gqa=H != Hkv)  # [1, H, T, D]
            out[:, c0:c1] = mixed[0, :, :, : c1 - c0].mean(dim=0)
        self.r = (0.5 * r.float() + 0.5 * out).cpu()

    def shares(self) -> torch.Tensor:
        """``[L, T]``: evidence share of each token's input to each layer."""
        return torch.stack([row[:, 0] for row in self.rows])

    def null_shares(self) -> torch.Tensor | None:
        """``[L, T, n_null]``: the same share from each null source (None without null sources)."""
        if not self.nulls:
            return None
        return torch.stack([row[:, 1:] for row in self.rows])


def visible_threshold(ctx: CellContext) -> torch.Tensor:
    """ε per (layer, query head) ``[L, H]``: κ / (kept context entries of the head's KV head + suffix keys)."""
    kept = ctx.mask.kept_per_head.repeat_interleave(ctx.group_size, dim=1)  # [L, H]
    suffix = ctx.output.last_attention.shape[-1] - ctx.T  # question tokens visible to the last prompt token
    return ctx.settings.reach_kappa / (kept + suffix).clamp(min=1).float()


def mass(attn_row: torch.Tensor, positions: list[int]) -> torch.Tensor:
    """``[L, H]`` attention mass onto ``positions`` from rows ``[L, H, K]``."""
    if not positions:
        return torch.zeros(attn_row.shape[:2])
    return attn_row[..., positions].sum(-1)


@register
class Accessibility(Metric):
    name = "accessibility"
    needs = frozenset({"attention"})
    fields = ("evidence_attention_mass", "evidence_attention_mass_full", "answer_attention_mass",
              "answer_attention_mass_full", "evidence_mass_layer", "evidence_mass_layer_full", "reachable",
              "generated_evidence_mass")

    def compute(self, ctx: CellContext) -> dict[str, Any]:
        ev = ctx.context_positions(ctx.prompt.evidence_positions)
        ans = ctx.context_positions(ctx.prompt.answer_positions)
        a, f = ctx.output.last_attention, ctx.full.last_attention  # [L, H, T+Q]
        if not ev:
            return {k: None for k in self.fields}
        m_ev, f_ev = mass(a, ev), mass(f, ev)  # [L, H]
        eps = visible_threshold(ctx)  # [L, H]
        # reachable through a compressed layer (a layer left whole reaches the evidence as the full cache does)
        reach = bool((ctx.compressed(a)[..., ev].max(-1).values > ctx.compressed(eps).to(a.device)).any())
        gen = ctx.output.generated_mass.get("evidence")
        return {
            "evidence_attention_mass": float(m_ev.mean()),
            "evidence_attention_mass_full": float(f_ev.mean()),
            "answer_attention_mass": float(mass(a, ans).mean()) if ans else None,
            "answer_attention_mass_full": float(mass(f, ans).mean()) if ans else None,
            "evidence_mass_layer": m_ev.mean(1).tolist(),
            "evidence_mass_layer_full": f_ev.mean(1).tolist(),
            "reachable": reach,
            "generated_evidence_mass": float(gen.mean()) if gen is not None and gen.numel() else None,
        }


def null_test(m_ev: float, m_null: torch.Tensor, alpha: float) -> dict[str, Any]:
    """Calibrate the evidence statistic against its null draws (a one-sided rank test).

    p = (1 + #{null ≥ evidence}) / (1 + n): the exact permutation p-value if the evidence were just
    another position set drawn like the null ones (ties count against the evidence). Reachable iff
    p ≤ α; undecided (None) when n is too small for any p to reach α."""
    n = int(m_null.numel())
    if n == 0:
        return {"routed_null_mass": None, "routed_null_q95": None, "routed_z": None, "routed_p": None,
                "routed_reachable": None, "routed_null_draws": 0}
    mu = float(m_null.mean())
    sd = float(m_null.std()) if n > 1 else 0.0
    p = (1 + int((m_null >= m_ev).sum())) / (1 + n)
    res = resolution(torch.cat([m_null.double().flatten(), torch.tensor([m_ev], dtype=torch.float64)]))
    z = float(standardise(torch.tensor(m_ev - mu, dtype=torch.float64), torch.tensor(sd, dtype=torch.float64), res))
    return {
        "routed_null_mass": mu,
        "routed_null_q95": float(torch.quantile(m_null.double(), 0.95)),
        "routed_z": z if n > 1 else None,
        "routed_p": p,
        "routed_reachable": bool(p <= alpha) if 1 / (1 + n) <= alpha else None,
        "routed_null_draws": n,
    }


def layer_statistics(attn: torch.Tensor, shares: torch.Tensor) -> torch.Tensor:
    """``[S, 2L]`` per source: the direct mass (attention onto the source's own positions) of each layer,
    then its routed read (``Σ_t a[ℓ, h, t] · share[ℓ, t]``), both averaged over query heads.

    ``attn`` ``[L, H, T]`` (evicted entries exactly 0); ``shares`` ``[L, T, S]`` (the rollout shares of
    every source; layer 0's input is the source's indicator, so its positions)."""
    H = attn.shape[1]
    a, sh = attn.float(), shares.float().to(attn.device)
    direct = torch.einsum("lht,ts->sl", a, sh[0]) / H
    routed = torch.einsum("lht,lts->sl", a, sh) / H
    return torch.cat([direct, routed], dim=1).cpu()


def max_test(stats: torch.Tensor, alpha: float, overlap: torch.Tensor | None = None) -> dict[str, Any]:
    """The calibrated layer-max test. ``stats`` ``[1 + n, K]``: row 0 the evidence, then the null sources.

    Every source's statistics are standardised per column against the *other* sources (leave one out:
    z = (x − mean) / sd over the other n sources; sources that share a position with it, per ``overlap``
    ``[1 + n, 1 + n]`` bool, are left out of its reference too — none do when the nulls come from
    :func:`null_position_sets`, which keeps them disjoint) and reduced to their maximum over the K
    columns. The evidence and each null are treated alike, so if the evidence were just another draw like
    the nulls its rank among the 1 + n maxima would be uniform: p = (1 + #{null max ≥ evidence max}) /
    (1 + n) is then an exact rank-test p-value (ties count against the evidence). Reachable iff p ≤ α,
    undecided (None) when n is too small for any p to reach α. Differences and spreads are read at the column's
    :func:`resolution` (:func:`standardise`): a source within it of its reference mean gets z = 0, and a column in
    which the reference sources read the same value to that resolution counts resolution units, so z stays
    reproducible when the same attention is summed in another order. Returns the evidence's max z, the column that
    gave it (None unless z > 0: where the evidence reads above its nulls nowhere, no column is named — at z = 0 it
    ties in every column within the resolution) and the p-value."""
    S = stats.shape[0]
    n = S - 1
    none = {"routed_reachable": None, "routed_p": None, "routed_z": None, "routed_column": None,
            "routed_null_draws": max(n, 0)}
    if n < 2:
        return none
    x = stats.double()
    ref = ~(overlap.bool() if overlap is not None else torch.zeros(S, S, dtype=torch.bool))
    ref.fill_diagonal_(False)
    w = ref.double()
    cnt = w.sum(1, keepdim=True)  # [S, 1]
    if bool((cnt < 2).any()):
        return none
    mean = (w @ x) / cnt
    var = ((w @ (x * x)) - cnt * mean * mean) / (cnt - 1)
    sd = var.clamp(min=0).sqrt()
    z = standardise(x - mean, sd, resolution(x).unsqueeze(0))
    mx, arg = z.max(dim=1)
    p = (1 + int((mx[1:] >= mx[0]).sum())) / (1 + n)
    return {"routed_reachable": bool(p <= alpha) if 1 / (1 + n) <= alpha else None, "routed_p": p,
            "routed_z": float(mx[0]), "routed_column": int(arg[0]) if float(mx[0]) > 0 else None,
            "routed_null_draws": n}


@register
class RoutedReachability(Metric):
    """Routed reachability, calibrated: can the last prompt token reach the evidence — directly or through
    the kept tokens that copied it — more than it reaches any other same-shape span of the document?

    Per layer, two statistics for the evidence and for each of ``route_null`` null sources (mutually
    disjoint shifted copies of the evidence pattern, see :func:`null_position_sets`) under the same mask
    and attention:
    the direct mass onto the source's positions and the routed read ``Σ_t a[ℓ, h, t] · r[ℓ, t]`` (r the
    rollout share; evicted entries have a = 0), both averaged over query heads. ``routed_reachable``
    is the layer-max test of :func:`max_test` at level ``route_alpha``: the evidence's largest
    standardised statistic over the 2L (layer, kind) columns beats the nulls' own maxima. The layer
    and the kind that gave it are ``routed_layer`` (1 … L) and ``routed_kind`` (``direct`` |
    ``rollout``). A reading pooled over every layer and head, as before, is kept as
    ``routed_reachable_pooled`` (``routed_p_pooled``, ``routed_z_pooled``, ``routed_evidence_mass``,
    ``routed_null_mass``, ``routed_null_q95``): most heads never look at the evidence, so the pooled
    mean is insensitive at the full cache (Qwen2.5-0.5B, which answers 75% of the mask-control items,
    read 0.00 there). Both tests need ``ceil(1 / route_alpha) − 1`` null sources (19 at 0.05) and read
    undecided (None) in a document too short to hold that many disjoint copies of the evidence (a
    3-sentence passage whose evidence is one sentence). ``routed_reachable_uncalibrated`` keeps the first rule
    (some head attends above ε a kept token whose share is ≥ τ · the best evidence token's), which is true
    almost everywhere.
    """

    name = "routes"
    needs = frozenset({"attention", "routes"})
    fields = ("routed_reachable", "routed_p", "routed_z", "routed_layer", "routed_kind", "routed_null_draws",
              "routed_reachable_pooled", "routed_p_pooled", "routed_z_pooled", "routed_evidence_mass",
              "routed_null_mass", "routed_null_q95", "routed_reachable_uncalibrated")

    def compute(self, ctx: CellContext) -> dict[str, Any]:
        ev = ctx.context_positions(ctx.prompt.evidence_positions)
        if not ev or ctx.evidence_share is None:
            return {k: None for k in self.fields}
        T = ctx.T
        share = ctx.evidence_share  # [L, T]
        a = ctx.output.last_attention[..., :T]  # [L, H, T]; evicted entries have exactly 0
        L = a.shape[0]
        best = share[:, ev].max(dim=1, keepdim=True).values.clamp(min=1e-12)  # [L, 1]
        carries = share >= ctx.settings.route_tau * best  # [L, T]
        eps = visible_threshold(ctx)  # [L, H]
        hit = (a > eps.to(a.device)[..., None]) & carries.to(a.device)[:, None, :]  # [L, H, T]
        null = ctx.null_share
        if null is not None and null.shape[-1] > 0:
            sources = torch.cat([share[..., None].to(null.dtype), null], dim=-1)
        else:
            sources = share[..., None]
        stats = layer_statistics(a, sources)  # [S, 2L]
        # read over the compressed layers only (all L unless the press leaves some whole, as Gemma 3's sliding
        # layers): a layer left whole reaches the evidence as the full cache does. From here L is their number
        depth = ctx.layers or list(range(L))  # the model's index of each layer read
        stats = stats[:, depth + [L + i for i in depth]]  # [S, 2L']
        hit, L = ctx.compressed(hit), len(depth)
        # the pooled statistic (the routed read over every layer and head) is the mean of the per-layer reads
        pooled_mass = stats[:, L:].double().mean(dim=1)
        m_ev = float(pooled_mass[0])
        pooled = null_test(m_ev, pooled_mass[1:], ctx.settings.route_alpha)
        ind = (sources[0] > 0).float()  # [T, S]: layer 0's input is each source's indicator
        test = max_test(stats, ctx.settings.route_alpha, overlap=(ind.T @ ind) > 0)
        col = test.pop("routed_column")
        return {**test, "routed_layer": None if col is None else depth[col % L] + 1,
                "routed_kind": None if col is None else ("direct" if col < L else "rollout"),
                "routed_reachable_pooled": pooled["routed_reachable"], "routed_p_pooled": pooled["routed_p"],
                "routed_z_pooled": pooled["routed_z"], "routed_evidence_mass": m_ev,
                "routed_null_mass": pooled["routed_null_mass"], "routed_null_q95": pooled["routed_null_q95"],
                "routed_reachable_uncalibrated": bool(hit.any())}
