"""Restoration maps across failures: the averaged map with instance-bootstrap intervals, the minimal repairing
sets' sizes, and whether those sets agree across instances (kvroute.restore_map computes one map per failure).

- :func:`load_maps` rebuilds every map in a map store (``RUN_DIR/restore_map/``) from its records.
- :func:`averaged_map`: per (layer, KV head), the mean effect over a press and ratio's failures, with a 95%
  percentile interval from resampling instances (each instance one map).
- :func:`set_agreement`: the mean pairwise Jaccard index of the instances' minimal repairing sets, against a
  permutation null that relabels each set's slots at random (each instance's set replaced by as many slots
  drawn uniformly without replacement): p = (1 + null draws ≥ observed) / (1 + draws).
- :func:`retrieval_kv_map`: the retrieval-head map at KV-head resolution (the best score of the query heads a
  KV head serves), to set beside the averaged map (Spearman ρ over slots).
- :func:`restore_map_finding`: the sentence the report and the docs quote, written from these numbers.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from itertools import combinations
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from kvroute.analysis.common import AnalysisError

if TYPE_CHECKING:
    from kvroute.restore_map import RestoreMap

Slot = tuple[int, int]


def load_maps(store: str | Path, target: str = "answer") -> list[RestoreMap]:
    """Every complete map in a map store, one per (model, instance, press, ratio), in the store's order."""
    from kvroute.errors import KvrouteError
    from kvroute.restore_map import map_from_records
    from kvroute.sweep.store import iter_records

    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    full: dict[tuple[Any, ...], dict[str, Any]] = {}
    for r in iter_records(store):
        k = (r.get("model"), r.get("instance_id"), r.get("regime"), r.get("seed"))
        if r.get("press") == "none":
            full[k] = r
        else:
            groups.setdefault((*k, r.get("press"), r.get("ratio")), []).append(r)
    out = []
    for key, recs in groups.items():
        if key[:4] not in full:
            continue
        try:
            m = map_from_records([full[key[:4]], *recs], target)
        except KvrouteError:
            continue  # a map still being computed (or another target's cells only)
        out.append(m)
    return out


def averaged_map(maps: Sequence[RestoreMap], *, n_boot: int = 1000, seed: int = 0) -> pd.DataFrame:
    """Per slot: the mean effect over ``maps`` (each a failure of one instance), its 95% instance-bootstrap
    interval (NaN with fewer than 2 maps: one instance has no spread to resample), the share of maps where the
    slot alone repairs, and n (maps with a finite effect there)."""
    if not maps:
        raise AnalysisError("no restore maps to average")
    shapes = {tuple(m.effect.shape) for m in maps}
    if len(shapes) != 1:
        raise AnalysisError(f"restore maps of different shapes {sorted(shapes)}: one model at a time")
    eff = np.stack([m.effect.numpy() for m in maps])  # [N, L, Hkv]
    rep = np.stack([m.repaired.numpy() for m in maps]).astype(float)
    N, L, Hkv = eff.shape
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, N, size=(n_boot, N))  # resampled instances
    with np.errstate(all="ignore"):
        mean = np.nanmean(eff, axis=0)
        boot = np.nanmean(eff[idx], axis=1)  # [n_boot, L, Hkv]
        lo, hi = np.nanpercentile(boot, 2.5, axis=0), np.nanpercentile(boot, 97.5, axis=0)
    if N < 2:
        lo, hi = np.full_like(mean, np.nan), np.full_like(mean, np.nan)
    rows = [{"layer": a, "kv_head": b, "effect": float(mean[a, b]), "low": float(lo[a, b]), "high": float(hi[a, b]),
             "repair_share": float(rep[:, a, b].mean()), "n": int(np.isfinite(eff[:, a, b]).sum())}
            for a in range(L) for b in range(Hkv)]
    return pd.DataFrame(rows)


def jaccard(a: Iterable[Slot], b: Iterable[Slot]) -> float:
    sa, sb = set(a), set(b)
    return len(sa & sb) / len(sa | sb) if sa | sb else 1.0


def _mean_pairwise(sets: Sequence[set[Slot]]) -> float:
    return float(np.mean([jaccard(x, y) for x, y in combinations(sets, 2)]))


def p_text(p: float) -> str:
    """A permutation p-value in words: "p < 0.001" below the third decimal (never "p = 0.000")."""
    return "p < 0.001" if p < 0.001 else f"p = {p:.3f}"


