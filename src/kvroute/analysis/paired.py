"""Ranking presses by paired comparison on shared instances: the press league's order.

Two presses of one (model, regime) answer the *same* instances at the *same* ratios, so the
question "which press hallucinates less?" is a paired one. Per instance ``i`` and press ``p``,
the **area** ``A_ip`` is the mean of the instance's hallucination flags over the common ratio grid
by the trapezoid rule, divided by the grid's width (so it is on H's own scale: 0 = never
hallucinates, 1 = always, over the grid). A press that holds out longer has the smaller area,
whatever the shape of its curve — no curve is fitted, and the shared ratio-0 baseline cancels in
the difference, so hard instances that fail uncompressed weigh on neither side.

* ``difference`` = mean over the pair's shared instances of ``d_i = A_ip − A_iq`` (negative: ``p``
  hallucinates less), with a percentile interval from a **paired instance bootstrap** (instances
  resampled with replacement, both presses' cells carried along) — for display only.
* The **decision** uses a **within-instance sign-flip randomization test**: under "the two presses
  are the same" the two curves of an instance are exchangeable, so each ``d_i`` is as likely to
  carry either sign; the p-value is the share of sign assignments whose ``|mean|`` reaches the
  observed one (exact enumeration up to :data:`EXACT_FLIPS` non-zero differences, otherwise
  Monte Carlo draws with the +1 correction). Unlike the percentile bootstrap, its size holds at
  small ``n`` (a bootstrap p called planted ties in 9% of sets at 32 instances).
* **Multiplicity**: the pairs of one (model, regime) are many verdicts from one table, so their
  p-values are adjusted by Holm's step-down method; a pair is *decided* only when its adjusted p
  is at most ``1 − confidence``. Otherwise it is a **tie**: the data cannot order the two presses.
* **Rank** of a press = 1 + the number of presses that beat it in a decided pair. Presses that
  share a rank are tied with each other or cannot be separated from the presses above them;
  ``rank_text`` names the presses each one beats, loses to and cannot be told apart from.

Presses are compared only on instances each of them has at every ratio of the common grid
(``n_shared``); a pair with fewer than ``min_instances`` such instances is undecided.
Validated on planted leagues of several curve shapes, answer churn and sizes
(tests/unit/test_analysis_paired.py, ``benchmarks/planted_truth.py``): the decided order is
reversed in at most 5% of sets, and presses planted equal are called different at most 5%.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import cast

import numpy as np
import pandas as pd

from kvroute.analysis.bootstrap import percentile_interval, resample_weights
from kvroute.analysis.common import BASELINE_PRESS, AnalysisError, attach_baseline, group_seed, require_columns

PAIR_COLUMNS = ["model", "regime", "press_a", "press_b", "n_shared", "n_ratios", "area_a", "area_b", "difference",
                "difference_low", "difference_high", "p_value", "p_holm", "decided", "better", "verdict"]
#: how presses are ordered, as stated in summary.json's settings
PAIRED_RULE = ("presses of one (model, regime) compared in pairs on the instances both have at every ratio of the "
               "common grid: the difference of the mean area under each instance's H(α) (trapezoid over the grid, "
               "divided by its width), a paired instance bootstrap interval, a within-instance sign-flip "
               "randomization p-value, Holm-adjusted over the pairs; a pair is decided when the adjusted "
               "p ≤ {alpha:g}, otherwise tied; rank = 1 + the number of presses that beat it")


def instance_areas(cells: pd.DataFrame, ratios: Sequence[float], value_col: str = "hallucinated") -> pd.Series:
    """Per instance, the normalised trapezoid area under its ``value_col`` over ``ratios`` (instances missing a
    ratio are left out). ``cells`` are one press's cells, baseline attached."""
    grid = np.asarray(sorted(ratios), float)
    if len(grid) < 2:
        raise AnalysisError("an area under H(α) needs at least two ratios")
    v = cells[cells["ratio"].isin(grid)].assign(_v=pd.to_numeric(cells[value_col], errors="coerce").astype(float))
    m = v.groupby(["instance_id", "ratio"])["_v"].mean().unstack("ratio").reindex(columns=grid).dropna()
    y = m.to_numpy(float)  # [I, C]
    area = ((y[:, 1:] + y[:, :-1]) / 2 * np.diff(grid)).sum(1) / (grid[-1] - grid[0])
    return pd.Series(area, index=m.index, name="area")


