"""Report figures about the cliff: H(α) with bands and α*, α* against context length, GER vs H."""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from kvroute.analysis.cliff import MAX_ALPHA_WIDTH
from kvroute.analysis.sigmoid import sigmoid
from kvroute.report.render import MAX_PANELS, color_map, panels, plain_label, short


def _curve_label(row: pd.Series | dict, with_regime: bool) -> str:
    label = short(row["press"], 32)
    return f"{label} ({plain_label(row['regime'])})" if with_regime else label


def _num(v: object) -> float | None:
    return float(v) if v is not None and not pd.isna(v) else None  # type: ignore[arg-type]


def cliff_figure(curves: pd.DataFrame, cliffs: pd.DataFrame, *, family: str = "all") -> Figure | None:
    """One panel per model: H(α) per press with its 95% band, the fitted sigmoid, α* and its interval."""
    if curves is None or curves.empty:
        return None
    fam = family if (curves["family"] == family).any() else curves["family"].iloc[0]
    cur = curves[curves["family"] == fam]
    fits = cliffs[cliffs["family"] == fam] if cliffs is not None and not cliffs.empty else pd.DataFrame()
    models = sorted(cur["model"].unique())[:MAX_PANELS]
    colors = color_map(sorted(cur["press"].unique()))
    with_regime = cur["regime"].nunique() > 1
    fig, axes = panels(len(models), sharey=True)
    for ax, model in zip(axes, models, strict=True):
        for (press, regime), g in cur[cur["model"] == model].groupby(["press", "regime"], sort=True):
            c = colors[press]
            style = "-" if regime == sorted(cur["regime"].unique())[0] else "--"
            label = _curve_label({"press": press, "regime": regime}, with_regime)
            ax.fill_between(g["ratio"], g["h_low"], g["h_high"], color=c, alpha=0.15, linewidth=0)
            ax.plot(g["ratio"], g["h"], style, marker="o", ms=3.5, color=c, label=label)
            f = (fits[(fits["model"] == model) & (fits["press"] == press) & (fits["regime"] == regime)]
                 if not fits.empty else fits)
            if f.empty:
                continue
            f = f.iloc[0]
            a = _num(f.get("alpha_star"))
            if a is not None:
                x = np.linspace(g["ratio"].min(), g["ratio"].max(), 200)
                ax.plot(x, sigmoid(x, f["lo"], f["hi"] - f["lo"], f["k"], a), ":", color=c, lw=1)
                ax.axvline(a, color=c, lw=1, alpha=0.8)
                lo, hi = _num(f.get("alpha_star_low")), _num(f.get("alpha_star_high"))
                if lo is not None or hi is not None:  # an open end is drawn to the grid's edge, hatched
                    x0, x1 = float(g["ratio"].min()), float(g["ratio"].max())
                    ax.axvspan(x0 if lo is None else lo, x1 if hi is None else hi, color=c, alpha=0.08,
                               hatch=None if lo is not None and hi is not None else "//")
            m = _num(f.get("alpha_half"))
            if m is not None:
                ax.axvline(m, color=c, lw=1, ls="--", alpha=0.6)
            s = _num(f.get("safe_ratio"))
            if s is not None:
                ax.plot([s], [0], marker="^", color=c, ms=8, clip_on=False, zorder=5)
        ax.set_title(short(model, 50))
        ax.set_xlabel("compression ratio α")
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("hallucination rate H(α)")
    axes[0].legend(fontsize=8, loc="upper left")
    # two lines: one would be wider than a one-panel figure (constrained layout does not shrink a suptitle)
    fig.suptitle(f"Hallucination cliff ({plain_label(fam)})\nband = 95% bootstrap CI, vertical line = α*, "
                 f"shaded = its CI (hatched = open-ended), dashed = monotone α½, ▲ = safe ratio", fontsize=10)
    return fig


