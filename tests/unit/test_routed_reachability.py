"""Routed reachability calibrated against a null (issue 14, item 8), on planted attention.

The rollout spreads any source over every later token, so "some kept token carries evidence" is
true almost everywhere. These tests plant the truth in hand-built attention maps: a real route
(tokens that copy the evidence and are read by the query) must be found; diffusion alone (the
former rule says true) must not; with no signal at all, the false-positive rate over random plants
must stay near the test's level.
"""

import random
from dataclasses import dataclass, field

import pytest
import torch

from kvroute.metrics.accessibility import (
    MASS_RESOLUTION,
    RELATIVE_RESOLUTION,
    EvidenceRollout,
    RoutedReachability,
    document_range,
    layer_statistics,
    max_test,
    null_position_sets,
    null_test,
)
from kvroute.metrics.base import CellContext, MetricSettings
from kvroute.presses import KeepMask

N_SINK = 4


class _Attn(torch.nn.Module):
    """Stands in for a model's attention module: the rollout reads only ``scaling`` from it."""

    def __init__(self, scaling: float = 1.0) -> None:
        super().__init__()
        self.scaling = scaling


def _planted_rollout(attn_layers, evidence, nulls=()):
    """Run EvidenceRollout on planted causal attention maps ``[L][H, T, T]`` (rows sum to 1).

    With one-hot keys (head_dim = T) and queries = log A, softmax(q·k) = A exactly.
    """
    T = attn_layers[0].shape[-1]
    roll = EvidenceRollout(evidence, T, nulls)
    keys = torch.eye(T)[None, None]  # [1, 1, T, T]
    for layer, A in enumerate(attn_layers):
        q = torch.log(A.clamp(min=1e-30))[None]  # [1, H, T, T]
        roll.on_layer(layer, _Attn(), torch.zeros(1, T, T), keys, keys, {}, queries=q)
    return roll


def _uniform_causal(T: int, H: int) -> torch.Tensor:
    A = torch.tril(torch.ones(T, T))
    return (A / A.sum(-1, keepdim=True)).expand(H, T, T).clone()


@dataclass
class _Prompt:
    n_context: int
    evidence_positions: list[int]
    answer_positions: list[int]
    question_positions: list[int] = field(default_factory=list)
    instance_id: str = "planted"


@dataclass
class _Out:
    last_attention: torch.Tensor
    generated_mass: dict = field(default_factory=dict)


def _routes(roll, evidence, mask, last, **settings):
    T = mask.shape[-1]
    ctx = CellContext(instance=None, prompt=_Prompt(T, list(evidence), list(evidence)), mask=KeepMask(mask),
                      output=_Out(last), full=_Out(last), group_size=last.shape[1] // mask.shape[1],
                      settings=MetricSettings(**settings), evidence_share=roll.shares(),
                      null_share=roll.null_shares())
    return RoutedReachability().compute(ctx)


def _nulls(evidence, T, seed=0, n=19, lo=N_SINK):
    return null_position_sets(evidence, lo, T, n, random.Random(seed))


def _last_row(mask, weights, Q=2):
    """Last-prompt-token attention ``[L, H, T+Q]``: ``weights`` ``[T]`` restricted to kept entries, renormalised
    (with the question suffix taking a fixed share), evicted entries exactly 0 — as the engine gives them."""
    L, Hkv, T = mask.shape
    a = weights.expand(L, Hkv, T) * mask.float()
    a = 0.8 * a / a.sum(-1, keepdim=True).clamp(min=1e-30)
    return torch.cat([a, torch.full((L, Hkv, Q), 0.2 / Q)], dim=-1)


