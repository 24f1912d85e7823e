"""Report figures about routing: retention/accessibility/utilization, the failure decomposition,
layer-wise consensus profiles, and the probe against accuracy."""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from kvroute.report.render import MAX_PANELS, color_map, panels, short

#: routing_curves column → (label, colour, line style); drawn when present
RAU_SERIES = {
    "retention": ("retention (1 − GER)", "#1f77b4", "-"),
    "accessibility": ("accessibility (evidence mass / full)", "#2ca02c", "-"),
    "reachability": ("direct reachability share", "#2ca02c", ":"),
    "routed_reachability": ("routed reachability share", "#17becf", ":"),
    "f1": ("utilization: F1", "#d62728", "-"),
    "hallucination": ("hallucination rate", "#7f7f7f", "--"),
}


def _press_panels(df: pd.DataFrame) -> list[tuple[tuple, pd.DataFrame]]:
    return list(df.groupby(["model", "press", "regime"], sort=True))[:MAX_PANELS]


def _title(key: tuple, with_regime: bool) -> str:
    t = f"{short(key[0], 30)}\n{short(key[1], 40)}"
    return f"{t} ({short(key[2], 12)})" if with_regime else t


def rau_figure(routing: pd.DataFrame) -> Figure | None:
    """Retention, accessibility and utilization per ratio on one plot per (model, press)."""
    if routing is None or routing.empty:
        return None
    series = [c for c in RAU_SERIES if c in routing.columns and routing[c].notna().any()]
    if not series:
        return None
    groups = _press_panels(routing)
    with_regime = routing["regime"].nunique() > 1
    fig, axes = panels(len(groups), sharey=True)
    for ax, (key, g) in zip(axes, groups, strict=True):
        g = g.sort_values("ratio")
        for c in series:
            label, color, style = RAU_SERIES[c]
            ax.plot(g["ratio"], g[c], style, marker="o", ms=3, color=color, label=label)
        if "logprob_delta" in g and g["logprob_delta"].notna().any():
            twin = ax.twinx()
            twin.plot(g["ratio"], g["logprob_delta"], "-.", color="#9467bd", lw=1, label="gold log-prob Δ (right)")
            twin.set_ylabel("gold log-prob Δ", fontsize=8, color="#9467bd")
            twin.tick_params(labelsize=7)
        ax.set_title(_title(key, with_regime), fontsize=9)
        ax.set_xlabel("compression ratio α")
        ax.set_ylim(-0.02, 1.1)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("share / rate")
    axes[0].legend(fontsize=7, loc="lower left")
    fig.suptitle("Retention, accessibility and utilization side by side", fontsize=10)
    return fig


def decomposition_figure(decomp: pd.DataFrame) -> Figure | None:
    """Failure rate split into erasure, retained (rigidity-candidate) and undefined-GER failures, stacked over the
    ratio."""
    if decomp is None or decomp.empty:
        return None
    groups = _press_panels(decomp)
    with_regime = decomp["regime"].nunique() > 1
    fig, axes = panels(len(groups), sharey=True)
    for ax, (key, g) in zip(axes, groups, strict=True):
        g = g.sort_values("ratio")
        undefined = g["undefined_rate"] if "undefined_rate" in g.columns else 0 * g["erasure_rate"]
        ax.stackplot(g["ratio"], g["erasure_rate"], g["retained_rate"], undefined,
                     colors=["#d62728", "#ff9896", "#bbbbbb"], alpha=0.85,
                     labels=["erasure: answer globally evicted", "retained: answer kept in some head",
                             "undefined GER: no answer in the context"])
        ax.plot(g["ratio"], g["failure_rate"], "k-", lw=1, label="failure rate")
        ax.set_title(_title(key, with_regime), fontsize=9)
        ax.set_xlabel("compression ratio α")
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("share of cells")
    axes[0].legend(fontsize=7, loc="upper left")
    fig.suptitle("Failure decomposition: erasure against retained failures (candidates for rigidity)", fontsize=10)
    return fig