def caused_cliff_figure(caused: pd.DataFrame, curves: pd.DataFrame, cliffs_caused: pd.DataFrame, *,
                        family: str = "all") -> Figure | None:
    """The opening figure: one small panel per (model, press) — H(α) among the instances right uncompressed (the
    hallucination compression causes, 0 at α = 0) with its 95% band, every instance's H(α) in grey beside it, the
    uncompressed rate marked, and the caused curve's halfway crossing with its interval where the data decide it."""
    if caused is None or caused.empty:
        return None
    fam = family if (caused["family"] == family).any() else caused["family"].iloc[0]
    cur = caused[caused["family"] == fam]
    allc = curves[curves["family"] == fam] if curves is not None and not curves.empty else pd.DataFrame()
    fits = (cliffs_caused[cliffs_caused["family"] == fam] if cliffs_caused is not None and not cliffs_caused.empty
            else pd.DataFrame())
    keys = sorted({(m, p, r) for m, p, r in zip(cur["model"], cur["press"], cur["regime"], strict=True)})[:MAX_PANELS]
    colors = color_map(sorted(cur["press"].unique()))
    with_model = cur["model"].nunique() > 1
    fig, axes = panels(len(keys), ncols=min(len(keys), 4), width=2.9, height=1.85, sharey=True)
    for ax, (model, press, regime) in zip(axes, keys, strict=True):
        g = cur[(cur["model"] == model) & (cur["press"] == press) & (cur["regime"] == regime)]
        c = colors[press]
        if not allc.empty:
            a = allc[(allc["model"] == model) & (allc["press"] == press) & (allc["regime"] == regime)]
            if not a.empty:
                ax.plot(a["ratio"], a["h"], "-", color="0.6", lw=1, label="all instances")
                h0 = a.loc[a["ratio"] == 0, "h"]
                if len(h0):
                    ax.axhline(float(h0.iloc[0]), color="0.6", lw=0.8, ls=":", label="all, uncompressed")
        ax.fill_between(g["ratio"], g["h_low"], g["h_high"], color=c, alpha=0.2, linewidth=0)
        n = int(g["n_instances"].iloc[0]) if len(g) else 0
        ax.plot(g["ratio"], g["h"], "-", marker="o", ms=3, color=c, label=f"right uncompressed (n = {n})")
        f = (fits[(fits["model"] == model) & (fits["press"] == press) & (fits["regime"] == regime)]
             if not fits.empty else fits)
        if not f.empty:
            f = f.iloc[0]
            m, lo, hi = _num(f.get("alpha_half")), _num(f.get("alpha_half_low")), _num(f.get("alpha_half_high"))
            if m is not None:
                ax.axvline(m, color=c, lw=1, ls="--")
                if (f.get("alpha_half_identified") == "identified" and lo is not None and hi is not None
                        and hi - lo <= MAX_ALPHA_WIDTH):  # decided intervals only: no band spans the plot
                    ax.axvspan(lo, hi, color=c, alpha=0.08)
        title = short(press, 30) + (f" · {short(model, 16)}" if with_model else "")
        ax.set_title(title, fontsize=9)
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
        ax.tick_params(labelsize=8)
    axes[0].set_ylabel("H(α)")
    axes[0].legend(fontsize=7, loc="upper left")
    for ax in axes[-min(4, len(axes)):]:
        ax.set_xlabel("compression ratio α", fontsize=8)
    fig.suptitle("Hallucination caused by compression: H(α) among the instances right uncompressed (95% band); "
                 "grey = every instance; dashed = halfway crossing", fontsize=9)
    return fig


