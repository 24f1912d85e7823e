"""α* against model size: does the cliff move to higher ratios as models grow, and what does that predict?

The paper reports its cliff near α ≈ 0.9 on 3–14B models. Smaller models can be run anywhere, so the
question a user asks of a sweep over several sizes is whether α* rises with the parameter count N and,
if so, where the trend puts a 3B, 7B or 14B model.

Per (press, regime, family) — each task family, and the families pooled (``family = "all"``) when every model ran
the same instances, so that the pooled curves compare one family mix (with different instance sets the pooled
row says so and gives no trend); the long-context family is left to :mod:`kvroute.analysis.context` — each
model's cliff is fitted exactly as :mod:`kvroute.analysis.cliff`
fits it (same sigmoid, same edge rules). Across models:

* trend: the least-squares line of ``logit(α*)`` on ``log10 N`` (the logit keeps every prediction
  inside (0, 1); a line in α itself would cross 1 when extrapolated). ``slope`` is the change of
  ``logit α*`` per tenfold parameters.
* intervals: a percentile bootstrap over instances. When every model ran the same instances (the
  sweep generates them from the same seeds) a replicate resamples the instances *jointly* for all
  models, so a hard instance stays hard in every model; otherwise each model resamples its own.
  A replicate counts only when every model's α* is identified in it; ``boot_valid`` is that share,
  and below ``min_valid`` no interval is given (the verdict says the data cannot decide).
* verdict: ``rises with size`` / ``falls with size`` when the slope's interval excludes 0 *and* its
  bootstrap p-value survives Holm's adjustment over the table's rows, ``no detectable trend``
  otherwise, ``cannot decide`` when fewer than ``min_models`` models have an identified α*, too
  few replicates do, or fewer than :data:`MIN_FAMILY_SIZES` of the models are sizes of one family
  (two models — Qwen2.5-Coder-0.5B and -1.5B — are a difference of two models, and their interval
  covers instance sampling only). Parameter counts are the model cards' (:func:`zoo_params`).
* projection: the fitted line at each of ``targets`` parameters with its interval, and whether that
  interval contains the paper's α ≈ 0.9 (``paper_alpha``). An extrapolation beyond the largest model
  measured: it holds only if the trend stays log-linear, and it says so.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd

from kvroute.analysis.bootstrap import instance_matrix, percentile_interval, resample_weights
from kvroute.analysis.cliff import CurveResult, alpha_star_interval, analyse_matrix
from kvroute.analysis.common import ALL, AnalysisError, as_key, attach_baseline, group_seed, pooled, require_columns
from kvroute.analysis.paired import holm
from kvroute.analysis.sigmoid import MIN_AMPLITUDE, OK

#: sizes of one model family needed before a line through them is called a size trend
MIN_FAMILY_SIZES = 3
#: the paper's cliff on 3–14B models (its abstract: "near 90% compression")
PAPER_ALPHA = 0.9
#: parameter counts the trend is projected to (the paper's model sizes)
TARGETS: tuple[float, ...] = (3e9, 7e9, 14e9)
SIZE_KEYS: tuple[str, ...] = ("press", "regime", "family")
EXCLUDED_FAMILIES: tuple[str, ...] = ("long_context",)
BY_MODEL_COLUMNS: tuple[str, ...] = ("model", "params", "n_instances", "status", "reason", "alpha_star",
                                     "alpha_star_low", "alpha_star_high", "h0")


def zoo_params() -> dict[str, int]:
    """Parameter counts of the zoo's models by name, as their model cards give them (the loaded GGUF may count a
    separate output head: Qwen2.5-Coder-0.5B loads as 630M against its card's 0.49B)."""
    from kvroute.models.zoo import ZOO

    return {name: int(entry.size) for name, entry in ZOO.items()}


def zoo_families() -> dict[str, str]:
    """The architecture of each zoo model by name: sizes compare only within one family."""
    from kvroute.models.zoo import ZOO

    return {name: entry.architecture for name, entry in ZOO.items()}