def test_a_real_route_through_copying_tokens_is_found_although_the_evidence_is_evicted():
    """Tokens 170-173 copy the evidence (20-23) in every layer; the query reads them. GER = 1, yet routed.
    (The copies lie outside the null's ±128-token window: a null drawn on them would carry their content too.)"""
    T, L, H = 200, 3, 2
    ev, copies = [20, 21, 22, 23], [170, 171, 172, 173]
    layers = []
    for _ in range(L):
        A = _uniform_causal(T, H)
        for c in copies:
            A[:, c] = 0.1 * A[:, c]
            A[:, c, ev] += 0.9 / len(ev)
        layers.append(A)
    roll = _planted_rollout(layers, ev, _nulls(ev, T))
    mask = torch.ones(L, 1, T, dtype=torch.bool)
    mask[:, :, ev] = False
    w = torch.ones(T)
    w[copies] = 50.0  # half the context attention goes to the copies
    out = _routes(roll, ev, mask, _last_row(mask, w).expand(L, H, -1))
    assert out["routed_null_draws"] == 19
    assert out["routed_reachable"] is True and out["routed_kind"] == "rollout"  # the evidence itself is evicted
    assert out["routed_p"] == pytest.approx(1 / 20)
    assert out["routed_z"] > 3
    assert out["routed_reachable_pooled"] is True and out["routed_p_pooled"] == pytest.approx(1 / 20)
    assert out["routed_evidence_mass"] > out["routed_null_q95"] >= out["routed_null_mass"]


def test_one_head_in_one_layer_reading_the_evidence_is_a_route_the_pooled_mean_misses():
    """The full cache as a real model has it: one retrieval head in one layer puts most of its attention on
    the evidence, every other head of every layer spreads its attention over the whole context. Pooled over
    all (layer, head) pairs the evidence reads like any other span; the layer-max test finds the layer."""
    T, L, H = 200, 8, 8
    ev = [60, 61, 62, 63, 64, 65]
    roll = _planted_rollout([_uniform_causal(T, H) for _ in range(L)], ev, _nulls(ev, T))
    mask = torch.ones(L, 1, T, dtype=torch.bool)
    g = torch.Generator().manual_seed(0)
    last = _last_row(mask, torch.rand(T, generator=g) + 0.5).expand(L, H, -1).clone()
    row = torch.full((T,), 0.3 / (T - len(ev)))
    row[ev] = 0.5 / len(ev)
    last[5, 3, :T] = row  # layer 6, head 4: half of its attention on the evidence
    out = _routes(roll, ev, mask, last)
    assert out["routed_reachable"] is True and out["routed_p"] == pytest.approx(1 / 20)
    assert out["routed_layer"] == 6 and out["routed_kind"] == "direct"
    assert out["routed_reachable_pooled"] is False
    # without the retrieval head, nothing singles the evidence out
    base = _routes(roll, ev, mask, _last_row(mask, torch.rand(T, generator=g) + 0.5).expand(L, H, -1))
    assert base["routed_reachable"] is False


def test_layer_statistics_are_the_direct_mass_and_the_routed_read_per_layer():
    L, H, T = 2, 2, 5
    a = torch.zeros(L, H, T)
    a[0, 0, 1], a[0, 1, 2], a[1, :, 3] = 1.0, 1.0, 0.5
    shares = torch.zeros(L, T, 2)
    shares[0, 1, 0] = shares[0, 2, 1] = 1.0  # layer 0 input: source 0 at token 1, source 1 at token 2
    shares[1, 3, 0] = 0.4  # by layer 2 token 3 carries 40% of source 0
    x = layer_statistics(a, shares)  # [S, 2L]: direct per layer, then routed per layer
    torch.testing.assert_close(x, torch.tensor([[0.5, 0.0, 0.5, 0.2], [0.5, 0.0, 0.5, 0.0]]))


def test_max_test_ranks_the_evidence_among_the_nulls_own_maxima():
    g = torch.Generator().manual_seed(0)
    nulls = torch.randn(19, 6, generator=g)
    top = torch.cat([torch.full((1, 6), 0.0), nulls])
    top[0, 4] = 10.0  # far above the nulls in one column
    out = max_test(top, 0.05)
    assert out["routed_reachable"] is True and out["routed_p"] == pytest.approx(1 / 20) and out["routed_column"] == 4
    low = torch.cat([torch.full((1, 6), -10.0), nulls])
    assert max_test(low, 0.05)["routed_p"] == pytest.approx(1.0) and max_test(low, 0.05)["routed_reachable"] is False
    assert max_test(low, 0.05)["routed_column"] is None  # below its nulls everywhere: no column is named
    assert max_test(top[:6], 0.05)["routed_reachable"] is None  # 5 draws cannot reach p ≤ 0.05
    # every reference source reads the same value: above it is a route, equal to it is not
    flat = torch.zeros(20, 3)
    flat[0, 1] = 1e-3
    assert max_test(flat, 0.05)["routed_reachable"] is True
    assert max_test(torch.zeros(20, 3), 0.05)["routed_reachable"] is False


