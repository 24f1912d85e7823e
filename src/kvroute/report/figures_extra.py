"""Report figures for kvroute's own additions: redundancy, route selection, answer identity, the logit lens."""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from kvroute.report.render import MAX_PANELS, color_map, panels, short


def redundancy_figure(bins: pd.DataFrame | None, fits: pd.DataFrame | None) -> Figure | None:
    """Empirical P(reachable | k) with Wilson intervals and the fitted 1 − (1 − p)^k, per model."""
    if bins is None or bins.empty:
        return None
    models = sorted(bins["model"].unique())
    colors = color_map(models)
    fig, axes = panels(1, width=6.5)
    ax = axes[0]
    for m in models:
        b = bins[bins["model"] == m].sort_values("k_mean")
        yerr = np.vstack([b["p_reach"] - b["low"], b["high"] - b["p_reach"]])
        ax.errorbar(b["k_mean"], b["p_reach"], yerr=yerr, fmt="o", ms=4, capsize=2, color=colors[m],
                    label=f"{short(m, 30)} (empirical)")
        f = fits[fits["model"] == m] if fits is not None and not fits.empty else pd.DataFrame()
        if not f.empty and f["p"].iloc[0] is not None and not pd.isna(f["p"].iloc[0]):
            p = float(f["p"].iloc[0])
            k = np.linspace(0, max(1.0, float(b["k_mean"].max())), 200)
            ax.plot(k, 1 - (1 - p) ** k, "--", color=colors[m], label=f"1 − (1 − p)^k, p = {p:.3f}")
    ax.set_xscale("symlog", linthresh=4)
    ax.set_xlabel("k = (layer, KV head) pairs keeping an evidence token")
    ax.set_ylabel("P(evidence directly reachable)")
    ax.set_ylim(-0.02, 1.02)
    ax.legend(fontsize=8)
    ax.set_title("Redundancy proposition: reachability against k")
    return fig


def routes_figure(cmp: pd.DataFrame | None) -> Figure | None:
    """ΔH(α) of each (press, +routes) pair with its paired bootstrap band."""
    if cmp is None or cmp.empty:
        return None
    fig, axes = panels(min(len(cmp), 6))
    for ax, (_, row) in zip(axes, cmp.head(6).iterrows(), strict=False):
        c = pd.DataFrame(row["curve"])
        ax.axhline(0, color="#7f7f7f", lw=0.8)
        ax.fill_between(c["ratio"], c["delta_low"], c["delta_high"], alpha=0.25, color="#2ca02c")
        ax.plot(c["ratio"], c["delta_h"], "o-", ms=3, color="#2ca02c")
        d = row.get("delta_alpha")
        if d is not None and not pd.isna(d):
            note = f"Δα* = {d:+.3f}"
        else:  # say which side has no located cliff (e.g. beyond_grid), not "neither"
            missing = [f"{short(str(row[p]), 20)} {row.get('status_' + p[-1], '')}".strip()
                       for p in ("press_a", "press_b") if row.get("alpha_" + p[-1]) is None
                       or pd.isna(row.get("alpha_" + p[-1]))]
            note = "Δα* undefined: " + ", ".join(missing)
        ax.set_title(f"{short(row['model'], 24)}: {short(row['press_b'], 28)}\nvs {short(row['press_a'], 36)}\n{note}",
                     fontsize=8)
        ax.set_xlabel("compression ratio α")
        ax.set_ylabel("ΔH = H(routes) − H(other)")
    return fig


def identity_figure(ident: pd.DataFrame | None) -> Figure | None:
    """Answer-identity probe accuracy per ratio (95% band), its untrained last-layer readout, and chance, per model."""
    if ident is None or ident.empty or ident["accuracy"].notna().sum() == 0:
        return None
    models = sorted(ident["model"].unique())[:MAX_PANELS]
    colors = color_map(sorted(ident["press"].unique()))
    fig, axes = panels(len(models), sharey=True)
    for ax, model in zip(axes, models, strict=False):
        for (press, _regime), g in ident[ident["model"] == model].groupby(["press", "regime"], sort=True):
            g = g[g["accuracy"].notna()].sort_values("ratio")
            if g.empty:
                continue
            c = colors[press]
            ax.fill_between(g["ratio"], g["accuracy_low"], g["accuracy_high"], color=c, alpha=0.15, lw=0)
            ax.plot(g["ratio"], g["accuracy"], "o-", ms=3, color=c, label=f"probe · {short(press, 28)}")
            ax.plot(g["ratio"], g["untrained"], "^:", ms=3, color=c, alpha=0.8, label="untrained (last-layer argmax)")
            ax.plot(g["ratio"], g["chance"], "--", color="#7f7f7f", lw=1)
        ax.set_title(short(model, 50))
        ax.set_xlabel("compression ratio α")
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("answer identity accuracy (dashed: chance)")
    axes[0].legend(fontsize=7)
    fig.suptitle("Which candidate value is the answer, read from the last prompt token (logit lens)", fontsize=10)
    return fig


def lens_figure(profiles: pd.DataFrame | None) -> Figure | None:
    """Mean logit-lens log-prob of the gold's first token per layer: full cache against each compressed ratio."""
    if profiles is None or profiles.empty or profiles["logprob"].notna().sum() == 0:
        return None
    models = sorted(profiles["model"].unique())[:MAX_PANELS]
    fig, axes = panels(len(models))
    for ax, model in zip(axes, models, strict=False):
        p = profiles[profiles["model"] == model]
        ratios = sorted(r for r in p["ratio"].unique() if r > 0)
        cmap = dict(zip(ratios, np.linspace(0.25, 0.95, len(ratios)), strict=True)) if ratios else {}
        full = p[p["ratio"] == 0].groupby("layer")["logprob"].mean()
        if not full.empty:
            ax.plot(full.index, full.values, "k-", lw=2, label="full cache (α = 0)")
        for r in ratios:
            comp = p[p["ratio"] == r].groupby("layer")["logprob"].mean()
            ax.plot(comp.index, comp.values, "--", color=(cmap[r], 0.2, 1 - cmap[r]),
                    label=f"α = {r:g} (mean over presses)")
        ax.set_title(short(model, 50))
        ax.set_xlabel("layer")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("log p(gold first token), logit lens")
    axes[0].legend(fontsize=7)
    fig.suptitle("Logit lens of the gold answer's first token at the last prompt token", fontsize=10)
    return fig
