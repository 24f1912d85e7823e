"""Planted truth for head consensus: hand-built attention with known argmax structure, and record
sets with a known layer-wise profile.

**(a) Attention tensors** (:func:`planted_attention`). For each layer a group-level profile is
drawn: ``n_groups`` KV groups are spread over a known number of distinct non-sink argmax keys.
The group-level rows ``A_g`` have the planted key at 0.5, a small background, and — in the
*sink groups* — a sink column (one of the first ``n_sink`` positions) at 0.9, above every other
entry. The ``G`` query heads of a group are ``A_g + c·(e_{d_j} − e_{d_{j+1}})`` (cyclic over the
group, with ``A_g`` at 0.3 on those decoy keys), so each head's own sink-free argmax is its decoy
``d_j`` (0.6 beats 0.5) while the group's head average is exactly ``A_g`` (the perturbations sum to
zero) and every head row keeps the group's row sum. Truth by construction: the group-aware
sink-free value is the planted profile for every ``G`` (1, 3 and 7 here); the per-head sink-free
value is the planted profile at ``G = 1`` and the decoys' distinct count at ``G > 1``; the with-sink
values count the sink columns of the sink groups. The metric must recover all of them exactly.

**(b) Record sets** (:func:`simulate_records`): three models with a known per-layer profile p_ℓ
of one of three shapes (``diversifying``: agreement early, diversification late; ``funnel``: the
reverse; ``flat``). Instance i's cell has, at layer ℓ, D = 1 + Binomial(H − 1, p_ℓ ± δ) distinct
argmax keys over its H query heads (the sign ±δ is the instance's, the same at every layer, so an
instance is more or less diverse throughout), and the same with the KV groups; hence
E[Consensus(ℓ)] = (1 + (H − 1) p_ℓ) / H exactly. The with-sink vector deliberately has the
*opposite* shape (sinks dominating deeper layers), so a curve that read it would fail. The report's
estimators run with their defaults: :func:`kvroute.analysis.curves.layer_profiles` (instance
bootstrap, 95% percentile intervals per layer) must cover the true profile at every layer in
≥ 90% of the sets, and :func:`kvroute.analysis.curves.profile_trend` must return the planted shape.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from kvroute.analysis.curves import CONSENSUS_COL, CONSENSUS_GROUP_COL, layer_profiles, profile_trend
from kvroute.metrics.consensus import consensus_and_rho, group_consensus_and_rho

# (a) tensors
N_SINK = 4
LAYERS = 12
N_GROUPS = 6
GROUP_SIZES: tuple[int, ...] = (1, 3, 7)
KEYS = N_SINK + 160  # room for every decoy: 6 groups × 7 heads, plus the planted keys
PLANTED, DECOY, SINK, BACKGROUND = 0.5, 0.3, 0.9, 0.05

# (b) records
SHAPES: tuple[str, ...] = ("diversifying", "funnel", "flat")
HEADS, KV_GROUPS = 9, 3  # SmolLM2-135M: 9 query heads over 3 KV heads
N_INSTANCES = 40
SPREAD = 0.1  # δ: the instance's shift of p_ℓ
N_BOOT = 1000  # the report's default


def _counts_truth(keys: np.ndarray) -> tuple[float, float]:
    _, counts = np.unique(keys, return_counts=True)
    return len(counts) / len(keys), counts.max() / len(keys)


def planted_profile(rng: np.random.Generator, layers: int = LAYERS, n_groups: int = N_GROUPS) -> np.ndarray:
    """Each layer's group argmax keys ``[L, n_groups]`` (non-sink positions): a random distinct count
    k ∈ 1..n_groups per layer, every one of the k keys used by at least one group."""
    out = np.zeros((layers, n_groups), int)
    for layer in range(layers):
        k = int(rng.integers(1, n_groups + 1))
        keys = N_SINK + rng.choice(KEYS - N_SINK - 8 * n_groups, k, replace=False)  # low keys; decoys above
        assign = np.concatenate([np.arange(k), rng.integers(0, k, n_groups - k)])
        out[layer] = keys[rng.permutation(assign)]
    return out


def planted_attention(group_keys: np.ndarray, sink_groups: np.ndarray, group_size: int,
                      rng: np.random.Generator) -> tuple[torch.Tensor, dict[str, list[float]]]:
    """Rows ``[L, n_groups · group_size, KEYS]`` with the planted structure, and the true values of every
    field the consensus metric emits. ``sink_groups [L, n_groups]`` holds −1 (no sink) or the sink
    column that dominates that group's heads. Background and decoys are drawn with ``rng``; the group-
    level rows (and so the group-aware truth) depend only on ``group_keys`` and ``sink_groups``
    plus the background, which is drawn the same way for every group size when ``rng`` is re-seeded."""
    L, Hkv = group_keys.shape
    G = group_size
    bg = rng.uniform(0, BACKGROUND, (L, Hkv, KEYS))
    # decoys: one distinct key per head, in a region the planted keys never use
    decoy_pool = KEYS - 8 * Hkv + rng.permuted(np.tile(np.arange(8 * Hkv), (L, 1)), axis=1)[:, : Hkv * G]
    decoys = decoy_pool.reshape(L, Hkv, G)  # [L, Hkv, G]
    a_g = bg.copy()
    li, gi = np.meshgrid(np.arange(L), np.arange(Hkv), indexing="ij")
    a_g[li, gi, group_keys] = PLANTED
    if G > 1:
        for j in range(G):
            a_g[li, gi, decoys[:, :, j]] = DECOY
    sink = sink_groups >= 0
    a_g[li[sink], gi[sink], sink_groups[sink]] = SINK
    heads = np.repeat(a_g[:, :, None, :], G, axis=2)  # [L, Hkv, G, K]
    if G > 1:
        c = DECOY
        for j in range(G):
            heads[li, gi, j, decoys[:, :, j]] += c
            heads[li, gi, j, decoys[:, :, (j + 1) % G]] -= c
    heads /= heads.sum(-1, keepdims=True)  # every head row of a group has the group's row sum
    attn = torch.from_numpy(heads.reshape(L, Hkv * G, KEYS)).float()

    head_nosink = np.repeat(group_keys, G, axis=1) if G == 1 else decoys.reshape(L, Hkv * G)
    head_with = np.where(np.repeat(sink, G, axis=1), np.repeat(sink_groups, G, axis=1), head_nosink)
    group_with = np.where(sink, sink_groups, group_keys)
    truth: dict[str, list[float]] = {}
    for name, keys in (("consensus_nosink", head_nosink), ("consensus_group_nosink", group_keys),
                       ("consensus_withsink", head_with), ("consensus_group_withsink", group_with)):
        vals = [_counts_truth(keys[layer]) for layer in range(L)]
        truth[name] = [v[0] for v in vals]
        truth[name.replace("consensus", "rho", 1)] = [v[1] for v in vals]
    return attn, truth


def tensor_case(rng: np.random.Generator, seed: int) -> dict[int, dict[str, dict[str, list[float]]]]:
    """One planted profile built at every group size of :data:`GROUP_SIZES`: per ``G``, the metric's
    values (``measured``) next to the truth, for the per-head, group-aware and with-sink variants."""
    keys = planted_profile(rng)
    sinks = np.where(rng.random(keys.shape) < 0.4, rng.integers(0, N_SINK, keys.shape), -1)
    out: dict[int, dict[str, dict[str, list[float]]]] = {}
    for G in GROUP_SIZES:
        attn, truth = planted_attention(keys, sinks, G, np.random.default_rng([seed, 1]))  # same background for every G
        cn, rn = consensus_and_rho(attn, N_SINK)
        cg, rg = group_consensus_and_rho(attn, G, N_SINK)
        cw, rw = consensus_and_rho(attn)
        cgw, rgw = group_consensus_and_rho(attn, G)
        out[G] = {"truth": truth, "measured": {
            "consensus_nosink": cn, "rho_nosink": rn, "consensus_group_nosink": cg, "rho_group_nosink": rg,
            "consensus_withsink": cw, "rho_withsink": rw, "consensus_group_withsink": cgw, "rho_group_withsink": rgw}}
    return out


# (b) -------------------------------------------------------------------------------------------------

def shape_profile(shape: str, layers: int = LAYERS) -> np.ndarray:
    """p_ℓ, the per-head probability of a new distinct key, for one planted shape."""
    depth = np.linspace(0, 1, layers)
    if shape == "diversifying":
        return 0.15 + 0.6 * depth
    if shape == "funnel":
        return 0.75 - 0.6 * depth
    if shape == "flat":
        return np.full(layers, 0.45)
    raise ValueError(f"unknown consensus shape {shape!r}; use one of {', '.join(SHAPES)}")


def true_consensus(shape: str, units: int) -> np.ndarray:
    """E[Consensus(ℓ)] over ``units`` heads (or groups): (1 + (units − 1) p_ℓ) / units."""
    return (1 + (units - 1) * shape_profile(shape)) / units


def true_change(shape: str, units: int) -> float:
    """The planted late-minus-early change (means over the last and first third of the layers)."""
    v = true_consensus(shape, units)
    k = max(1, len(v) // 3)
    return float(v[-k:].mean() - v[:k].mean())


TRUE_TREND = {"diversifying": "diversifying", "funnel": "funnel", "flat": "flat"}


def simulate_records(rng: np.random.Generator, n_instances: int = N_INSTANCES) -> pd.DataFrame:
    """One record set: a model per shape, ``n_instances`` full-cache cells each (the baseline)."""
    rows = []
    for shape in SHAPES:
        p = shape_profile(shape)
        sign = rng.choice([-1.0, 1.0], n_instances)[:, None]  # the instance's shift, every layer
        p_i = np.clip(p[None, :] + SPREAD * sign, 0, 1)  # stays inside [0, 1]: the mean is exactly p_ℓ
        d_head = 1 + rng.binomial(HEADS - 1, p_i)
        d_group = 1 + rng.binomial(KV_GROUPS - 1, p_i)
        withsink = np.clip(1 / HEADS + (1 - shape_profile(shape)) * 0.5 + rng.normal(0, 0.05, p_i.shape), 0, 1)
        for i in range(n_instances):
            rows.append({"model": shape, "press": "none", "regime": "agnostic", "ratio": 0.0,
                         "instance_id": f"{shape}-{i}", "consensus_nosink": (d_head[i] / HEADS).tolist(),
                         "consensus_group_nosink": (d_group[i] / KV_GROUPS).tolist(),
                         "consensus_withsink": withsink[i].tolist()})
    return pd.DataFrame(rows)


def coverage(n_sets: int = 200, seed: int = 0) -> list[dict]:
    """Rows: (a) exact recovery on hand-built attention per group size and variant, and the group-aware
    value's equality across group sizes; (b) per shape and variant, the per-layer interval coverage
    (the worst layer and the mean over layers) and the trend label's recovery."""
    rng = np.random.default_rng(seed)
    rows: list[dict] = []
    # (a)
    exact: dict[tuple[int, str], list[bool]] = {}
    same_group, head_differs, sinks_matter = [], [], []
    for s in range(n_sets):
        case = tensor_case(rng, seed * 100_003 + s)
        for G, per_g in case.items():
            for name, expected in per_g["truth"].items():
                exact.setdefault((G, name), []).append(np.allclose(per_g["measured"][name], expected,
                                                                   rtol=0, atol=1e-12))
        m1 = case[GROUP_SIZES[0]]["measured"]
        sinks_matter.append(m1["consensus_withsink"] != m1["consensus_nosink"])
        g1 = m1["consensus_group_nosink"]
        same_group.append(all(case[G]["measured"]["consensus_group_nosink"] == g1 for G in GROUP_SIZES))
        head_differs.append(any(case[G]["measured"]["consensus_nosink"] != g1 for G in GROUP_SIZES[1:]))
    for G in GROUP_SIZES:
        names = sorted(n for g, n in exact if g == G)
        ok = np.all([exact[(G, n)] for n in names], axis=0)
        worst = min(names, key=lambda n: np.mean(exact[(G, n)]))
        rows.append({"estimator": "metric consensus/rho (all variants)", "scenario": f"G={G}",
                     "parameter": f"per-layer values, {G} query head(s) per KV group", "truth": "planted",
                     "n_sets": n_sets, "mean_estimate": None, "coverage": None, "recovered": float(np.mean(ok)),
                     "note": f"hand-built attention with sinks: share of sets where all {len(names)} fields are exact "
                             f"(least: {worst} {np.mean(exact[(G, worst)]):.0%})"})
    rows.append({"estimator": "metric consensus_withsink", "scenario": "sinks",
                 "parameter": "differs from consensus_nosink",
                 "truth": "planted", "n_sets": n_sets, "mean_estimate": None, "coverage": None,
                 "recovered": float(np.mean(sinks_matter)),
                 "note": "the planted sinks change the with-sink value, which the sink-free one ignores"})
    rows.append({"estimator": "metric consensus_group_nosink", "scenario": "across G",
                 "parameter": f"equal across group sizes {GROUP_SIZES}",
                 "truth": "planted", "n_sets": n_sets, "mean_estimate": None, "coverage": None,
                 "recovered": float(np.mean(same_group)),
                 "note": "per-head consensus_nosink differs across group sizes in "
                         f"{np.mean(head_differs):.0%} of sets"})
    # (b)
    cov: dict[tuple[str, str], list[np.ndarray]] = {}
    est: dict[tuple[str, str], list[np.ndarray]] = {}
    trend_ok: dict[tuple[str, str], list[bool]] = {}
    change_cov: dict[tuple[str, str], list[bool]] = {}
    for s in range(n_sets):
        df = simulate_records(rng)
        boot_seed = seed * 100_003 + s
        for col, units in ((CONSENSUS_COL, HEADS), (CONSENSUS_GROUP_COL, KV_GROUPS)):
            prof = layer_profiles(df, col, n_boot=N_BOOT, seed=boot_seed)
            trend = profile_trend(df, col, n_boot=N_BOOT, seed=boot_seed)
            for shape in SHAPES:
                p = prof[prof["model"] == shape].sort_values("layer")
                truth = true_consensus(shape, units)
                cov.setdefault((shape, col), []).append((p["low"].to_numpy() <= truth)
                                                        & (truth <= p["high"].to_numpy()))
                est.setdefault((shape, col), []).append(p["value"].to_numpy())
                t = trend[trend["model"] == shape].iloc[0]
                trend_ok.setdefault((shape, col), []).append(t["trend"] == TRUE_TREND[shape])
                ch = true_change(shape, units)
                change_cov.setdefault((shape, col), []).append(bool(t["change_low"] <= ch <= t["change_high"]))
    for (shape, col), c in cov.items():
        per_layer = np.mean(c, axis=0)  # [L]
        truth = true_consensus(shape, HEADS if col == CONSENSUS_COL else KV_GROUPS)
        rows.append({"estimator": f"layer_profiles({col})", "scenario": shape,
                     "parameter": f"{shape}: per-layer mean, worst layer",
                     "truth": f"{truth[0]:.3f} → {truth[-1]:.3f}", "n_sets": n_sets,
                     "mean_estimate": float(np.mean(np.abs(np.mean(est[(shape, col)], axis=0) - truth))),
                     "coverage": float(per_layer.min()), "mean_layer_coverage": float(per_layer.mean()),
                     "note": "mean_estimate = mean |bias| over layers; coverage = the worst layer's share"})
        units = HEADS if col == CONSENSUS_COL else KV_GROUPS
        rows.append({"estimator": f"profile_trend({col})", "scenario": shape,
                     "parameter": f"{shape}: late − early, and the label",
                     "truth": true_change(shape, units), "n_sets": n_sets, "mean_estimate": None,
                     "coverage": float(np.mean(change_cov[(shape, col)])),
                     "recovered": float(np.mean(trend_ok[(shape, col)])),
                     "note": f"recovered = share of sets labelled {TRUE_TREND[shape]!r}"})
    return rows