def _alike_nulls(T=103, L=3, H=2):
    """Attention that reads the evidence (span 0) more than 19 null spans that all read exactly alike, and the
    sources' indicator shares: in exact arithmetic the nulls' statistics have no spread at all."""
    spans = [list(range(3 + 5 * i, 7 + 5 * i)) for i in range(20)]
    shares = torch.zeros(L, T, 20)
    for s, span in enumerate(spans):
        shares[:, span, s] = 1.0
    logits = torch.zeros(L, H, T)
    logits[..., spans[0]] = 1.0
    return torch.softmax(logits, -1), shares


def test_routed_z_is_reproducible_when_the_nulls_read_alike():
    """Planted: the nulls read alike, so their spread is float32 rounding. Perturbing the attention at float32
    rounding (as another kernel or summation order does) must not move z: dividing by the rounding spread gave
    z ≈ 10⁷–10⁸ that moved by 15% between perturbations (and 1e6 without them)."""
    attn, shares = _alike_nulls()
    runs = []
    for seed in range(6):
        noisy = attn * (1 + 1e-7 * torch.randn(attn.shape, generator=torch.Generator().manual_seed(seed)))
        runs.append(max_test(layer_statistics(noisy, shares), 0.05))
    zs = torch.tensor([r["routed_z"] for r in runs], dtype=torch.float64)
    assert all(r["routed_reachable"] is True and r["routed_p"] == pytest.approx(1 / 20) for r in runs)
    assert float((zs - zs[0]).abs().max()) <= 1e-4 * float(zs[0])
    assert 1e3 < float(zs[0]) <= 2 / RELATIVE_RESOLUTION  # far above the nulls, counted in resolution units


def test_a_rounding_level_difference_is_a_tie_not_a_route():
    """Planted: no signal (the evidence is drawn like the 19 nulls in 5 columns), and one column in which every
    source reads the same value, the evidence higher by float32 rounding only. The layer-max test must fire at
    about its level and never from that column: the former rule gave the evidence z = 1e6 there, a route in
    every plant."""
    g = torch.Generator().manual_seed(0)
    fired, from_flat = 0, 0
    for _ in range(300):
        stats = torch.cat([0.3 + 0.05 * torch.randn(20, 5, generator=g), torch.full((20, 1), 0.2)], 1)
        stats[0, 5] *= 1 + 1e-7
        out = max_test(stats, 0.05)
        fired += out["routed_reachable"]
        from_flat += out["routed_column"] == 5 and out["routed_z"] > 0  # (z = 0 there when all else is below)
    assert fired / 300 <= 0.09 and from_flat == 0
    # a difference the statistics resolve is still one, however small the spread
    flat = torch.full((20, 1), 0.002, dtype=torch.float64)  # small masses: the absolute resolution governs
    flat[0, 0] += 10 * MASS_RESOLUTION
    out = max_test(flat, 0.05)
    assert out["routed_reachable"] is True and out["routed_z"] == pytest.approx(10.0, rel=1e-3)


def test_diffusion_without_a_route_is_not_reachable_although_the_former_rule_says_so():
    """Uniform causal attention in every layer: evidence content diffuses into every later token, the
    evidence is evicted, and the query reads late tokens that copied nothing in particular."""
    T, L, H = 100, 8, 2  # room for 19 disjoint 4-token null copies
    ev = [20, 21, 22, 23]
    roll = _planted_rollout([_uniform_causal(T, H) for _ in range(L)], ev, _nulls(ev, T))
    mask = torch.ones(L, 1, T, dtype=torch.bool)
    mask[:, :, ev] = False
    w = torch.ones(T)
    w[[96, 97, 98]] = 60.0  # strong attention to a few late tokens, far from the evidence
    out = _routes(roll, ev, mask, _last_row(mask, w).expand(L, H, -1))
    assert out["routed_reachable_uncalibrated"] is True  # the former rule: diffusion counts as a route
    assert out["routed_reachable"] is False and out["routed_reachable_pooled"] is False
    assert out["routed_p"] > 0.05 and out["routed_evidence_mass"] < out["routed_null_q95"]