def context_figure(by_length: pd.DataFrame, verdicts: pd.DataFrame) -> Figure | None:
    """α* and the critical budget (1 − α*)·T against the context length T, per model and press."""
    if by_length is None or by_length.empty or by_length["alpha_star"].notna().sum() == 0:
        return None
    fig, (ax_a, ax_b) = panels(2, width=5.2)
    groups = list(by_length.groupby(["model", "press", "regime"], sort=True))
    colors = color_map([k for k, _ in groups])
    for key, g in groups:
        g = g.dropna(subset=["alpha_star"]).sort_values("T")
        if g.empty:
            continue
        label = short(f"{key[0]} · {key[1]}", 44)
        c = colors[key]
        a_err = np.array([g["alpha_star"] - g["alpha_star_low"].astype(float),
                          g["alpha_star_high"].astype(float) - g["alpha_star"]])
        b_err = np.array([g["budget_star"] - g["budget_star_low"].astype(float),
                          g["budget_star_high"].astype(float) - g["budget_star"]])
        # a point estimate may lie outside its percentile interval (skewed replicates): draw no bar on that side
        ax_a.errorbar(g["T"], g["alpha_star"], yerr=np.clip(np.nan_to_num(a_err), 0, None), marker="o", color=c,
                      capsize=3, label=label)
        ax_b.errorbar(g["T"], g["budget_star"], yerr=np.clip(np.nan_to_num(b_err), 0, None), marker="o", color=c,
                      capsize=3, label=label)
    for ax, ylabel in ((ax_a, "α* (ratio at the cliff)"), (ax_b, "budget* = (1 − α*)·T kept tokens")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("context length T (tokens)")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3, which="both")
    ax_a.legend(fontsize=7)
    title = "α* against context length — a flat right panel means a fixed budget, a flat left one a fixed ratio"
    fig.suptitle(title, fontsize=10)
    return fig


def ger_figure(points: pd.DataFrame, corr: pd.DataFrame, *, family: str = "all") -> Figure | None:
    """Mean GER against hallucination rate, one point per ratio, per model panel, r in the legend."""
    if points is None or points.empty:
        return None
    fam = family if (points["family"] == family).any() else points["family"].iloc[0]
    pts = points[points["family"] == fam]
    models = sorted(pts["model"].unique())[:MAX_PANELS]
    colors = color_map(sorted(pts["press"].unique()))
    with_regime = pts["regime"].nunique() > 1
    fig, axes = panels(len(models), sharey=True)
    for ax, model in zip(axes, models, strict=True):
        for i, ((press, regime), g) in enumerate(pts[pts["model"] == model].groupby(["press", "regime"], sort=True)):
            g = g.sort_values("ratio")
            r = corr[(corr["model"] == model) & (corr["press"] == press) & (corr["regime"] == regime)
                     & (corr["family"] == fam)]
            pr = _num(r["pearson_r"].iloc[0]) if not r.empty else None
            label = (_curve_label({"press": press, "regime": regime}, with_regime)
                     + (f"  r = {pr:.2f}" if pr is not None else "  r n/a"))
            ax.plot(g["ger"], g["h"], "-o", ms=4, color=colors[press], label=label, alpha=0.85)
            for _, p in g.iterrows() if i == 0 else ():  # ratio labels on the first curve only
                ax.annotate(f"{p['ratio']:g}", (p["ger"], p["h"]), fontsize=6, xytext=(3, -8),
                            textcoords="offset points")
        ax.set_title(short(model, 50))
        ax.set_xlabel("mean GER (answer tokens)")
        ax.set_xlim(-0.02, 1.02)
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper left")
    axes[0].set_ylabel("hallucination rate")
    fig.suptitle("GER against hallucination across the ratio grid (labels = ratio; Pearson r pooled over ratios, "
                 "confounded by α)", fontsize=10)
    return fig


