"""The GER–hallucination link: a within-instance test at matched ratios (the headline) and the paper's pooled r.

**Within instance, at matched ratios (headline), :func:`within_ratio_link`.** Per (model, press,
regime, family) group, over compressed cells (ratio > 0) whose GER is defined, a conditional logit
of the cell's ``hallucinated`` flag on its ``ger`` with the instance as the stratum and one effect
per ratio (:mod:`kvroute.analysis.within_instance`)::

    logit P(H_ij = 1) = u_i + γ_ratio + β · GER_ij        (u_i conditioned away)

β is the change in log-odds per unit GER *for the same instance*, beyond what the ratio does to
every instance; ``or_per_tenth = exp(0.1 β)``. Why not compare cells of one ratio across
instances (the former headline, kept as ``slope_between``): instances differ in difficulty, and
attention scorers evict what a model ignores, so hard instances carry more eviction and fail
anyway; on a planted null with no causal effect where 40% of instances fail even uncompressed
and carry +0.15 GER, that fit read "raises H" in most sets (:mod:`kvroute.analysis.planted.ger_link`).
Why ``ger`` and not ``ger_all_layers``: ``ger`` is the headline GER of SCIENCE.md and the x axis
of the paper's r, and it is graded, so it varies between an instance's cells; ``ger_all_layers``
is nearly binary, and its information is used by the risk difference below.

The interval is a percentile interval of an **instance-clustered bootstrap** (instances resampled
with replacement, carrying all their cells; each replicate a weighted refit), and **separation is
checked in every replicate**: a separated replicate's slope is ±∞ its way, so an end of the
interval that such replicates reach is open (``or_per_tenth_low``/``_high`` 0 or ∞, printed
"open"), never the ridge's number; ``boot_separated`` is their share. The verdict follows the
interval ("raises H" only when it excludes no effect) and says plainly when the data cannot
decide: the interval spans 0, or too few informative cells/instances (an instance informs the
slope only when some but not all of its compressed cells hallucinate).

The **risk difference** P(H | evicted) − P(H | retained) uses "globally evicted" =
``ger_all_layers >= threshold`` (the same definition as the failure decomposition; at the default
threshold 1 it is identical to ``ger == 1``), averaged over ratio strata (ratio × family in the
families-pooled group) with Mantel–Haenszel weights ``n_evicted · n_retained / n``. It compares
*different* instances at one ratio, so it is labelled as confounded by instance difficulty and
never decides the verdict; its interval is from the same instance-clustered replicates.

**Pooled across ratios (comparison only), :func:`ger_hallucination_correlation`.** For each curve,
the mean GER and the hallucination rate at each ratio (baseline included) give one point per
ratio; Pearson and Spearman r with scipy's p-values over those ≤ 10 points. Both curves rise with
α, so r is high whether or not eviction matters at a given ratio (confounded by α), and the
p-value treats the ratio points as independent. It is kept to compare with the paper's r = 0.79–0.93.

**Conditional rates, :func:`conditional_hallucination`.** P(H | evicted) and P(H | retained)
*pooled over ratios* (labelled so: more eviction happens at higher α, where H is higher anyway),
with Fisher's exact p (cells treated as independent), next to the within-ratio (Mantel–Haenszel)
difference ``difference_within_ratio``.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import cast

import numpy as np
import pandas as pd
from scipy.special import expit

from kvroute.analysis.bootstrap import percentile_interval, resample_weights
from kvroute.analysis.common import (
    ALL,
    CURVE_KEYS,
    AnalysisError,
    as_key,
    attach_baseline,
    group_seed,
    pooled,
    require_columns,
)
from kvroute.analysis.within_instance import within_instance_slopes

GLOBAL_EVICTION_THRESHOLD = 1.0
#: ridge on the slope (a N(0, 1/ridge) prior: sd ≈ 32 log-odds per unit GER) — light, only against separation
RIDGE = 1e-3
#: ridge on the stratum intercepts: only keeps an intercept finite where a stratum's H is constant in a replicate
#: (a heavier one would pull large intercepts toward 0 and bias the slope)
INTERCEPT_RIDGE = 1e-6
#: below these the within-ratio verdict is "too few data"
MIN_CELLS = 20
MIN_INSTANCES = 5
_BLOCK = 250  # bootstrap replicates fitted together (bounds memory at [block, cells])


def correlate(x: Sequence[float], y: Sequence[float]) -> dict[str, object]:
    """Pearson and Spearman r (with p-values) of paired finite values; None and a reason when undefined."""
    from scipy import stats

    xa, ya = np.asarray(x, float), np.asarray(y, float)
    ok = np.isfinite(xa) & np.isfinite(ya)
    xs, ys = xa[ok], ya[ok]
    out: dict[str, object] = {"n_points": int(len(xs)), "pearson_r": None, "pearson_p": None,
                              "spearman_r": None, "spearman_p": None, "note": ""}
    if len(xs) < 3:
        out["note"] = f"need at least 3 ratios with both values, got {len(xs)}"
        return out
    if np.ptp(xs) == 0 or np.ptp(ys) == 0:
        out["note"] = "one of the series is constant; r is undefined"
        return out
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pr, pp = stats.pearsonr(xs, ys)
        sr, sp = stats.spearmanr(xs, ys)
    out.update(pearson_r=float(pr), pearson_p=float(pp), spearman_r=float(sr), spearman_p=float(sp))
    return out


def ger_hallucination_correlation(df: pd.DataFrame, *, ger_col: str = "ger", value_col: str = "hallucinated",
                                  keys: Sequence[str] = CURVE_KEYS,
                                  pool_families: bool = True) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Pooled (curve-level) correlation of mean GER and hallucination rate across the ratio grid, per group.

    Confounded by α by construction (see the module docstring); the within-ratio reading is
    :func:`within_ratio_link`. Returns ``(points, table)``: ``points`` has one row per (group, ratio)
    with ``ger`` and ``h``; ``table`` one row per group with ``n_points``, ``pearson_r``/``_p``,
    ``spearman_r``/``_p``, ``note``.
    """
    keys = list(keys)
    data = attach_baseline(df)
    require_columns(data, [ger_col, value_col, *keys], "the GER–hallucination correlation")
    if pool_families and "family" in keys:
        data = pooled(data)
    data = data.assign(_g=pd.to_numeric(data[ger_col], errors="coerce"),
                       _h=pd.to_numeric(data[value_col], errors="coerce").astype(float))
    points = (data.groupby([*keys, "ratio"], sort=True)
              .agg(ger=("_g", "mean"), h=("_h", "mean"), n_cells=("_h", "count"))
              .reset_index())
    rows = [{**as_key(keys, key), **correlate(g["ger"], g["h"])} for key, g in points.groupby(keys, sort=True)]
    return points, pd.DataFrame(rows)