def _planted_nulls(T, L, H, Hkv, n_ev, doc, plants, *, exchangeable):
    """Rates at which the layer-max, pooled and former tests fire over ``plants`` cells with no signal:
    random causal attention, a random mask and a random last-token row per cell; the evidence is a
    random span of the document (positions doc…T-1, after a template head, as in a real prompt).
    ``exchangeable``: the evidence and its 19 nulls are 20 disjoint spans packed at random, the evidence
    picked among them at random — drawn exactly like the nulls; otherwise the evidence is planted first and
    the nulls drawn around it by :func:`null_position_sets`, as the runner does."""
    g = torch.Generator().manual_seed(0)
    causal = torch.tril(torch.ones(T, T, dtype=torch.bool))
    layers = [torch.softmax((2.0 * torch.randn(H, T, T, generator=g)).masked_fill(~causal, -torch.inf), -1)
              for _ in range(L)]
    rng = random.Random(1)
    fired, fired_pooled, fired_old, decided = 0, 0, 0, 0
    for plant in range(plants):
        if exchangeable:
            starts = list(range(doc, T - n_ev + 1))
            rng.shuffle(starts)
            used, spans = set(), []
            for st in starts:
                span = set(range(st, st + n_ev))
                if not span & used:
                    used |= span
                    spans.append(sorted(span))
                if len(spans) == 20:
                    break
            rng.shuffle(spans)
            ev, nulls = spans[0], spans[1:]
        else:
            start = rng.randrange(doc, T - n_ev)
            ev = list(range(start, start + n_ev))
            nulls = _nulls(ev, T, seed=plant, lo=doc)
        roll = _planted_rollout(layers, ev, nulls)
        mask = torch.rand(L, Hkv, T, generator=g) < 0.3
        logits = 2.0 * torch.randn(L, H, T, generator=g)
        a = torch.softmax(logits.masked_fill(~mask.repeat_interleave(H // Hkv, 1), -torch.inf), -1)
        last = torch.cat([0.9 * a, torch.full((L, H, 2), 0.05)], -1)
        out = _routes(roll, ev, mask, last, reach_kappa=1.0)
        if out["routed_reachable"] is None:
            continue
        decided += 1
        fired += out["routed_reachable"]
        fired_pooled += out["routed_reachable_pooled"]
        fired_old += out["routed_reachable_uncalibrated"]
    return decided, fired / max(decided, 1), fired_pooled / max(decided, 1), fired_old / max(decided, 1)


@pytest.mark.parametrize("exchangeable", [True, False], ids=["drawn-like-the-nulls", "nulls-drawn-around-it"])
@pytest.mark.statistical
def test_with_no_signal_the_false_positive_rate_stays_near_the_level(exchangeable):
    """Nothing singles the evidence out, so the calibrated test fires at about route_alpha (≤ 10% over 200
    plants at α = 0.05); the former rule fires almost always."""
    decided, fpr, fpr_pooled, fpr_old = _planted_nulls(200, 4, 4, 2, 6, 16, 200, exchangeable=exchangeable)
    print(f"\nfalse-positive rate at α = 0.05 over {decided} planted nulls "
          f"({'exchangeable' if exchangeable else 'runner'} nulls): layer-max {fpr:.3f}, pooled {fpr_pooled:.3f}, "
          f"uncalibrated {fpr_old:.3f}")
    assert decided >= 190
    assert fpr <= 0.10 and fpr_pooled <= 0.10
    assert fpr_old >= 0.9


def test_null_sources_ride_in_the_same_pass_without_changing_the_evidence_share():
    """Batched sources (more than head_dim of them: several fused calls) equal a dense reference, and the
    evidence column equals a rollout of the evidence alone."""
    T, H, Hkv, D, L = 100, 4, 2, 8, 3
    g = torch.Generator().manual_seed(3)
    ev = [40, 41, 42]
    nulls = _nulls(ev, T, n=19)  # 20 sources > D = 8
    assert len(nulls) == 19
    qs = [torch.randn(1, H, T, D, generator=g) for _ in range(L)]
    ks = [torch.randn(1, Hkv, T, D, generator=g) for _ in range(L)]
    mod = _Attn(scaling=D ** -0.5)
    batched, alone = EvidenceRollout(ev, T, nulls), EvidenceRollout(ev, T)
    for layer in range(L):
        for roll in (batched, alone):
            roll.on_layer(layer, mod, torch.zeros(1, T, D), ks[layer], ks[layer], {}, queries=qs[layer])
    # dense reference: r ← ½ r + ½ mean_h softmax_causal(q kᵀ / √D) r
    r = torch.zeros(T, 20)
    for j, s in enumerate([ev, *nulls]):
        r[s, j] = 1.0
    ref = []
    causal = torch.tril(torch.ones(T, T, dtype=torch.bool))
    for layer in range(L):
        ref.append(r.clone())
        k = ks[layer].repeat_interleave(H // Hkv, dim=1)
        A = torch.softmax((qs[layer] @ k.transpose(-1, -2) * mod.scaling).masked_fill(~causal, -torch.inf), -1)
        r = 0.5 * r + 0.5 * A[0].mean(0) @ r
    ref = torch.stack(ref)  # [L, T, 20]
    torch.testing.assert_close(batched.shares(), ref[..., 0], atol=1e-5, rtol=0)
    torch.testing.assert_close(batched.null_shares(), ref[..., 1:], atol=1e-5, rtol=0)
    torch.testing.assert_close(batched.shares(), alone.shares(), atol=1e-6, rtol=0)
    assert alone.null_shares() is None


def test_null_position_sets_are_shifted_disjoint_copies_near_the_evidence():
    ev = [300, 301, 302, 310, 311]  # two pieces: the copies keep the shape
    sets = null_position_sets(ev, 4, 1000, 16, random.Random(5), exclude=range(900, 1000), window=128)
    assert len(sets) == 16 and len({tuple(s) for s in sets}) == 16
    for s in sets:
        shift = s[0] - ev[0]
        assert s == [p + shift for p in ev] and shift != 0
        assert abs(shift) <= 128 and not set(s) & set(ev) and all(4 <= p < 900 for p in s)
    taken = [p for s in sets for p in s]
    assert len(taken) == len(set(taken))  # mutually disjoint
    assert sets == null_position_sets(ev, 4, 1000, 16, random.Random(5), exclude=range(900, 1000))  # seeded
    # no room: the evidence fills the range
    assert null_position_sets([4, 5, 6, 7], 4, 8, 16, random.Random(0)) == []
    # a window too small for n disjoint copies widens until it holds them
    wide = null_position_sets([50], 0, 200, 10, random.Random(0), window=1)
    assert len(wide) == 10 and max(abs(s[0] - 50) for s in wide) <= 8
    span = list(range(100, 110))  # a 10-token sentence: 19 disjoint copies need ± ~130 tokens
    packed = null_position_sets(span, 0, 400, 19, random.Random(2), window=16)
    starts = sorted(s[0] for s in packed)
    assert len(packed) == 19 and all(b - a >= 10 for a, b in zip(starts, starts[1:], strict=False))
    # a range with room for only a few disjoint copies gives only those
    few = null_position_sets([20, 21, 22, 23], 0, 40, 19, random.Random(0))
    assert 1 <= len(few) <= 9 and len({p for s in few for p in s}) == 4 * len(few)


def test_nulls_stay_in_the_document_and_short_documents_get_too_few_disjoint_ones():
    """A 3-sentence passage (document 41…76 after a 41-token template head) whose evidence is the middle
    sentence holds no shifted copy and one disjoint scattered set of the document's other tokens — never
    template tokens, whose rollout contributions are those of secondary sinks. One null cannot calibrate a
    rank test at 0.05, so such a cell reads undecided rather than borrowing overlapping (non-exchangeable)
    nulls."""
    T, doc = 77, (41, 77)
    ev = list(range(51, 67))
    settings = MetricSettings()
    prompt = _Prompt(T, ev, ev, instance_id="short")
    roll = EvidenceRollout.for_prompt(prompt, ev, settings=settings, seed=0, doc_range=doc)
    assert len(roll.nulls) == 1
    assert all(len(set(s)) == len(ev) and all(41 <= p < 77 and p not in ev for p in s) for s in roll.nulls)
    again = EvidenceRollout.for_prompt(prompt, ev, settings=settings, seed=0, doc_range=doc)
    assert again.nulls == roll.nulls  # seeded per (instance, seed)
    other = EvidenceRollout.for_prompt(_Prompt(T, ev, ev, instance_id="other"), ev, settings=settings, doc_range=doc)
    assert other.nulls != roll.nulls
    mask = torch.ones(1, 1, T, dtype=torch.bool)
    last = _last_row(mask, torch.ones(T)).expand(1, 2, -1)
    roll.on_layer(0, _Attn(), torch.zeros(1, T, T), torch.eye(T)[None, None], torch.eye(T)[None, None], {},
                  queries=torch.log(_uniform_causal(T, 2).clamp(min=1e-30))[None])
    out = _routes(roll, ev, mask, last)
    assert out["routed_reachable"] is None and out["routed_null_draws"] == 1
    # a document with room for some scattered but no shifted copies: disjoint scattered sets
    mid = EvidenceRollout.for_prompt(_Prompt(120, ev, ev, instance_id="mid"), ev, settings=settings,
                                     doc_range=(41, 120)).nulls
    assert len(mid) == (120 - 41 - len(ev)) // len(ev) and len({p for s in mid for p in s}) == len(ev) * len(mid)
    # a long document: shifted copies inside the document, on both sides of the evidence
    T2, doc2, ev2 = 900, (41, 900), list(range(400, 410))
    roll2 = EvidenceRollout.for_prompt(_Prompt(T2, ev2, ev2), ev2, settings=settings, doc_range=doc2)
    shifts = [s[0] - ev2[0] for s in roll2.nulls]
    assert len(roll2.nulls) == settings.route_null and all(41 <= p < 900 for s in roll2.nulls for p in s)
    assert all(s == [p + d for p in ev2] for s, d in zip(roll2.nulls, shifts, strict=True))
    assert sum(d < 0 for d in shifts) == settings.route_null // 2  # balanced around the evidence
    assert len({p for s in roll2.nulls for p in s}) == len(ev2) * settings.route_null  # disjoint
    # evidence at the document's start: all draws after it, none in the template head
    roll3 = EvidenceRollout.for_prompt(_Prompt(T2, list(range(41, 51)), []), list(range(41, 51)), settings=settings,
                                       doc_range=doc2)
    assert len(roll3.nulls) == settings.route_null and min(p for s in roll3.nulls for p in s) >= 51
    # no room at all: the document is the evidence
    assert EvidenceRollout.for_prompt(_Prompt(T, ev, ev), ev, settings=settings, doc_range=(51, 67)).nulls == []


def test_null_test_rank_rule():
    nulls = torch.arange(19, dtype=torch.float64)  # 0 … 18
    out = null_test(18.5, nulls, 0.05)
    assert out["routed_p"] == pytest.approx(1 / 20) and out["routed_reachable"] is True
    assert out["routed_null_mass"] == pytest.approx(9.0)
    assert out["routed_z"] == pytest.approx((18.5 - 9.0) / float(nulls.std()))
    tie = null_test(18.0, nulls, 0.05)  # a tie with the top null counts against the evidence
    assert tie["routed_p"] == pytest.approx(2 / 20) and tie["routed_reachable"] is False
    few = null_test(100.0, nulls[:5], 0.05)  # 5 draws: p ≥ 1/6 > α, the test cannot decide
    assert few["routed_p"] == pytest.approx(1 / 6) and few["routed_reachable"] is None
    alike = torch.full((19,), 0.25, dtype=torch.float64)  # the nulls read alike: no spread to divide by
    assert null_test(0.25 * (1 + 1e-7), alike, 0.05)["routed_z"] == 0.0  # within the resolution: a tie
    above = null_test(0.5, alike, 0.05)  # beyond it: counted in resolution units, at most 2 / RELATIVE_RESOLUTION
    assert above["routed_z"] == pytest.approx(0.25 / (RELATIVE_RESOLUTION * 0.5)) and above["routed_reachable"] is True
    none = null_test(1.0, torch.zeros(0), 0.05)
    assert none["routed_reachable"] is None and none["routed_null_draws"] == 0


def test_document_range_covers_the_instance_text_only():
    class CharTokenizer:  # one token per character, with offsets, like a fast tokenizer
        def __call__(self, text, add_special_tokens=False, return_offsets_mapping=True):
            return {"input_ids": [ord(c) for c in text], "offset_mapping": [(i, i + 1) for i in range(len(text))]}

    @dataclass
    class P:
        context_text: str
        context_char_offset: int
        n_context: int

    @dataclass
    class Inst:
        context: str

    doc = "Emrick owns goats."
    text = "<head>Read this.\n" + doc
    off = text.index(doc)
    assert document_range(CharTokenizer(), P(text, off, len(text)), Inst(doc)) == (off, len(text))
