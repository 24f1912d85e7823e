"""Fabricated runs with known answers, for testing the analysis and demonstrating the report.

The records follow :mod:`kvroute.records`. The truth is built in, so tests can check recovery:

* Hallucination follows H(α) = lo + (hi − lo) σ(k (α − α*)) *exactly* in expectation. Each
  instance draws a type once — always hallucinates (probability lo), never (1 − hi), or has a
  personal threshold α* + logit(u)/k — so an instance fails at every ratio above its threshold
  (the same instance is hard for every press), and a share ``noise`` of cells is redrawn
  independently with probability H(α).
* α* per (model, press) is ``base_alpha_star`` plus model and press offsets. In the long-context
  family it depends on the length T: ``law="budget"`` keeps the kept-token budget at the cliff
  fixed, ``(1 − α*(T)) T = (1 − α*) T_ref``; ``law="ratio"`` keeps α* fixed.
* GER rises along a sigmoid a little before H and is higher in hallucinated cells; a hallucinated
  cell has its answer globally evicted (``ger_all_layers == 1``) with probability
  ``erasure[model]`` — the rest are failures with the answer retained somewhere. Unanswerable items
  have no answer in the context, so their ``ger``/``ger_all_layers`` are NaN (undefined), as in real runs.
* Consensus profiles (``consensus_nosink``, sink-free per head): the "llama" profile is low (heads
  agree) early and high late; the "qwen" profile the opposite. Retained failures are more rigid
  (consensus lower by ``rigidity_drop`` in the second half of the layers) than successes. The
  with-sink vector is one head lower (sinks collapse heads); the GQA-aware one is the same profile
  on the model's KV groups (``group_size`` query heads each).
* ``probe_features`` carry the answer type with a signal that fades with α (the type control).
* The logit lens (``lens_candidates``: 3 candidates, the gold first, per layer) gives the gold a
  margin over its distractors in the second half of the layers that fades with α and is zero
  when the answer is globally evicted, so the identity probe is at chance exactly there. Drawn
  from their own generator: every other field is the same as without them.
* ``routed_reachable`` (layer-max test) is direct reachability or chance; its pooled companion
  ``routed_reachable_pooled`` finds a share of those cells only, and ``routed_layer`` /
  ``routed_kind`` say where the layer-max test won (again their own generator).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from kvroute.errors import ConfigError

RATIO_GRID: tuple[float, ...] = (0.0, 0.25, 0.5, 0.7, 0.8, 0.85, 0.9, 0.95, 0.98)
ANSWER_TYPES = ("Person", "Thing", "Organization", "Creature", "Location", "Numeral", "Date/Time", "Event")
QUESTION_TYPES = ("Standard", "Manipulated", "Part")
_WORDS = ("Maren", "Velkirra", "Tobin", "Quarrystead", "Brasswind", "Dunmarrow", "Osk", "Hale", "Lund", "Iver")


@dataclass(frozen=True)
class SyntheticModel:
    name: str
    layers: int
    heads: int
    profile: str  # "llama" | "qwen"
    alpha_offset: float = 0.0
    erasure: float = 0.7  # P(answer globally evicted | hallucinated)
    group_size: int = 1  # query heads per KV head (heads must be a multiple)
    params: int | None = None  # the parameter count its records carry (model_params); None: none recorded


@dataclass(frozen=True)
class SyntheticSpec:
    """What to fabricate; validated on construction."""

    models: tuple[SyntheticModel, ...] = (
        SyntheticModel("llama-like", 16, 8, "llama", 0.0, 0.75, group_size=2, params=1_000_000_000),
        SyntheticModel("qwen-like", 12, 14, "qwen", -0.05, 0.3, group_size=7, params=500_000_000),
    )
    presses: tuple[str, ...] = ("expected_attention+per_head", "snapkv+adakv")
    press_offsets: tuple[float, ...] = (0.0, 0.03)
    regimes: tuple[str, ...] = ("agnostic",)
    families: tuple[str, ...] = ("base", "knowledge", "coreference")
    long_context_lengths: tuple[int, ...] = (256, 512, 1024, 2048)
    law: str = "budget"
    t_ref: int = 512
    n_instances: int = 40  # per family, and per length for long_context
    ratios: tuple[float, ...] = RATIO_GRID
    base_alpha_star: float = 0.85
    k: float = 40.0
    lo: float = 0.03
    hi: float = 0.9
    noise: float = 0.2
    rigidity_drop: float = 0.2
    probe_dims: int = 8
    seed: int = 0

    def __post_init__(self) -> None:
        if self.law not in ("budget", "ratio"):
            raise ConfigError(f"law must be 'budget' or 'ratio', got {self.law!r}")
        if not 0 <= self.lo < self.hi <= 1:
            raise ConfigError(f"need 0 ≤ lo < hi ≤ 1, got lo={self.lo}, hi={self.hi}")
        if self.n_instances < 2:
            raise ConfigError(f"n_instances must be at least 2, got {self.n_instances}")
        if len(self.press_offsets) != len(self.presses):
            raise ConfigError("press_offsets needs one value per press")
        if 0.0 not in self.ratios or any(not 0 <= r < 1 for r in self.ratios):
            raise ConfigError("ratios must lie in [0, 1) and include the 0 baseline")

    def alpha_star(self, model: int, press: int, family: str = "base", tokens: float | None = None) -> float:
        """The true midpoint for one model, press, family and context length."""
        a = self.base_alpha_star + self.models[model].alpha_offset + self.press_offsets[press]
        if family == "long_context" and self.law == "budget" and tokens is not None:
            a = 1.0 - (1.0 - a) * self.t_ref / tokens
        return float(a)

    def h(self, alpha: np.ndarray, alpha_star: float | np.ndarray) -> np.ndarray:
        """The true hallucination rate."""
        return self.lo + (self.hi - self.lo) / (1 + np.exp(-self.k * (np.asarray(alpha) - alpha_star)))


def _instances(spec: SyntheticSpec, rng: np.random.Generator) -> pd.DataFrame:
    rows = []
    fams = [(f, None) for f in spec.families] + [("long_context", t) for t in spec.long_context_lengths]
    for fam, length in fams:
        for i in range(spec.n_instances):
            t = int(length * rng.uniform(0.96, 1.04)) if length else int(rng.integers(150, 400))
            rows.append({"instance_id": f"{fam}-{length or 0}-{i:04d}", "family": fam, "context_tokens": t,
                         "answer_type": ANSWER_TYPES[int(rng.integers(len(ANSWER_TYPES)))],
                         "question_type": QUESTION_TYPES[int(rng.integers(3))],
                         "unanswerable": bool(fam == "coreference" and rng.random() < 0.2),
                         "difficulty": int(rng.integers(1, 4)),
                         "gold": f"{_WORDS[int(rng.integers(10))]} {_WORDS[int(rng.integers(10))]}"})
    inst = pd.DataFrame(rows)
    n = len(inst)
    kind = rng.random(n)
    inst["_kind"] = np.where(kind < spec.lo, "always", np.where(kind < spec.hi, "threshold", "never"))
    inst["_u"] = rng.uniform(1e-6, 1 - 1e-6, n)
    return inst


def _cells(spec: SyntheticSpec, inst: pd.DataFrame) -> pd.DataFrame:
    parts = []
    for mi, m in enumerate(spec.models):
        for regime in spec.regimes:
            parts.append(inst.assign(model=m.name, _mi=mi, press="none", _pi=0, ratio=0.0, regime=regime))
            for pi, p in enumerate(spec.presses):
                for r in spec.ratios:
                    if r > 0:
                        parts.append(inst.assign(model=m.name, _mi=mi, press=p, _pi=pi, ratio=r, regime=regime))
    return pd.concat(parts, ignore_index=True)


def synthetic_records(spec: SyntheticSpec | None = None) -> pd.DataFrame:
    """Records of a fabricated run (see the module docstring for what is built in)."""
    spec = spec or SyntheticSpec()
    rng = np.random.default_rng(spec.seed)
    inst = _instances(spec, rng)
    df = _cells(spec, inst)
    n = len(df)
    a = df["ratio"].to_numpy()
    astar = np.array([spec.alpha_star(mi, pi, f, t) for mi, pi, f, t in
                      zip(df["_mi"], df["_pi"], df["family"], df["context_tokens"], strict=True)])
    h_true = spec.h(a, astar)
    thr = astar + np.log(df["_u"] / (1 - df["_u"])).to_numpy() / spec.k
    halluc = np.where(df["_kind"] == "always", True, np.where(df["_kind"] == "never", False, a >= thr))
    redraw = rng.random(n) < spec.noise
    halluc = np.where(redraw, rng.random(n) < h_true, halluc).astype(bool)
    # GER rises a little before H; globally evicted answers explain most llama-like failures
    g = 1 / (1 + np.exp(-spec.k * (a - (astar - 0.03))))
    erasure = np.array([spec.models[i].erasure for i in df["_mi"]])
    glob = np.where(halluc, rng.random(n) < erasure, rng.random(n) < 0.15 * g) & (a > 0)
    ger = np.clip(0.85 * g + 0.15 * halluc + rng.normal(0, 0.05, n), 0, 1) * (a > 0)
    ger = np.where(glob, 1.0, np.minimum(ger, 0.99))
    ger_all = np.where(glob, 1.0, ger * rng.uniform(0, 0.9, n))
    u = rng.random(n)
    outcome = np.where(halluc, np.where(u < 0.5, "distractor", "fabricated"),
                       np.where(u < 0.12 * g, "abstained", np.where(u < 0.25 * g, "partial", "correct")))
    unans = df["unanswerable"].to_numpy()
    outcome = np.where(unans & ~halluc, "abstained", outcome)
    f1 = np.select([outcome == "correct", outcome == "partial"], [1.0, rng.uniform(0.2, 0.8, n)], 0.0)
    f1 = np.where(unans & (outcome == "abstained"), 1.0, f1)
    gold = df["gold"].to_numpy()
    answer = np.select([outcome == "correct", outcome == "partial", outcome == "abstained", outcome == "distractor"],
                       [gold, np.char.add(gold.astype(str), " perhaps"), "I don't know", "Tobin Hale"], "Someone Else")
    full_mass = rng.uniform(0.2, 0.5, n)
    press_parts = df["press"].str.split("+", n=1, expand=True).reindex(columns=[0, 1])
    logp_full = -rng.uniform(0.5, 3.0, n)
    delta = -(4 * ger + 2 * halluc) * rng.uniform(0.5, 1.5, n) * (a > 0)
    # redundancy: k (layer, KV head) pairs keep evidence (none when globally evicted); each routes with p = 0.2
    heads = np.where(glob, 0, np.maximum(1, np.round(60 * (1 - ger) * rng.uniform(0.5, 1.5, n)))).astype(int)
    reach = (heads > 0) & (rng.random(n) < 1 - (1 - 0.2) ** heads)
    out = pd.DataFrame({
        "model": df["model"], "instance_id": df["instance_id"], "press": df["press"], "ratio": a,
        "regime": df["regime"], "seed": spec.seed, "settings": "synthetic",
        "family": df["family"], "answer_type": df["answer_type"], "question_type": df["question_type"],
        "unanswerable": unans, "context_tokens": df["context_tokens"], "difficulty": df["difficulty"],
        "scorer": press_parts[0].fillna("none"), "selection": press_parts[1].fillna("none"),
        "kept_fraction": 1 - a, "answer": answer, "f1": f1, "exact": (f1 == 1).astype(float),
        "outcome": outcome, "hallucinated": halluc, "ger": ger, "ger_all_layers": ger_all,
        "ger_evidence": 0.9 * ger, "ger_evidence_all_layers": 0.9 * ger_all, "eviction_rate": a**2,
        "evidence_attention_mass": full_mass * (1 - 0.8 * ger) * rng.uniform(0.85, 1.1, n),
        "evidence_attention_mass_full": full_mass, "reachable": reach, "evidence_heads": heads,
        "routed_reachable": reach | (rng.random(n) < 0.3),
        "gold_logprob": logp_full + delta, "gold_logprob_delta": delta,
    })
    # no answer occurrence in the context: GER is undefined (the runner records None)
    out.loc[unans, ["ger", "ger_all_layers"]] = np.nan
    params = {m.name: m.params for m in spec.models}
    out["model_params"] = [params[m] for m in df["model"]]
    _layer_vectors(spec, df, out, halluc, glob, rng)
    _lens_vectors(spec, df, out, glob)
    _routed_fields(spec, df, out)
    return out


def _layer_vectors(spec: SyntheticSpec, df: pd.DataFrame, out: pd.DataFrame, halluc: np.ndarray,
                   glob: np.ndarray, rng: np.random.Generator) -> None:
    cols: dict[str, list] = {c: [None] * len(df) for c in
                             ("consensus_nosink", "rho_nosink", "consensus_group_nosink", "rho_group_nosink",
                              "consensus_withsink", "rho_withsink", "evidence_mass_layer",
                              "hidden_cosine", "probe_features")}
    centers = rng.normal(0, 1, (len(ANSWER_TYPES), spec.probe_dims))
    type_idx = df["answer_type"].map({t: i for i, t in enumerate(ANSWER_TYPES)}).to_numpy()
    for mi, m in enumerate(spec.models):
        rows = np.flatnonzero(df["_mi"].to_numpy() == mi)
        n, L, H = len(rows), m.layers, m.heads
        depth = np.linspace(0, 1, L)[None, :]  # [1, L]
        prof = 0.2 + 0.6 * depth if m.profile == "llama" else 0.8 - 0.6 * depth
        a = df["ratio"].to_numpy()[rows][:, None]  # [n, 1]
        rigid = (halluc[rows] & ~glob[rows])[:, None] & (depth >= 0.5)
        cons = prof - 0.1 * a - spec.rigidity_drop * rigid + rng.normal(0, 0.05, (n, L))  # [n, L]
        cons = np.clip(np.round(cons * H) / H, 1 / H, 1)
        rho = np.clip(np.round((1.0 + 1 / H - cons + rng.normal(0, 0.03, (n, L))) * H) / H, 1 / H, 1)
        G = H // m.group_size  # KV groups
        cons_g = np.clip(np.round(cons * G) / G, 1 / G, 1)
        rho_g = np.clip(np.round((1.0 + 1 / G - cons_g) * G) / G, 1 / G, 1)
        mass = out["evidence_attention_mass"].to_numpy()[rows][:, None] * rng.uniform(0.5, 1.5, (n, L))
        cosine = 1 - 0.3 * a * depth - 0.1 * halluc[rows][:, None] * depth
        signal = 2.5 * np.exp(-3 * a)  # [n, 1]
        probe = centers[type_idx[rows]] * signal + rng.normal(0, 1, (n, spec.probe_dims))
        for name, arr in (("consensus_nosink", cons), ("rho_nosink", rho), ("consensus_group_nosink", cons_g),
                          ("rho_group_nosink", rho_g), ("consensus_withsink", np.maximum(cons - 1 / H, 1 / H)),
                          ("rho_withsink", np.minimum(rho + 1 / H, 1)), ("evidence_mass_layer", mass),
                          ("hidden_cosine", cosine), ("probe_features", probe)):
            vals = arr.round(4).tolist()
            for j, r in enumerate(rows):
                cols[name][r] = vals[j]
    for name, vals in cols.items():
        out[name] = vals


def _routed_fields(spec: SyntheticSpec, df: pd.DataFrame, out: pd.DataFrame) -> None:
    """The layer-max test's companions: the pooled reading (insensitive: it finds a share of the
    layer-max routes only) and where the layer-max test won (``routed_layer`` 1 … L, ``routed_kind``).
    From their own generator, so every other field is the same as without them."""
    rng = np.random.default_rng([spec.seed, 15])
    n = len(df)
    reach = out["routed_reachable"].to_numpy(dtype=bool)
    layers = np.array([m.layers for m in spec.models])[df["_mi"].to_numpy()]
    out["routed_reachable_pooled"] = reach & (rng.random(n) < 0.4)
    out["routed_layer"] = np.floor(rng.uniform(0.3, 0.9, n) * layers).astype(int) + 1
    out["routed_kind"] = np.where(rng.random(n) < 0.7, "direct", "rollout")


def _lens_vectors(spec: SyntheticSpec, df: pd.DataFrame, out: pd.DataFrame, glob: np.ndarray) -> None:
    rng = np.random.default_rng([spec.seed, 14])
    cands: list = [None] * len(df)
    gold_lp: list = [None] * len(df)
    for mi, m in enumerate(spec.models):
        rows = np.flatnonzero(df["_mi"].to_numpy() == mi)
        n, L = len(rows), m.layers
        a = df["ratio"].to_numpy()[rows]
        margin = np.where(glob[rows], 0.0, 2.0 * np.exp(-3 * a))[:, None, None]  # [n, 1, 1]
        late = (np.linspace(0, 1, L) >= 0.5)[None, None, :]
        x = rng.normal(-9, 2, (n, 1, L)) + rng.normal(0, 1, (n, 3, L))  # shared (question) part + noise
        x[:, :1] += margin * late
        vals = x.round(4).tolist()
        for j, r in enumerate(rows):
            cands[r], gold_lp[r] = vals[j], vals[j][0]
    out["lens_candidates"] = cands
    out["lens_gold_logprob"] = gold_lp
    out["lens_gold_logprob_final"] = [v[-1] for v in gold_lp]
    out["lens_n_candidates"] = 3
    out["lens_candidates_dropped"] = 0


def synthetic_keep_mask(*, layers: int = 16, kv_heads: int = 4, tokens: int = 96, ratio: float = 0.8,
                        evidence: tuple[int, ...] = tuple(range(40, 52)), answer: tuple[int, ...] = (44, 45),
                        seed: int = 0) -> dict:
    """A plausible keep-mask ``[L, Hkv, T]`` (per-head top-k of random scores, evidence favoured in
    early layers) with its evidence/answer positions and token strings, for the survival heatmap."""
    rng = np.random.default_rng(seed)
    scores = rng.random((layers, kv_heads, tokens))  # [L, Hkv, T]
    depth = np.linspace(1, 0, layers)[:, None, None]  # [L, 1, 1]: early layers favour the evidence
    scores[:, :, list(evidence)] += 0.6 * depth * rng.random((layers, kv_heads, len(evidence)))
    k = max(1, int(round((1 - ratio) * tokens)))
    top = np.argsort(-scores, axis=2)[:, :, :k]  # [L, Hkv, k]
    keep = np.zeros((layers, kv_heads, tokens), bool)
    np.put_along_axis(keep, top, True, axis=2)
    words = ["Maren", " Osk", "vold", " was", " born", " in", " <b>Vel", "kirra</b>", " in", " 1974", ".", " She"]
    toks = [f"t{i}" for i in range(tokens)]
    for j, p in enumerate(evidence):
        toks[p] = words[j % len(words)]
    return {"keep": keep, "evidence": list(evidence), "answer": list(answer), "tokens": toks}
