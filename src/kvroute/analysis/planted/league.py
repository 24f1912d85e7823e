"""Planted truth for the press league: presses with known curves of several shapes, ranked by the paired rule.

Each simulated data set has ``n`` instances answered by two presses at every ratio of
:data:`RATIOS`. Instance ``i`` has a difficulty ``u_i ~ U(0, 1)`` shared by both presses and every
ratio: press ``p``'s cell at α hallucinates when ``u_i < H_p(α)`` (so each instance's flags rise
with α, and hard instances fail on every press — the instance effect a paired comparison must
cancel). **Churn**: each cell is, with probability ``churn``, redrawn as an independent
Bernoulli(H_p(α)) — answers that flip between ratios for no reason; the marginal H_p(α) is kept.

The shapes are not the logistic any estimator fits (:data:`SHAPES`): a late cliff (flat to 0.85,
then up), an early riser (linear from 0.5), a skewed rise (α⁶), an early-steep Gompertz, a two-step
cliff, a high baseline with a small amplitude. The truth of a pair is the sign of the difference of
the true areas under H(α) over the grid (the estimand of :mod:`kvroute.analysis.paired`); pairs
whose true areas differ by less than :data:`TIE_AREA` are planted ties, where any decided order is
a false call.

Rows per (pair, churn, n): ``correct_order`` (share of sets deciding the true order — power),
``reversal`` (share deciding the opposite order, or any order for a planted tie — must be ≤ 0.05),
and the same two for the former rule, the order by safe ratio (then α*), for comparison.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd

from kvroute.analysis.bootstrap import resample_weights
from kvroute.analysis.cliff import cliff_tables
from kvroute.analysis.paired import paired_comparisons, sign_flip_p

RATIOS: tuple[float, ...] = (0.0, 0.25, 0.5, 0.7, 0.8, 0.85, 0.9, 0.95)
TIE_AREA = 1e-9
N_BOOT = 400  # bootstrap replicates per simulated set (the report uses 2000)


def _clip(f: Callable[[np.ndarray], np.ndarray]) -> Callable[[np.ndarray], np.ndarray]:
    return lambda a: np.clip(f(np.asarray(a, float)), 0.0, 1.0)


#: planted H(α) per shape name (baseline 0.1 unless the shape says otherwise)
SHAPES: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "late_cliff": _clip(lambda a: 0.1 + 0.85 * (a > 0.85)),
    "early_riser": _clip(lambda a: 0.1 + 0.85 * np.clip((a - 0.5) / 0.45, 0, 1)),
    "skewed": _clip(lambda a: 0.1 + 0.85 * a ** 6),
    "gompertz": _clip(lambda a: 0.1 + 0.85 * np.exp(-np.exp(-12 * (a - 0.6)))),
    "two_step": _clip(lambda a: 0.1 + 0.4 * (a >= 0.7) + 0.45 * (a >= 0.9)),
    "high_baseline": _clip(lambda a: 0.69 + 0.26 * (a >= 0.85)),
    "high_baseline_early": _clip(lambda a: 0.69 + 0.26 * (a >= 0.7)),
}

#: the planted pairs: (press a, press b); the first is the finding of the estimator review (a late
#: cliff against an early riser, where the safe ratio put the worse press first), the last a tie
PAIRS: tuple[tuple[str, str], ...] = (("late_cliff", "early_riser"), ("skewed", "gompertz"),
                                      ("two_step", "early_riser"), ("high_baseline", "high_baseline_early"),
                                      ("skewed", "skewed"))


def true_area(shape: str) -> float:
    """The area under the planted H over :data:`RATIOS`, normalised by the grid's width."""
    x = np.asarray(RATIOS)
    y = SHAPES[shape](x)
    return float(((y[1:] + y[:-1]) / 2 * np.diff(x)).sum() / (x[-1] - x[0]))


def simulate(pair: tuple[str, str], n: int, churn: float, rng: np.random.Generator) -> pd.DataFrame:
    """One record set: both presses of ``pair`` (named ``a:<shape>`` and ``b:<shape>``) on ``n`` instances."""
    x = np.asarray(RATIOS)
    u = rng.random((n, 1))
    rows = []
    for tag, shape in zip("ab", pair, strict=True):
        h = SHAPES[shape](x)[None, :]  # [1, C]
        flags = u < h
        redraw = rng.random(flags.shape) < churn
        flags = np.where(redraw, rng.random(flags.shape) < h, flags)  # [n, C]
        for i in range(n):
            for j, r in enumerate(x):
                rows.append({"model": "planted", "regime": "agnostic", "family": "base", "press": f"{tag}:{shape}",
                             "instance_id": f"i{i}", "ratio": float(r), "hallucinated": bool(flags[i, j])})
    df = pd.DataFrame(rows)
    # one shared baseline: the ratio-0 cells of press a stand for the uncompressed run
    base = df[(df["ratio"] == 0) & df["press"].str.startswith("a:")].assign(press="none")
    return pd.concat([base, df[df["ratio"] > 0]], ignore_index=True)