def holm(p: np.ndarray) -> np.ndarray:
    """Holm's step-down adjusted p-values (monotone, capped at 1)."""
    p = np.asarray(p, float)
    order = np.argsort(p)
    m = len(p)
    adj = np.maximum.accumulate((m - np.arange(m)) * p[order])
    out = np.empty(m)
    out[order] = np.minimum(adj, 1.0)
    return out


#: up to this many non-zero paired differences the sign-flip test enumerates every assignment (2**n)
EXACT_FLIPS = 12
#: the fewest random assignments a sign-flip p-value is drawn from, whatever ``n_draws`` asks: with the +1
#: correction the smallest p is 1 / (draws + 1), so with as many draws as bootstrap replicates (200 at
#: ``--n-boot 200``) no difference could ever pass a Holm adjustment over 16 comparisons — a "cannot decide"
#: made by the estimator's resolution, not by the data. At 10,000 the smallest p is 1e-4: decidable at 0.05
#: after Holm over up to 500 comparisons.
MIN_FLIP_DRAWS = 10_000
#: random assignments drawn at once (memory: this many × the number of differences)
FLIP_CHUNK = 2_000


def sign_flip_p(d: np.ndarray, *, n_draws: int, rng: np.random.Generator) -> float:
    """Two-sided p-value of the within-instance sign-flip randomization test of ``mean(d) = 0``.

    Exact when at most :data:`EXACT_FLIPS` differences are non-zero (zeros are the same under every
    flip), otherwise from ``max(n_draws, MIN_FLIP_DRAWS)`` random assignments with the +1 correction
    (valid at any ``n``).
    """
    d = np.asarray(d, float)
    nz = d[d != 0]
    if len(nz) == 0:
        return 1.0
    observed = abs(nz.sum()) * (1 - 1e-12)
    if len(nz) <= EXACT_FLIPS:
        signs = 1 - 2 * ((np.arange(2 ** len(nz))[:, None] >> np.arange(len(nz))) & 1)  # [2^n, n]
        return float(np.mean(np.abs(signs @ nz) >= observed))
    draws = max(int(n_draws), MIN_FLIP_DRAWS)
    hits = 0
    for start in range(0, draws, FLIP_CHUNK):
        signs = rng.choice(np.array([-1.0, 1.0]), size=(min(FLIP_CHUNK, draws - start), len(nz)))
        hits += int(np.sum(np.abs(signs @ nz) >= observed))
    return float((1 + hits) / (draws + 1))


def paired_sentence(who: str, evidence: str, decided_text: str, *, n: int, unit: str, min_instances: int,
                    decided: bool) -> str:
    """A paired comparison's finding: "cannot decide" below ``min_instances`` shared ``unit`` (instances,
    conversations) or when not decided, else ``decided_text``; ``evidence`` is the difference with its interval."""
    if n < min_instances:
        return f"{who}: cannot decide — only {n} shared {unit} (fewer than {min_instances})"
    if not decided:
        return f"{who}: cannot decide — {evidence}"
    return f"{who}: {decided_text}"


def compare_pair(a: pd.Series, b: pd.Series, *, n_boot: int, confidence: float,
                 rng: np.random.Generator) -> dict[str, object]:
    """The paired comparison of two presses' per-instance areas (see the module docstring)."""
    shared = a.index.intersection(b.index)
    d = (a.loc[shared] - b.loc[shared]).to_numpy(float)
    out: dict[str, object] = {"n_shared": len(d), "area_a": float(a.loc[shared].mean()) if len(d) else None,
                              "area_b": float(b.loc[shared].mean()) if len(d) else None}
    if len(d) < 2:
        return {**out, "difference": float(d.mean()) if len(d) else None, "p_value": 1.0}
    w = resample_weights(len(d), n_boot, rng)  # [B, I]
    reps = w @ d / len(d)
    lo, hi = percentile_interval(reps, confidence)
    p = sign_flip_p(d, n_draws=n_boot, rng=rng)
    return {**out, "difference": float(d.mean()), "difference_low": float(lo), "difference_high": float(hi),
            "p_value": float(p)}