# ---------------------------------------------------------------------------------------------
# the within-ratio model


def _by_stratum(values: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """Sums over each stratum's (contiguous) cells along the last axis: ``[..., n]`` → ``[..., S]``."""
    return np.add.reduceat(values, starts, axis=-1)


def fit_stratified_logit(y: np.ndarray, x: np.ndarray, strata: np.ndarray, weights: np.ndarray | None = None, *,
                         ridge: float = RIDGE, intercept_ridge: float = INTERCEPT_RIDGE, max_iter: int = 50,
                         tol: float = 1e-8) -> tuple[np.ndarray, np.ndarray]:
    """Ridge-penalised logistic regression ``logit P(y) = a[strata] + β x``, many weightings at once.

    ``y`` (0/1), ``x`` and ``strata`` (any sortable labels) are ``[n]``; ``weights`` is ``[B, n]``
    (case weights, e.g. bootstrap counts; default one row of ones). Penalty ``ridge/2 · β² +
    intercept_ridge/2 · Σ a_s²``. Newton–Raphson with the Hessian's arrow structure (diagonal in
    the intercepts) solved by its Schur complement, so each step costs O(B·n). Returns
    ``(beta [B], intercepts [B, S])`` with the strata in sorted order.
    """
    y = np.asarray(y, float)
    x = np.asarray(x, float)
    if not (np.isfinite(y).all() and np.isfinite(x).all()):
        raise AnalysisError("fit_stratified_logit needs finite y and x (drop cells with undefined GER first)")
    _, s = np.unique(np.asarray(strata), return_inverse=True)
    w = np.ones((1, len(y))) if weights is None else np.atleast_2d(np.asarray(weights, float))
    order = np.argsort(s, kind="stable")  # cells of one stratum contiguous, for reduceat
    y, x, s, w = y[order], x[order], s[order], w[:, order]
    starts = np.flatnonzero(np.r_[True, s[1:] != s[:-1]]) if len(s) else np.zeros(0, int)
    wn, wy = _by_stratum(w, starts), _by_stratum(w * y, starts)  # [B, S]
    a = np.log((wy + 0.5) / (wn - wy + 0.5))
    b = np.zeros(w.shape[0])
    live = np.arange(w.shape[0])  # replicates still iterating
    for _ in range(max_iter):
        wl, al, bl = w[live], a[live], b[live]
        mu = expit(al[:, s] + bl[:, None] * x)  # [b, n]
        r, v = wl * (y - mu), wl * mu * (1 - mu)
        vx = v * x
        g_a, g_b = _by_stratum(r, starts) - intercept_ridge * al, r @ x - ridge * bl
        d = _by_stratum(v, starts) + intercept_ridge  # [b, S]
        c = _by_stratum(vx, starts)
        e = vx @ x + ridge
        db = (g_b - (c * g_a / d).sum(1)) / np.maximum(e - (c * c / d).sum(1), 1e-12)
        da = (g_a - c * db[:, None]) / d
        db, da = np.clip(db, -5, 5), np.clip(da, -5, 5)
        b[live], a[live] = bl + db, al + da
        # converged: the slope step is tiny and so is every intercept step weighted by its information
        # (a stratum whose H is constant in a replicate has its intercept drift off with no information left)
        done = (np.abs(db) < tol) & (np.abs(da * np.sqrt(d)) < tol).all(1)
        live = live[~done]
        if not len(live):
            break
    return b, a


def _cluster_stratum_sums(values: np.ndarray, clusters: np.ndarray | None, s: np.ndarray, n_strata: int,
                          n_clusters: int | None = None) -> np.ndarray:
    """Sums of per-cell ``values`` per (cluster, stratum): ``[C, S]`` (each cell its own cluster when None)."""
    if clusters is None:
        out = np.zeros((len(s), n_strata))
        out[np.arange(len(s)), s] = values
        return out
    c = np.asarray(clusters)
    n_c = n_clusters if n_clusters is not None else (int(c.max()) + 1 if len(c) else 0)
    return np.bincount(c * n_strata + s, weights=values, minlength=n_c * n_strata).reshape(n_c, n_strata)


def mh_risk_difference(h: np.ndarray, evicted: np.ndarray, strata: np.ndarray, weights: np.ndarray | None = None,
                       clusters: np.ndarray | None = None) -> np.ndarray:
    """Mantel–Haenszel risk difference of ``h`` between evicted and retained cells over ``strata``.

    ``Σ_s (h1_s n0_s − h0_s n1_s) / n_s  /  Σ_s n1_s n0_s / n_s`` with (weighted) counts per stratum;
    one value per row of ``weights``; NaN where no stratum has both sides. ``weights`` is ``[B, n]``
    per cell, or ``[B, C]`` per cluster when ``clusters`` (``[n]`` int codes 0..C−1) is given.
    """
    h = np.asarray(h, float)
    ev = np.asarray(evicted, bool).astype(float)
    _, s = np.unique(np.asarray(strata), return_inverse=True)
    n_s = int(s.max()) + 1 if len(s) else 0
    size = len(h) if clusters is None else int(np.max(clusters)) + 1 if len(h) else 0
    w = np.ones((1, size)) if weights is None else np.atleast_2d(np.asarray(weights, float))
    n1, n0, h1, h0 = (w @ _cluster_stratum_sums(v, clusters, s, n_s, w.shape[1])
                      for v in (ev, 1 - ev, ev * h, (1 - ev) * h))
    n = np.where(n1 + n0 > 0, n1 + n0, 1.0)
    num, den = ((h1 * n0 - h0 * n1) / n).sum(1), (n1 * n0 / n).sum(1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, num / np.where(den > 0, den, 1.0), np.nan)


WITHIN_COLUMNS = ["n_cells", "n_instances", "n_strata", "n_cells_fit", "n_instances_fit", "n_strata_fit",
                  "n_undefined", "n_hallucinated", "n_evicted", "strata", "slope", "slope_low", "slope_high",
                  "slope_se", "or_per_tenth", "or_per_tenth_low", "or_per_tenth_high", "risk_difference",
                  "risk_difference_low", "risk_difference_high", "n_strata_rd", "boot_valid", "boot_separated",
                  "slope_between", "verdict", "note"]
#: what the headline slope conditions on (the ``strata`` column)
STRATA = "instance (conditional logit), with ratio effects"


def within_ratio_link(df: pd.DataFrame, *, ger_col: str = "ger", value_col: str = "hallucinated",
                      evicted_col: str = "ger_all_layers", threshold: float = GLOBAL_EVICTION_THRESHOLD,
                      keys: Sequence[str] = CURVE_KEYS, pool_families: bool = True, n_boot: int = 1000,
                      confidence: float = 0.95, seed: int = 0, ridge: float = RIDGE,
                      min_cells: int = MIN_CELLS, min_instances: int = MIN_INSTANCES) -> pd.DataFrame:
    """Does global eviction raise P(hallucination) *for the same instance* at matched ratios? One row per group.

    (The name is kept from the former, between-instance reading.) See the module docstring for the
    model. Columns (:data:`WITHIN_COLUMNS`): counts of compressed cells with defined GER
    (``n_cells``/``n_instances``/``n_strata``) and of those of the informative instances the slope
    uses (``*_fit``; ``n_strata_fit`` counts those instances), ``n_undefined`` (GER undefined: left
    out), ``strata`` (what the slope conditions on), ``slope`` (log-odds per unit GER) with its
    percentile interval (±∞ where separated replicates reach it) and bootstrap ``slope_se``,
    ``or_per_tenth`` = exp(0.1·slope) with its interval, the between-instance Mantel–Haenszel
    ``risk_difference`` evicted − retained with its interval and ``n_strata_rd`` (ratio strata with
    both sides), ``boot_valid`` (share of replicates that could be fitted), ``boot_separated``,
    ``slope_between`` (the former fit, for comparison), ``verdict`` ("raises H",
    "lowers H", "undecided", "too few data", "raises H (separated)", "lowers H (separated)",
    "no data") and a plain ``note``.
    When ``evicted_col`` is missing and ``threshold >= 1``, ``ger_col == 1`` stands in (the same
    cells); otherwise the risk difference is left empty.
    """
    keys = list(keys)
    data = attach_baseline(df)
    require_columns(data, [ger_col, value_col, *keys], "the within-ratio GER–hallucination test")
    families = data["family"].nunique()
    data = data.assign(_fam=data["family"])  # the cell's own family, kept when pooling relabels it "all"
    if pool_families and "family" in keys:
        data = pooled(data)
    data = data[(data["ratio"] > 0) & data[value_col].notna()]
    ev_all = None  # 1.0 evicted, 0.0 retained, NaN undefined (never "retained")
    if evicted_col in data.columns or threshold >= 1:
        col = pd.to_numeric(data[evicted_col if evicted_col in data.columns else ger_col], errors="coerce")
        ev_all = col.ge(threshold if evicted_col in data.columns else 1.0).astype(float).where(col.notna())
    data = data.assign(_g=pd.to_numeric(data[ger_col], errors="coerce"),
                       _h=data[value_col].astype(bool).astype(float),
                       _ev=ev_all if ev_all is not None else np.nan)
    rows = []
    for key, g in data.groupby(keys, sort=True):
        k = as_key(keys, key)
        by_family = families > 1 and k.get("family") == ALL
        rows.append({**k, **_within_one(g, by_family, ev_all is not None, n_boot=n_boot, confidence=confidence,
                                        rng=group_seed(seed, ("within_ratio", key)), ridge=ridge,
                                        min_cells=min_cells, min_instances=min_instances)})
    return pd.DataFrame(rows, columns=[*keys, *WITHIN_COLUMNS])


def _within_one(g: pd.DataFrame, by_family: bool, has_ev: bool, *, n_boot: int, confidence: float,
                rng: np.random.Generator, ridge: float, min_cells: int, min_instances: int) -> dict[str, object]:
    out: dict[str, object] = dict.fromkeys(WITHIN_COLUMNS)
    n_undef = int(g["_g"].isna().sum())
    g = g[g["_g"].notna()]
    stratum = ((g["ratio"].map("{:g}".format) + "|" + g["_fam"].astype(str)) if by_family
               else g["ratio"].map("{:g}".format))
    out.update(n_undefined=n_undef, n_cells=len(g), n_instances=int(g["instance_id"].nunique()),
               n_strata=int(stratum.nunique()), strata=STRATA,
               n_hallucinated=int(g["_h"].sum()), n_evicted=int((g["_ev"] > 0.5).sum()) if has_ev else None)
    if g.empty:
        out.update(verdict="no data", note="no compressed cell with a defined GER and an H value", n_cells_fit=0,
                   n_instances_fit=0, n_strata_fit=0, n_strata_rd=0)
        return out
    inst, inst_idx = np.unique(g["instance_id"].to_numpy(), return_inverse=True)
    _, s = np.unique(stratum.to_numpy(), return_inverse=True)
    y, x = g["_h"].to_numpy(float), g["_g"].to_numpy(float)
    if has_ev:  # the between-instance risk difference uses the cells whose evicted flag is defined
        e_ok = np.isfinite(g["_ev"].to_numpy(float))
        ev, y_ev, s_ev, c_ev = g["_ev"].to_numpy(float)[e_ok] > 0.5, y[e_ok], s[e_ok], inst_idx[e_ok]
        both = pd.DataFrame({"s": s_ev, "e": ev}).groupby("s")["e"].agg(["min", "max"])
        out["n_strata_rd"] = int((both["min"] < both["max"]).sum())
        out["risk_difference"] = _num(mh_risk_difference(y_ev, ev, s_ev)[0])
    # the headline slope: within instance (conditional logit, ratio effects), instance-clustered bootstrap
    w_inst = resample_weights(len(inst), n_boot, rng)  # [B, I]
    slopes, seps = [], []
    for lo in range(0, n_boot + 1, _BLOCK):
        block = np.vstack([np.ones((1, len(inst))), w_inst[:_BLOCK - 1]]) if lo == 0 else w_inst[lo - 1:lo - 1 + _BLOCK]
        if not len(block):
            break
        b, sep, sets = within_instance_slopes(x, y, g["ratio"].to_numpy(float), inst_idx, block, ridge=ridge)
        slopes.append(b)
        seps.append(sep)
    bs_all, sep_all = np.concatenate(slopes), np.concatenate(seps)
    fit = np.isin(inst_idx, sets.informative)
    out.update(n_cells_fit=int(fit.sum()), n_instances_fit=len(sets.informative), n_strata_fit=len(sets.informative))
    slope, separated = (None, False) if not np.isfinite(bs_all[0]) else (float(bs_all[0]), bool(sep_all[0]))
    if slope is not None:
        out.update(slope=slope, or_per_tenth=float(np.exp(0.1 * slope)))
        # a separated replicate's slope is set by the ridge: its maximum-likelihood value is ±∞ that way
        b1, s1 = bs_all[1:], sep_all[1:]
        bs = np.where(s1 & (b1 > 0), np.inf, np.where(s1 & (b1 < 0), -np.inf, b1))
        out["boot_valid"] = float(np.isfinite(bs_all[1:]).mean())
        out["boot_separated"] = float(sep_all[1:].mean())
        ok = ~np.isnan(bs)
        if ok.sum() >= 2:
            tail = (1 - confidence) / 2
            lo_, hi_ = np.quantile(bs[ok], tail, method="lower"), np.quantile(bs[ok], 1 - tail, method="higher")
            fin = bs[ok & np.isfinite(bs)]
            out.update(slope_low=float(lo_), slope_high=float(hi_),
                       slope_se=float(np.std(fin, ddof=1)) if len(fin) > 1 else None,
                       or_per_tenth_low=float(np.exp(0.1 * lo_)), or_per_tenth_high=float(np.exp(0.1 * hi_)))
    if has_ev:
        rds = [mh_risk_difference(y_ev, ev, s_ev, w_inst[lo:lo + _BLOCK].astype(float), clusters=c_ev)
               for lo in range(0, n_boot, _BLOCK)]
        br = np.concatenate(rds)
        if np.isfinite(br).sum() >= 2:
            lo_, hi_ = percentile_interval(br, confidence)
            out.update(risk_difference_low=float(lo_), risk_difference_high=float(hi_))
    out["slope_between"] = _between_slope(y, x, s, ridge)
    out["verdict"], out["note"] = _verdict(out, separated, min_cells, min_instances, confidence)
    return out


def _between_slope(y: np.ndarray, x: np.ndarray, s: np.ndarray, ridge: float) -> float | None:
    """The former headline, kept for comparison: the ratio-stratified slope that compares *different* instances
    at one ratio (confounded by instance difficulty)."""
    st = pd.DataFrame({"s": s, "y": y, "x": x}).groupby("s").agg(y_lo=("y", "min"), y_hi=("y", "max"),
                                                                  x_lo=("x", "min"), x_hi=("x", "max"))
    keep = np.isin(s, st.index[(st.y_lo < st.y_hi) & (st.x_lo < st.x_hi)].to_numpy())
    return float(fit_stratified_logit(y[keep], x[keep], s[keep], ridge=ridge)[0][0]) if keep.any() else None


def _verdict(o: dict[str, object], separated: bool, min_cells: int, min_instances: int,
             conf: float) -> tuple[str, str]:
    counts = (f"{o['n_cells_fit']} cells of {o['n_instances_fit']} informative instances (of {o['n_cells']} cells, "
              f"{o['n_instances']} instances; an instance informs the slope when some but not all of its cells "
              f"hallucinate)")
    if o["slope"] is None:
        return "too few data", f"no instance has both hallucinated and correct compressed cells; {counts}"
    if cast(int, o["n_cells_fit"]) < min_cells or cast(int, o["n_instances_fit"]) < min_instances:
        return "too few data", f"the data cannot decide: only {counts}"
    lo, hi = cast("float | None", o["slope_low"]), cast("float | None", o["slope_high"])
    if lo is None or hi is None:
        return "too few data", f"no bootstrap interval; {counts}"
    rd = ""
    if o["risk_difference"] is not None and o["risk_difference_low"] is not None:
        rd = (f"; between instances (confounded by instance difficulty) ΔP(H) evicted − retained "
              f"{o['risk_difference']:+.3f} [{o['risk_difference_low']:+.3f}, {o['risk_difference_high']:+.3f}]")
    ci = f"OR per +0.1 GER {o['or_per_tenth']:.2f} {or_interval(o['or_per_tenth_low'], o['or_per_tenth_high'])}"
    sep = ""
    if separated or cast(float, o.get("boot_separated") or 0) > 0:
        sep = (f"; GER separates H in {cast(float, o.get('boot_separated') or 0):.0%} of replicates"
               + (" and in the data, so the point estimate is held finite only by the ridge" if separated else "")
               + " (an interval end those replicates reach is open)")
    within = "within instance, at matched ratios"
    if lo > 0:
        return ("raises H (separated)" if separated else "raises H"), (
            f"{within}, more eviction → more hallucination: {ci}{sep}{rd}; {counts}")
    if hi < 0:
        return ("lowers H (separated)" if separated else "lowers H"), (
            f"{within}, more eviction → less hallucination: {ci}{sep}{rd}; {counts}")
    return "undecided", f"the data cannot decide: the {conf:.0%} interval spans no effect, {ci}{sep}{rd}; {counts}"


def or_interval(low: object, high: object) -> str:
    """An odds ratio's interval in words: an end that separated replicates push away from the rest to 0 or ∞ is
    ``open`` (the lower end at 0, the upper at ∞); an end pushed past the other side — every replicate separated
    one way, as when GER decides H in each resampled set — is that limit itself (``[∞, ∞]``, ``[0, 0]``).
    ``None`` stands for ∞ (summary.json cannot hold it)."""
    lo, hi = (float("inf") if v is None else float(cast(float, v)) for v in (low, high))
    if lo == hi and (lo == 0 or not np.isfinite(lo)):  # every replicate separated the same way
        return "[0, 0]" if lo == 0 else "[∞, ∞]"
    a = "open" if lo == 0 else ("∞" if not np.isfinite(lo) else f"{lo:.2f}")
    b = "open" if not np.isfinite(hi) else ("0" if hi == 0 else f"{hi:.2f}")
    return f"[{a}, {b}]"


def _num(v: float) -> float | None:
    return float(v) if np.isfinite(v) else None


def conditional_hallucination(df: pd.DataFrame, *, threshold: float = GLOBAL_EVICTION_THRESHOLD,
                              ger_col: str = "ger_all_layers", value_col: str = "hallucinated",
                              keys: Sequence[str] = CURVE_KEYS, by_ratio: bool = False,
                              pool_families: bool = True) -> pd.DataFrame:
    """P(hallucinated | globally evicted) vs P(hallucinated | not), over compressed cells, per group.

    ``p_h_evicted``, ``p_h_kept``, ``difference``, ``risk_ratio`` and ``fisher_p`` are **pooled over
    the ratios** of the group (confounded by α: eviction is commoner at high α, where H is higher
    anyway); ``difference_within_ratio`` is the Mantel–Haenszel difference over ratio strata (ratio ×
    family in the families-pooled group), ``n_strata_both`` the strata with evicted and retained
    cells. Cells with undefined GER are left out. ``by_ratio`` adds ``ratio`` to the keys (then the
    two differences coincide). None where a side is empty.
    """
    from scipy import stats

    keys = list(keys) + (["ratio"] if by_ratio else [])
    data = attach_baseline(df)
    require_columns(data, [ger_col, value_col, *keys], "P(hallucination | global eviction)")
    families = data["family"].nunique()
    data = data.assign(_fam=data["family"])
    if pool_families and "family" in keys:
        data = pooled(data)
    data = data[(data["ratio"] > 0) & data[ger_col].notna() & data[value_col].notna()]
    rows = []
    for key, g in data.groupby(keys, sort=True):
        k = as_key(keys, key)
        ev = pd.to_numeric(g[ger_col], errors="coerce").to_numpy(float) >= threshold
        h = g[value_col].astype(bool).to_numpy()
        a, b = int((ev & h).sum()), int((ev & ~h).sum())
        c, d = int((~ev & h).sum()), int((~ev & ~h).sum())
        p1 = a / (a + b) if a + b else None
        p0 = c / (c + d) if c + d else None
        fisher = float(stats.fisher_exact([[a, b], [c, d]])[1]) if (a + b) and (c + d) else None
        strata = g["ratio"].astype(str) + ("|" + g["_fam"].astype(str)
                                           if families > 1 and k.get("family") == ALL else "")
        both = pd.DataFrame({"s": strata.to_numpy(), "e": ev}).groupby("s")["e"].agg(["min", "max"])
        rows.append({**k, "n_evicted": a + b, "p_h_evicted": p1, "n_kept": c + d, "p_h_kept": p0,
                     "difference": None if p1 is None or p0 is None else p1 - p0,
                     "risk_ratio": None if p1 is None or not p0 else p1 / p0, "fisher_p": fisher,
                     "difference_within_ratio": _num(mh_risk_difference(h, ev, strata.to_numpy())[0]),
                     "n_strata_both": int((both["min"] < both["max"]).sum())})
    cols = [*keys, "n_evicted", "p_h_evicted", "n_kept", "p_h_kept", "difference", "risk_ratio", "fisher_p",
            "difference_within_ratio", "n_strata_both"]
    return pd.DataFrame(rows, columns=cols)