def size_figure(by_model: pd.DataFrame, trends: pd.DataFrame, *, paper_alpha: float = 0.9) -> Figure | None:
    """α* against the parameter count, one panel per task family: a point per (model, press) with its interval, the
    fitted logit-linear trend carried to the paper's sizes with the projection's interval there, and the paper's α*."""
    if by_model is None or by_model.empty or by_model["alpha_star"].notna().sum() == 0:
        return None
    fams = [f for f in sorted(by_model["family"].unique()) if by_model.loc[by_model["family"] == f, "alpha_star"]
            .notna().any()][:MAX_PANELS]
    fig, axes = panels(len(fams), width=5.2)
    groups = sorted({(p, r) for p, r in zip(by_model["press"], by_model["regime"], strict=True)})
    colors = color_map(groups)
    with_regime = len({r for _, r in groups}) > 1
    for ax, fam in zip(axes, fams, strict=False):
        sub = by_model[by_model["family"] == fam]
        for j, (press, regime) in enumerate(groups):
            g = sub[(sub["press"] == press) & (sub["regime"] == regime)].dropna(subset=["alpha_star"])
            if g.empty:
                continue
            g = g.sort_values("params")
            c = colors[(press, regime)]
            # spread the presses a little sideways so their bars do not hide each other
            x = g["params"].astype(float) * 10 ** (0.03 * (j - (len(groups) - 1) / 2))
            lo = g["alpha_star_low"].astype(float).fillna(g["alpha_star"])
            hi = g["alpha_star_high"].astype(float).fillna(g["alpha_star"])
            err = np.clip(np.array([g["alpha_star"] - lo, hi - g["alpha_star"]]), 0, None)
            label = _curve_label({"press": press, "regime": regime}, with_regime)
            ax.errorbar(x, g["alpha_star"], yerr=err, marker="o", ls="none", color=c, capsize=3, label=label)
            tr = trends[(trends["press"] == press) & (trends["regime"] == regime) & (trends["family"] == fam)] \
                if trends is not None and not trends.empty else pd.DataFrame()
            if tr.empty or _num(tr.iloc[0].get("slope")) is None:
                continue
            t = tr.iloc[0]
            targets = [c_[5:] for c_ in t.index if c_.startswith("pred_") and c_.count("_") == 1]
            sizes = [_size_of(lab) for lab in targets]
            raw = [_num(t[f"pred_{lab}"]) for lab in targets]
            if not sizes or any(p is None for p in raw):
                continue
            preds = np.array(raw, dtype=float)
            slope = float(t["slope"])
            z0 = np.log(preds[0] / (1 - preds[0])) - slope * np.log10(sizes[0])
            xs = np.logspace(np.log10(g["params"].min()), np.log10(max(sizes)), 60)
            ax.plot(xs, 1 / (1 + np.exp(-(z0 + slope * np.log10(xs)))), color=c, ls=":", lw=1)
            p_lo = [_num(t.get(f"pred_{lab}_low")) for lab in targets]
            p_hi = [_num(t.get(f"pred_{lab}_high")) for lab in targets]
            if all(v is not None for v in p_lo + p_hi):
                lo_a, hi_a = np.array(p_lo, dtype=float), np.array(p_hi, dtype=float)
                perr = np.clip(np.array([preds - lo_a, hi_a - preds]), 0, None)
                ax.errorbar(np.array(sizes) * 10 ** (0.03 * (j - (len(groups) - 1) / 2)), preds, yerr=perr,
                            marker="o", mfc="white", ls="none", color=c, capsize=3)
        ax.axhline(paper_alpha, color="0.3", ls="--", lw=1, label=f"paper: α* ≈ {paper_alpha:g} (3–14B)")
        ax.set_xscale("log")
        ax.set_xlabel("parameters")
        ax.set_ylabel("α* (ratio at the cliff)")
        ax.set_title(plain_label(fam), fontsize=9)
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7)
    fig.suptitle("α* against model size — filled: measured (95% CI); hollow: the trend's projection (95% CI)",
                 fontsize=10)
    return fig


def _size_of(label: str) -> float:
    """``"3B"`` → 3e9, ``"500M"`` → 5e8 (the inverse of :func:`kvroute.analysis.size.target_label`)."""
    return float(label[:-1]) * (1e9 if label.endswith("B") else 1e6)