def record_params(df: pd.DataFrame) -> dict[str, int]:
    """Parameter counts by model: the zoo's card count for a zoo model, else the records' ``model_params``
    (written by every run since it was added)."""
    out: dict[str, int] = {}
    if "model_params" in df.columns:
        counts = pd.to_numeric(df["model_params"], errors="coerce")
        for m, n in counts.groupby(df["model"]).max().dropna().items():
            out[str(m)] = int(n)
    return {**out, **zoo_params()}


def _logit(a: np.ndarray) -> np.ndarray:
    a = np.clip(np.asarray(a, float), 1e-6, 1 - 1e-6)
    return np.log(a / (1 - a))


def _expit(z: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-np.asarray(z, float)))


def _line(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Least-squares ``(intercept, slope)`` of each row of ``y`` ``[B, M]`` on ``x`` ``[M]``."""
    xc = x - x.mean()
    slope = (y - y.mean(axis=1, keepdims=True)) @ xc / (xc @ xc)
    return y.mean(axis=1) - slope * x.mean(), slope


def cliff_vs_size(df: pd.DataFrame, params: Mapping[str, int] | None = None, *, keys: Sequence[str] = SIZE_KEYS,
                  value_col: str = "hallucinated", n_boot: int = 1000, confidence: float = 0.95, seed: int = 0,
                  targets: Sequence[float] = TARGETS, paper_alpha: float = PAPER_ALPHA, min_models: int = 2,
                  min_valid: float = 0.5, exclude_families: Sequence[str] = EXCLUDED_FAMILIES,
                  min_amplitude: float = MIN_AMPLITUDE, families: Mapping[str, str] | None = None,
                  min_family_sizes: int = MIN_FAMILY_SIZES) -> tuple[pd.DataFrame, pd.DataFrame]:
    """α* per model and its trend against the parameter count, per group of ``keys``.

    ``params`` maps a record's ``model`` to its parameter count (default: the records' ``model_params``, else the
    zoo's); models without one are listed with ``status = "no parameter count"`` and left out of the trend. Returns
    ``(by_model, trends)``: ``by_model`` one row per (group, model) with ``params``, ``n_instances``,
    ``status``, ``alpha_star`` and its interval; ``trends`` one row per group with at least two models:
    ``n_models``, ``models``, ``slope`` (logit α* per decade) with ``slope_low``/``_high``, ``boot_valid``,
    ``joint`` (instances resampled jointly), ``verdict``, ``reason``, and per target ``pred_<N>`` with
    ``pred_<N>_low``/``_high`` and ``pred_<N>_has_paper`` (the interval contains ``paper_alpha``).
    Both frames are empty when no group has two sized models.
    """
    keys = list(keys)
    params = record_params(df) if params is None else dict(params)
    data = attach_baseline(df)
    require_columns(data, [value_col, "model", "instance_id", *keys], "α* against model size")
    if "family" in data.columns:
        data = data[~data["family"].isin(list(exclude_families))]
        if "family" in keys:
            data = pooled(data)  # family "all": every model's curve over the same family mix (checked below)
    rows: list[dict] = []
    trends: list[dict] = []
    for key, grp in data.groupby(keys, sort=True):
        k = as_key(keys, key)
        models = sorted(grp["model"].unique(), key=lambda m: (params.get(m, np.inf), m))
        if len(models) < min_models:
            continue
        mats = {}
        for m in models:
            if m not in params:
                rows.append({**k, "model": m, "params": None, "status": "no parameter count",
                             "reason": f"{m!r}: its records carry no model_params and it is not a zoo model"})
                continue
            ids, ratios, sums, counts = instance_matrix(grp[grp["model"] == m], value_col)
            if len(ratios) == 0:
                rows.append({**k, "model": m, "params": params[m], "status": "no_data",
                             "reason": f"no non-null {value_col!r} values"})
                continue
            mats[m] = (ids, ratios, sums, counts)
        if len(mats) < min_models:
            continue
        id_sets = [tuple(v[0]) for v in mats.values()]
        joint = all(s == id_sets[0] for s in id_sets)
        if k.get("family") == ALL and not joint:
            trends.append({**k, **_trend({}, params, confidence=confidence, targets=targets, paper_alpha=paper_alpha,
                                         min_models=min_models, min_valid=min_valid), "joint": False,
                           "verdict": "cannot decide",
                           "reason": "the models ran different instances, so their pooled curves compare family "
                                     "mixes; read the per-family rows"})
            continue
        shared = resample_weights(len(id_sets[0]), n_boot, group_seed(seed, ("size", key))) if joint else None
        results: dict[str, CurveResult] = {}
        for m, (ids, ratios, sums, counts) in mats.items():
            w = shared if shared is not None else resample_weights(len(ids), n_boot, group_seed(seed, ("size", key, m)))
            try:
                res = analyse_matrix(ratios, sums, counts, w, min_amplitude=min_amplitude,
                                     rng=group_seed(seed, ("size-ties", key, m)))
            except AnalysisError as e:
                rows.append({**k, "model": m, "params": params[m], "status": "no_data", "reason": str(e)})
                continue
            results[m] = res
            row = {**k, "model": m, "params": params[m], "n_instances": res.n_instances, "status": res.fit.status,
                   "reason": res.fit.reason, "alpha_star": res.fit.alpha_star, "alpha_star_low": None,
                   "alpha_star_high": None, "h0": float(res.h[0]) if res.ratios[0] == 0 else None}
            if res.fit.ok:
                lo, hi, _, note = alpha_star_interval(res.alpha_reps, confidence, res.alpha_codes)
                row.update(alpha_star_low=lo, alpha_star_high=hi)
                if note:
                    row["reason"] = f"{row['reason']}; {note}"
            rows.append(row)
        trends.append({**k, **_trend(results, params, confidence=confidence, targets=targets,
                                     paper_alpha=paper_alpha, min_models=min_models, min_valid=min_valid),
                       "joint": joint})
    by_model = pd.DataFrame(rows)
    if not by_model.empty:  # every column present even when no model could be fitted
        by_model = by_model.reindex(columns=[*keys, *BY_MODEL_COLUMNS])
    fams = {**zoo_families(), **(families or {})}
    return by_model, _decide(pd.DataFrame(trends), fams, min_family_sizes, 1 - confidence)


def _decide(trends: pd.DataFrame, fams: Mapping[str, str], min_family_sizes: int, alpha: float) -> pd.DataFrame:
    """The verdicts the data decide: a trend needs ``min_family_sizes`` sizes of one model family (two models are a
    difference of two models, whatever their sizes), and "rises"/"falls" must survive Holm's adjustment over the
    table's rows (the verdicts are many)."""
    if trends.empty:
        return trends
    t = trends.copy()
    p = pd.to_numeric(t.get("p_value"), errors="coerce") if "p_value" in t else pd.Series(np.nan, index=t.index)
    ok = p.notna().to_numpy()
    adj = np.full(len(t), np.nan)
    if ok.any():
        adj[ok] = holm(p[ok].to_numpy(float))
    t["p_holm"] = adj
    for i, r in t.iterrows():
        names = [m.strip() for m in str(r.get("models") or "").split(",") if m.strip()]
        by_family: dict[str, int] = {}
        for m in names:
            by_family[fams.get(m, m)] = by_family.get(fams.get(m, m), 0) + 1
        most = max(by_family.values(), default=0)
        if r["verdict"] in ("rises with size", "falls with size", "no detectable trend") and most < min_family_sizes:
            t.loc[i, "verdict"] = "cannot decide"
            t.loc[i, "reason"] = (f"{len(names)} models, at most {most} of one family: a line through them is a "
                                  f"difference of models, not a size trend (at least {min_family_sizes} sizes of one "
                                  f"family are needed); {r['reason']}")
        elif r["verdict"] in ("rises with size", "falls with size") and not adj[t.index.get_loc(i)] <= alpha:
            t.loc[i, "verdict"] = "no detectable trend"
            t.loc[i, "reason"] = (f"the slope's interval excludes 0, but not after Holm's adjustment over the "
                                  f"{int(ok.sum())} trend rows (p = {adj[t.index.get_loc(i)]:.3g}); {r['reason']}")
    return t


def target_label(n: float) -> str:
    """``3e9`` → ``"3B"``, ``1.5e9`` → ``"1.5B"``, ``5e8`` → ``"500M"``."""
    return f"{n / 1e9:.3g}B" if n >= 1e9 else f"{n / 1e6:.3g}M"


def _trend(results: Mapping[str, CurveResult], params: Mapping[str, int], *, confidence: float,
           targets: Sequence[float], paper_alpha: float, min_models: int, min_valid: float) -> dict[str, object]:
    fitted = {m: r for m, r in results.items() if r.fit.ok}
    out: dict[str, object] = {"n_models": len(fitted), "models": ", ".join(fitted), "slope": None,
                              "slope_low": None, "slope_high": None, "boot_valid": None}
    for t in targets:
        lab = target_label(t)
        out.update({f"pred_{lab}": None, f"pred_{lab}_low": None, f"pred_{lab}_high": None,
                    f"pred_{lab}_has_paper": None})
    if len(fitted) < min_models:
        missing = [m for m in results if m not in fitted]
        return {**out, "verdict": "cannot decide",
                "reason": f"α* is identified for {len(fitted)} model(s); at least {min_models} are needed"
                          + (f" ({', '.join(missing)}: no identified cliff)" if missing else "")}
    x = np.log10([params[m] for m in fitted])
    a = np.array([float(r.fit.alpha_star or 0.0) for r in fitted.values()])  # ok fits have a midpoint
    b0, b1 = _line(x, _logit(a)[None, :])
    out["slope"] = float(b1[0])
    tx = np.log10(np.asarray(targets, float))
    for t, p in zip(targets, _expit(b0[0] + b1[0] * tx), strict=True):
        out[f"pred_{target_label(t)}"] = float(p)
    reps = np.stack([r.alpha_reps for r in fitted.values()], axis=1)
    codes = np.stack([r.alpha_codes for r in fitted.values()], axis=1)
    ok = (codes == OK).all(axis=1) & np.isfinite(reps).all(axis=1)
    out["boot_valid"] = float(ok.mean())
    if ok.mean() < min_valid:
        return {**out, "verdict": "cannot decide",
                "reason": f"only {ok.mean():.0%} of bootstrap replicates identify α* in every model "
                          f"(at least {min_valid:.0%} needed)"}
    rb0, rb1 = _line(x, _logit(reps[ok]))
    lo, hi = (float(v) for v in percentile_interval(rb1, confidence))
    out.update(slope_low=lo, slope_high=hi,
               p_value=float(min(1.0, 2 * min((1 + (rb1 <= 0).sum()) / (len(rb1) + 1),
                                              (1 + (rb1 >= 0).sum()) / (len(rb1) + 1)))))
    preds = _expit(rb0[:, None] + rb1[:, None] * tx[None, :])  # [B, targets]
    plo, phi = percentile_interval(preds, confidence)
    for j, t in enumerate(targets):
        lab = target_label(t)
        out.update({f"pred_{lab}_low": float(plo[j]), f"pred_{lab}_high": float(phi[j]),
                    f"pred_{lab}_has_paper": bool(plo[j] <= paper_alpha <= phi[j])})
    if lo > 0:
        verdict, why = "rises with size", "larger models keep answering to higher ratios"
    elif hi < 0:
        verdict, why = "falls with size", "larger models fail at lower ratios"
    else:
        verdict, why = "no detectable trend", "the slope's interval contains 0: these sizes cannot tell a trend apart"
    span = f"{target_label(10 ** x.min())}–{target_label(10 ** x.max())}"
    note = (f"{why}; fitted on {len(fitted)} models ({span}); projections beyond {target_label(10 ** x.max())} "
            "assume the trend stays log-linear in N")
    if ok.mean() < 1:
        note += f"; intervals over the {ok.mean():.0%} of replicates that identify α* in every model"
    return {**out, "verdict": verdict, "reason": note}
