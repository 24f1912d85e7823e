"""Report figures for kvroute's own additions: the redundancy proposition check."""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from kvroute.report.render import color_map, panels, short


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