def paired_comparisons(df: pd.DataFrame, *, value_col: str = "hallucinated", ratios: dict | None = None,
                       n_boot: int = 2000, confidence: float = 0.95, seed: int = 0,
                       min_instances: int = 10) -> pd.DataFrame:
    """Every pair of presses of each (model, regime), compared on shared instances (:data:`PAIR_COLUMNS`).

    ``df`` holds the records of one family pooling (one row per cell); ``ratios`` maps (model,
    regime) to the common grid (default: the ratios every press of the group was tested at).
    """
    data = attach_baseline(df)
    require_columns(data, [value_col, "instance_id", "ratio", "press", "model", "regime"], "the paired league")
    data = data[(data["press"] != BASELINE_PRESS) & data[value_col].notna()]
    alpha = 1 - confidence
    rows = []
    for (model, regime), g in data.groupby(["model", "regime"], sort=True):
        presses = sorted(g["press"].unique())
        grid = (ratios or {}).get((model, regime))
        if grid is None:
            grid = sorted(set.intersection(*(set(g.loc[g["press"] == p, "ratio"].astype(float)) for p in presses)))
        if len(presses) < 2 or len(grid) < 2:
            continue
        areas = {p: instance_areas(g[g["press"] == p], grid, value_col) for p in presses}
        group: list[dict[str, object]] = []
        for i, pa in enumerate(presses):
            for pb in presses[i + 1:]:
                rng = group_seed(seed, ("paired", model, regime, pa, pb))
                group.append({"model": model, "regime": regime, "press_a": pa, "press_b": pb, "n_ratios": len(grid),
                              **compare_pair(areas[pa], areas[pb], n_boot=n_boot, confidence=confidence, rng=rng)})
        adj = holm(np.array([r["p_value"] for r in group]))
        for r, ph in zip(group, adj, strict=True):
            enough = cast(int, r["n_shared"]) >= min_instances
            decided = bool(enough and ph <= alpha)
            better = (r["press_a"] if cast(float, r["difference"]) < 0 else r["press_b"]) if decided else None
            r.update(p_holm=float(ph), decided=decided, better=better)
            r["verdict"] = _verdict(r, decided, enough, min_instances)
            rows.append(r)
    return pd.DataFrame(rows, columns=PAIR_COLUMNS)


def _verdict(r: dict[str, object], decided: bool, enough: bool, min_instances: int) -> str:
    if not enough:
        return f"undecided: only {r['n_shared']} shared instances (fewer than {min_instances})"
    iv = (f"Δ area {r['difference']:+.3f} [{r.get('difference_low', float('nan')):+.3f}, "
          f"{r.get('difference_high', float('nan')):+.3f}], Holm p = {r['p_holm']:.3g}, {r['n_shared']} instances")
    if not decided:
        return f"tie: the data cannot order them ({iv})"
    worse = r["press_b"] if r["better"] == r["press_a"] else r["press_a"]
    return f"{r['better']} hallucinates less than {worse} over the grid ({iv})"


@dataclass
class Standing:
    """One press's record in the paired league of its (model, regime)."""

    beats: list[str] = field(default_factory=list)
    beaten_by: list[str] = field(default_factory=list)
    ties: list[str] = field(default_factory=list)

    @property
    def rank(self) -> int:
        return 1 + len(self.beaten_by)

    @property
    def text(self) -> str:
        parts = [f"beats {', '.join(self.beats)}" if self.beats else "",
                 f"beaten by {', '.join(self.beaten_by)}" if self.beaten_by else "",
                 f"tied with {', '.join(self.ties)}" if self.ties else ""]
        return "; ".join(p for p in parts if p) or "compared with no other press"


def paired_ranks(pairs: pd.DataFrame, presses: Sequence[str]) -> dict[str, Standing]:
    """Per press of one (model, regime), its :class:`Standing` from the pairs (rank = 1 + presses that beat it)."""
    out = {p: Standing() for p in presses}
    for r in pairs.to_dict(orient="records"):
        a, b = str(r["press_a"]), str(r["press_b"])
        if a not in out or b not in out:
            continue
        if r["decided"]:
            win, lose = (a, b) if r["better"] == a else (b, a)
            out[win].beats.append(lose)
            out[lose].beaten_by.append(win)
        else:
            out[a].ties.append(b)
            out[b].ties.append(a)
    return out