def set_agreement(sets: Sequence[Iterable[Slot]], slots: int, *, n_perm: int = 2000, seed: int = 0) -> dict[str, Any]:
    """Mean pairwise Jaccard of ``sets`` (minimal repairing sets, one per instance, none empty) among ``slots``
    (L × Hkv) against the permutation null (each set's slots relabelled at random, sizes kept)."""
    ss = [set(s) for s in sets]
    if len(ss) < 2:
        return {"sets": len(ss), "jaccard": math.nan, "null": math.nan, "null_q95": math.nan, "p": math.nan}
    obs = _mean_pairwise(ss)
    rng = np.random.default_rng(seed)
    null = np.empty(n_perm)
    for i in range(n_perm):
        drawn = [{(int(k), 0) for k in rng.choice(slots, size=len(s), replace=False)} for s in ss]
        null[i] = _mean_pairwise(drawn)
    return {"sets": len(ss), "jaccard": obs, "null": float(null.mean()), "null_q95": float(np.quantile(null, 0.95)),
            "p": float((1 + (null >= obs - 1e-12).sum()) / (1 + n_perm))}


def minimal_sizes(maps: Sequence[RestoreMap]) -> dict[str, Any]:
    """How many slots the minimal repairing sets need: median and range over the maps that have one, and how many
    have none (even every slot at once does not repair)."""
    sizes = [len(m.minimal) for m in maps if m.minimal is not None and m.failure]
    none = sum(m.minimal is None for m in maps if m.failure)
    return {"failures": sum(m.failure for m in maps), "with_set": len(sizes), "without_set": none,
            "median": float(np.median(sizes)) if sizes else math.nan, "min": min(sizes) if sizes else None,
            "max": max(sizes) if sizes else None}


def retrieval_kv_map(df: pd.DataFrame, model: str, L: int, Hkv: int) -> np.ndarray | None:
    """The model's retrieval scores (kvroute.analysis.retrieval) at KV-head resolution ``[L, Hkv]``: each KV head's
    best query head; None when the records carry no retrieval metric for the model."""
    from kvroute.analysis.retrieval import retrieval_scores

    if "retrieval_hits" not in df.columns:
        return None
    sc = retrieval_scores(df)
    sc = sc[sc["model"] == model]
    if sc.empty or not np.isfinite(sc["score"]).any():
        return None
    H = int(sc["head"].max()) + 1
    if H % Hkv or int(sc["layer"].max()) + 1 != L:
        return None
    out = np.zeros((L, Hkv))
    for r in sc.itertuples():
        out[int(r.layer), int(r.head) // (H // Hkv)] = max(out[int(r.layer), int(r.head) // (H // Hkv)], r.score)
    return out


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    from scipy.stats import spearmanr

    ok = np.isfinite(a) & np.isfinite(b)
    return float(spearmanr(a[ok], b[ok]).statistic) if ok.sum() > 2 else math.nan


def restore_map_finding(press: str, ratio: float, avg: pd.DataFrame, sizes: dict[str, Any],
                        agree: dict[str, Any]) -> str:
    """One sentence: where the answer must be, how many slots repair, whether the sets agree across instances."""
    top = avg.sort_values("effect", ascending=False).iloc[0]
    sig = avg[avg["low"] > 0]
    n = int(top["n"])
    interval = "" if math.isnan(top["low"]) else f" [{top['low']:.2f}, {top['high']:.2f}]"
    text = (f"{press} at α = {ratio:g}, {sizes['failures']} failure{'s' if sizes['failures'] != 1 else ''}: "
            f"restoring the answer in slot {int(top['layer'])}.{int(top['kv_head'])} alone recovers "
            f"{top['effect']:.2f}{interval} of the full cache's gold log-probability on average (n = {n}), the largest "
            f"of the map's {len(avg)} slots; " + (f"{len(sig)} slots have an interval above 0. " if interval else
                                                   "one failure gives no interval. "))
    if sizes["with_set"]:
        text += (f"{sizes['with_set']} failures have a minimal repairing set (median {sizes['median']:g} slots, range "
                 f"{sizes['min']}–{sizes['max']}); {sizes['without_set']} are not repaired even with every slot. ")
    else:
        text += f"None of the {sizes['failures']} failures is repaired even with every slot. "
    if math.isnan(agree.get("jaccard", math.nan)):
        text += "Too few minimal sets to compare across instances."
    elif agree["p"] < 0.05:
        text += (f"The {agree['sets']} sets agree across instances more than chance: mean pairwise Jaccard "
                 f"{agree['jaccard']:.2f} against {agree['null']:.2f} under the permutation null "
                 f"({p_text(agree['p'])}).")
    else:
        text += (f"The {agree['sets']} sets do not agree across instances more than chance: mean pairwise Jaccard "
                 f"{agree['jaccard']:.2f} against {agree['null']:.2f} under the permutation null "
                 f"({p_text(agree['p'])}).")
    return text