def _safe_order(df: pd.DataFrame) -> str | None:
    """The former rule's winner: larger safe ratio, then larger α* (None on a full tie)."""
    c = cliff_tables(df, n_boot=100, pool_families=False)[1].set_index("press")
    c = c[c.index != "none"]
    key = [(float(c.loc[p, "safe_ratio"]), float(c.loc[p, "alpha_star"]) if c.loc[p, "status"] == "ok" else 2.0, p)
           for p in c.index]
    key.sort(reverse=True)
    return None if key[0][:2] == key[1][:2] else str(key[0][2])


def league_rates(pair: tuple[str, str], n: int, churn: float, n_sets: int, seed: int, *,
                 with_safe_rule: bool = False) -> dict[str, object]:
    """Correct-order and reversal rates of the paired rule (and optionally the safe-ratio rule) on one plant."""
    rng = np.random.default_rng([seed, n, int(churn * 1000), *(ord(ch) for ch in "".join(pair))])
    diff = true_area(pair[0]) - true_area(pair[1])
    truth = None if abs(diff) < TIE_AREA else ("a" if diff < 0 else "b")
    right = wrong = right_safe = wrong_safe = 0
    for _ in range(n_sets):
        df = simulate(pair, n, churn, rng)
        row = paired_comparisons(df, n_boot=N_BOOT, seed=int(rng.integers(2**31))).iloc[0]
        called = None if not row["decided"] else str(row["better"])[0]
        right += called is not None and called == truth
        wrong += called is not None and called != truth
        if with_safe_rule:
            s = _safe_order(df)
            s_called = None if s is None else s[0]
            right_safe += s_called is not None and s_called == truth
            wrong_safe += s_called is not None and s_called != truth
    out: dict[str, object] = {
        "estimator": "paired league", "parameter": "order", "truth": truth or "tie", "n_sets": n_sets,
        "pair": f"{pair[0]} vs {pair[1]}", "n_instances": n, "churn": churn, "true_area_difference": diff,
        "correct_order": right / n_sets if truth else None, "reversal": wrong / n_sets,
        "mean_estimate": None, "coverage": None}
    if with_safe_rule:
        out.update(safe_rule_correct=right_safe / n_sets if truth else None, safe_rule_reversal=wrong_safe / n_sets)
    out["note"] = ("reversal = a decided order opposite to the truth" if truth
                   else "planted tie: reversal = any decided order")
    return out


def bootstrap_p(d: np.ndarray, rng: np.random.Generator, n_boot: int = N_BOOT) -> float:
    """The mutant decision: the two-sided percentile-bootstrap p of the mean paired difference (the former rule)."""
    reps = resample_weights(len(d), n_boot, rng) @ d / len(d)
    return min(1.0, 2 * min((1 + (reps <= 0).sum()) / (n_boot + 1), (1 + (reps >= 0).sum()) / (n_boot + 1)))


def decision_size(n: int, n_sets: int, seed: int) -> dict[str, object]:
    """Size of the pair decision under a true null: paired area differences symmetric about 0, most of them 0
    (instances whose answers agree on both presses), as at small ``n`` in a real league. The sign-flip test must
    reject in ≤ 5% of sets; the mutant is the percentile-bootstrap p-value."""
    rng = np.random.default_rng([seed, n, 77])
    flip = boot = 0
    for _ in range(n_sets):
        d = rng.choice([-1, 0, 0, 0, 1], size=n) * rng.choice([0.2, 0.5, 1.0], size=n)
        flip += sign_flip_p(d, n_draws=N_BOOT, rng=rng) <= 0.05
        boot += bootstrap_p(d, rng) <= 0.05
    return {"estimator": "paired league", "parameter": "decision size", "truth": "tie", "n_sets": n_sets,
            "pair": "symmetric differences (null)", "n_instances": n, "churn": None, "true_area_difference": 0.0,
            "correct_order": None, "reversal": flip / n_sets, "mean_estimate": None, "coverage": None,
            "rejection_rate": flip / n_sets, "mutant_rejection_rate": boot / n_sets,
            "note": "a pair decided under a true null; the mutant decides by the percentile-bootstrap p"}


def coverage(n_sets: int = 200, seed: int = 0) -> list[dict]:
    """Rows over the planted pairs × churn {0, 0.06, 0.12} × instances {32, 64, 200} (see the module docstring),
    then the decision's size under a null at 10, 16 and 32 instances (10 × ``n_sets`` sets each)."""
    rows = []
    for pair in PAIRS:
        for churn in (0.0, 0.06, 0.12):
            for n in (32, 64, 200):
                rows.append(league_rates(pair, n, churn, n_sets, seed, with_safe_rule=(n == 64)))
    rows += [decision_size(n, 10 * n_sets, seed) for n in (10, 16, 32)]
    return rows