def _pick_ratios(ratios: list[float], n: int = 3) -> list[float]:
    comp = [r for r in ratios if r > 0]
    if len(comp) <= n:
        return comp
    idx = np.unique(np.round(np.linspace(0, len(comp) - 1, n)).astype(int))
    return [comp[i] for i in idx]


def consensus_figure(profiles: pd.DataFrame, *, group: pd.DataFrame | None = None,
                     label: str = "sink-free consensus") -> Figure | None:
    """Layer-wise profile per model side by side: the full cache (ratio 0, with its instance-bootstrap
    interval when the table has ``low``/``high``) against a few compressed ratios.

    ``profiles`` is a :func:`kvroute.analysis.curves.layer_profiles` table (the sink-free per-head
    consensus by default); ``group``, when given, the GQA-aware (KV group) profile, drawn dotted for
    the full cache — the one comparable across models. Compressed profiles are averaged over presses
    and regimes.
    """
    if profiles is None or profiles.empty:
        return None
    models = sorted(profiles["model"].unique())[:MAX_PANELS]
    fig, axes = panels(len(models), sharey=True)
    ratios = _pick_ratios(sorted(profiles["ratio"].unique()))
    cmap = color_map(ratios)
    for ax, model in zip(axes, models, strict=True):
        p = profiles[profiles["model"] == model]
        base = p[p["ratio"] == 0]
        full = base.groupby("layer")["value"].mean()
        if not full.empty:
            ax.plot(full.index, full.values, "k-", lw=2, label="full cache (α = 0)")
            if {"low", "high"} <= set(base.columns) and base["low"].notna().any():
                band = base.groupby("layer")[["low", "high"]].mean()
                ax.fill_between(band.index, band["low"], band["high"], color="k", alpha=0.15, lw=0,
                                label="95% interval (instances)")
        if group is not None and not group.empty:
            gp = group[(group["model"] == model) & (group["ratio"] == 0)].groupby("layer")["value"].mean()
            if not gp.empty:
                ax.plot(gp.index, gp.values, "k:", lw=2, label="full cache, over KV groups")
        for r in ratios:
            comp = p[p["ratio"] == r].groupby("layer")["value"].mean()
            if not comp.empty:
                ax.plot(comp.index, comp.values, "--", color=cmap[r], label=f"compressed α = {r:g}")
        ax.set_title(short(model, 50))
        ax.set_xlabel("layer")
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel(f"{label} (low = heads agree)" if "consensus" in label else label)
    axes[0].legend(fontsize=7)
    fig.suptitle(f"Layer-wise head {label} per model, compressed against full", fontsize=10)
    return fig


def probe_figure(probe: pd.DataFrame) -> Figure | None:
    """Probe macro-F1 (± std over folds) and accuracy per ratio, per model panel, one colour per press."""
    if probe is None or probe.empty or probe["macro_f1"].notna().sum() == 0:
        return None
    models = sorted(probe["model"].unique())[:MAX_PANELS]
    colors = color_map(sorted(probe["press"].unique()))
    fig, axes = panels(len(models), sharey=True)
    for ax, model in zip(axes, models, strict=True):
        for (press, _regime), g in probe[probe["model"] == model].groupby(["press", "regime"], sort=True):
            g = g.sort_values("ratio")
            c = colors[press]
            ax.errorbar(g["ratio"], g["macro_f1"], yerr=g["macro_f1_std"].fillna(0), fmt="-o", ms=3, color=c,
                        capsize=2, label=f"probe macro-F1 · {short(press, 28)}")
            if g["accuracy"].notna().any():
                ax.plot(g["ratio"], g["accuracy"], "--s", ms=3, color=c, alpha=0.7,
                        label=f"accuracy · {short(press, 28)}")
        ax.set_title(short(model, 50))
        ax.set_xlabel("compression ratio α")
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("macro-F1 / exact-match accuracy")
    axes[0].legend(fontsize=7, loc="lower left")
    fig.suptitle("Representation (answer-type probe) against accuracy over the ratio", fontsize=10)
    return fig
