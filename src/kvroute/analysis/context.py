"""α* against context length: does the cliff sit at a fixed *ratio* or a fixed *budget* of kept tokens?

The long-context family is run at several lengths T. Per length bin we fit the cliff in ratio
space (α*) and convert it to kept-token space, ``budget* = (1 − α*) · T`` (the bin's median T).
The map α → (1 − α)·T is linear inside a bin, so a logistic in α is a logistic in budget and the
midpoints correspond exactly; the bootstrap interval converts the same way.

Two ways to answer "fixed ratio or fixed budget?":

* spread: the coefficient of variation across lengths of the kept fraction ``1 − α*`` against that
  of ``budget*`` — whichever is steadier describes the cliff better (both are unit-free);
* elasticity: the least-squares slope β of ``log budget*`` on ``log T``. β = 0 means a fixed
  budget, β = 1 a fixed ratio. Its percentile interval comes from refitting the slope on
  bootstrap replicates (each length bin resampled over its own instances).

Verdict, an equivalence test on β: ``fixed budget`` when the whole β interval lies within
:data:`EQUIVALENCE_MARGIN` of 0, ``fixed ratio`` when it lies within the margin of 1 (an interval
that merely *contains* 1, such as [0.51, 1.35], does not show a fixed ratio: it also allows a
budget that grows half as fast as T); ``between`` when it lies strictly inside (0, 1) and
outside both margins; otherwise ``inconclusive`` (the reason says which laws the interval still
allows). At least ``min_lengths`` bins with a fitted α* are needed.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from kvroute.analysis.bootstrap import percentile_interval
from kvroute.analysis.cliff import alpha_star_interval, analyse_curve
from kvroute.analysis.common import PRESS_KEYS, AnalysisError, as_key, attach_baseline, require_columns
from kvroute.analysis.sigmoid import MIN_AMPLITUDE

#: how close to 0 (fixed budget) or 1 (fixed ratio) the whole β interval must lie for either verdict
EQUIVALENCE_MARGIN = 0.3

LONG_CONTEXT = "long_context"


def length_bins(tokens: pd.Series, edges: Sequence[float] | None = None) -> pd.Series:
    """A bin label (the bin's median T, int) for each context length.

    Default bins are half octaves (T within a factor √2 share a bin), which groups a generator's
    nominal lengths (e.g. 512, 1024, 2048) even when the realised token counts wobble around them.
    """
    t = pd.to_numeric(tokens, errors="coerce").astype(float)
    if edges is not None:
        bins = pd.cut(t, bins=list(edges), include_lowest=True)
    else:
        bins = np.round(2 * np.log2(t.where(t > 0)))
    med = t.groupby(bins, observed=True).transform("median")
    return med.round().astype("Int64")


def cliff_vs_length(df: pd.DataFrame, *, family: str = LONG_CONTEXT, keys: Sequence[str] = PRESS_KEYS,
                    value_col: str = "hallucinated", n_boot: int = 1000, confidence: float = 0.95, seed: int = 0,
                    edges: Sequence[float] | None = None, min_lengths: int = 3,
                    min_amplitude: float = MIN_AMPLITUDE) -> tuple[pd.DataFrame, pd.DataFrame]:
    """α* and budget* per context-length bin, and the fixed-ratio/fixed-budget verdict per group.

    Returns ``(by_length, verdicts)``; both are empty when the records have no ``family`` cells.
    ``by_length``: one row per (group, length bin) with ``T``, ``alpha_star`` (+ interval),
    ``budget_star`` (+ interval), ``status``, ``reason``. ``verdicts``: one row per group with
    ``n_lengths``, ``cv_kept``, ``cv_budget``, ``steadier``, ``beta``, ``beta_low``, ``beta_high``,
    ``verdict`` and ``reason``.
    """
    keys = list(keys)
    data = attach_baseline(df)
    require_columns(data, [value_col, "context_tokens", *keys], "α* against context length")
    data = data[data["family"] == family].copy()
    if data.empty:
        return pd.DataFrame(), pd.DataFrame()
    # baseline cells carry the same context_tokens as the instance's compressed cells
    data["T"] = length_bins(data["context_tokens"], edges)
    rows, verdicts = [], []
    for key, grp in data.groupby(keys, sort=True):
        k = as_key(keys, key)
        reps_by_len: dict[int, np.ndarray] = {}
        group_rows: list[dict] = []
        for t, cells in grp.groupby("T", sort=True):
            try:
                res = analyse_curve(cells, value_col=value_col, n_boot=n_boot, seed_key=(key, int(t)), seed=seed,
                                    min_amplitude=min_amplitude)
            except AnalysisError as e:
                group_rows.append({**k, "T": int(t), "status": "no_data", "reason": str(e)})
                continue
            row = {**k, "T": int(t), "n_instances": res.n_instances, "status": res.fit.status, "reason": res.fit.reason,
                   "alpha_star": res.fit.alpha_star, "alpha_star_low": None, "alpha_star_high": None,
                   "budget_star": None, "budget_star_low": None, "budget_star_high": None}
            if res.fit.ok:
                lo, hi, _, note = alpha_star_interval(res.alpha_reps, confidence, res.alpha_codes)
                a = float(res.fit.alpha_star)  # type: ignore[arg-type]
                row.update(alpha_star_low=lo, alpha_star_high=hi, budget_star=(1 - a) * t,
                           budget_star_low=None if hi is None else (1 - hi) * t,
                           budget_star_high=None if lo is None else (1 - lo) * t)
                if note:
                    row["reason"] = f"{row['reason']}; {note}"
                reps_by_len[int(t)] = res.alpha_reps
            group_rows.append(row)
        rows.extend(group_rows)
        fitted = [r for r in group_rows if r.get("alpha_star") is not None]
        verdicts.append({**k, **_verdict(fitted, reps_by_len, confidence, min_lengths)})
    return pd.DataFrame(rows), pd.DataFrame(verdicts)


def _slope(log_t: np.ndarray, log_b: np.ndarray) -> float:
    x = log_t - log_t.mean()
    return float((x * (log_b - log_b.mean())).sum() / (x * x).sum())


def _cv(v: np.ndarray) -> float:
    return float(np.std(v, ddof=1) / np.mean(v)) if len(v) > 1 and np.mean(v) > 0 else float("nan")


def _verdict(fitted: list[dict], reps_by_len: dict[int, np.ndarray], confidence: float,
             min_lengths: int) -> dict[str, object]:
    out: dict[str, object] = {"n_lengths": len(fitted), "cv_kept": None, "cv_budget": None, "steadier": None,
                              "beta": None, "beta_low": None, "beta_high": None}
    if len(fitted) < min_lengths:
        return {**out, "verdict": "inconclusive",
                "reason": f"α* was fitted at {len(fitted)} context length(s); at least {min_lengths} are needed"}
    t = np.array([r["T"] for r in fitted], float)
    a = np.array([r["alpha_star"] for r in fitted], float)
    kept, budget = 1 - a, (1 - a) * t
    out.update(cv_kept=_cv(kept), cv_budget=_cv(budget))
    out["steadier"] = "budget" if out["cv_budget"] < out["cv_kept"] else "ratio"  # type: ignore[operator]
    if np.any(budget <= 0):
        return {**out, "verdict": "inconclusive", "reason": "α* at 1 leaves no budget; the elasticity is undefined"}
    out["beta"] = _slope(np.log(t), np.log(budget))
    reps = np.stack([reps_by_len[int(x)] for x in t], axis=1)  # [n_boot, n_lengths]
    ok = np.isfinite(reps).all(axis=1) & (reps < 1).all(axis=1)
    if ok.mean() < 0.5:
        return {**out, "verdict": "inconclusive", "reason": "too few bootstrap replicates show a cliff at every length"}
    betas = np.array([_slope(np.log(t), np.log((1 - r) * t)) for r in reps[ok]])
    lo, hi = (float(v) for v in percentile_interval(betas, confidence))
    out.update(beta_low=lo, beta_high=hi)
    m = EQUIVALENCE_MARGIN
    if -m <= lo and hi <= m:
        verdict, why = "fixed budget", "the cliff sits at a steady number of kept tokens across lengths"
    elif 1 - m <= lo and hi <= 1 + m:
        verdict, why = "fixed ratio", "the cliff sits at a steady compression ratio across lengths"
    elif m < lo and hi < 1 - m:
        verdict, why = "between", "the critical budget grows with T, but less than proportionally"
    else:
        allows = [name for name, v in (("a fixed budget", 0.0), ("a fixed ratio", 1.0)) if lo <= v <= hi]
        verdict, why = "inconclusive", (f"the elasticity's interval is not within ±{m:g} of either law"
                                        + (f" (it allows {' and '.join(allows)}, but also more)" if allows else ""))
    return {**out, "verdict": verdict,
            "reason": f"{why} (β = {out['beta']:.2f}, {confidence:.0%} CI {lo:.2f}–{hi:.2f})"}
