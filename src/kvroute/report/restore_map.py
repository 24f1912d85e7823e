"""The restoration-map section's parts: per (model, press, ratio) of the maps in ``RUN_DIR/restore_map/``, the
averaged map beside the retrieval-head map (a figure), a table and the findings written by
:func:`kvroute.analysis.restore_map.restore_map_finding`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from kvroute.analysis.restore_map import p_text
from kvroute.report import html as h

COLS = [("model", "model"), ("press", "press"), ("ratio", "α"), ("maps", "maps"), ("failures", "failures"),
        ("top", "largest slot"), ("effect", "its mean effect"), ("interval", "95% interval"),
        ("above_zero", "slots above 0"), ("minimal", "minimal set: median (range)"), ("jaccard", "Jaccard"),
        ("null", "null Jaccard"), ("p", "p"), ("rho_retrieval", "ρ with retrieval map")]
MAX_GROUPS = 4  # rows of the figure


def restore_map_groups(maps: Sequence[Any], df: pd.DataFrame, *, n_boot: int, seed: int) -> list[dict[str, Any]]:
    """Per (model, press, ratio): the averaged map, the minimal sets' sizes and agreement, the retrieval-head map
    (None when the records carry no retrieval metric) and the finding."""
    from kvroute.analysis.common import AnalysisError
    from kvroute.analysis.restore_map import (
        averaged_map,
        minimal_sizes,
        restore_map_finding,
        retrieval_kv_map,
        set_agreement,
        spearman,
    )

    by: dict[tuple[str, str, float], list[Any]] = {}
    for m in maps:
        if m.failure:
            by.setdefault((m.model, m.press, m.ratio), []).append(m)
    out = []
    for (model, press, ratio), ms in sorted(by.items()):
        try:
            avg = averaged_map(ms, n_boot=n_boot, seed=seed)
        except AnalysisError:
            continue
        L, Hkv = ms[0].effect.shape
        sizes = minimal_sizes(ms)
        agree = set_agreement([m.minimal for m in ms if m.minimal], L * Hkv, seed=seed)
        retrieval = retrieval_kv_map(df, model, L, Hkv)
        grid = avg.sort_values(["layer", "kv_head"])["effect"].to_numpy().reshape(L, Hkv)
        out.append({"model": model, "press": press, "ratio": ratio, "maps": ms, "avg": avg, "grid": grid,
                    "sizes": sizes, "agree": agree, "retrieval": retrieval,
                    "rho": spearman(grid.ravel(), retrieval.ravel()) if retrieval is not None else math.nan,
                    "finding": restore_map_finding(press, ratio, avg, sizes, agree)})
    return out


def _row(g: dict[str, Any]) -> dict[str, Any]:
    avg, s, a = g["avg"], g["sizes"], g["agree"]
    top = avg.sort_values("effect", ascending=False).iloc[0]
    return {"model": g["model"], "press": g["press"], "ratio": g["ratio"], "maps": len(g["maps"]),
            "failures": s["failures"], "top": f"{int(top['layer'])}.{int(top['kv_head'])}",
            "effect": round(float(top["effect"]), 3),
            "interval": "–" if math.isnan(top["low"]) else f"[{top['low']:.2f}, {top['high']:.2f}]",
            "above_zero": int((avg["low"] > 0).sum()),
            "minimal": "–" if not s["with_set"] else f"{s['median']:g} ({s['min']}–{s['max']})",
            "jaccard": _r(a["jaccard"]), "null": _r(a["null"]),
            "p": "–" if math.isnan(a["p"]) else p_text(a["p"]).removeprefix("p = "),
            "rho_retrieval": _r(g["rho"])}


def _r(x: float) -> float | str:
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else round(float(x), 3)


def restore_map_html(groups: Sequence[dict[str, Any]]) -> dict[str, str]:
    """The section's ``findings`` (a list) and ``table``; empty strings when there are no maps."""
    if not groups:
        return {"findings": "", "table": ""}
    findings = "<ul>" + "".join(f"<li>{h.esc(g['finding'])}</li>" for g in groups) + "</ul>"
    return {"findings": findings, "table": h.table([_row(g) for g in groups], COLS)}


def restore_map_figure(groups: Sequence[dict[str, Any]]) -> Figure | None:
    """One row per (model, press, ratio) (the first :data:`MAX_GROUPS`): the averaged map, and beside it the
    retrieval-head map at KV-head resolution where the run has one. Layers down, KV heads across."""
    if not groups:
        return None
    gs = list(groups)[:MAX_GROUPS]
    fig = Figure(figsize=(7.5, 2.6 + 2.4 * len(gs)))
    axes = fig.subplots(len(gs), 2, squeeze=False)
    for (a, b), g in zip(axes, gs, strict=True):
        grid = g["grid"]
        lim = max(float(np.nanmax(np.abs(grid))) if np.isfinite(grid).any() else 1.0, 1e-6)
        im = a.imshow(grid, aspect="auto", cmap="RdBu_r", vmin=-lim, vmax=lim, interpolation="nearest")
        a.set_title(f"{g['press']} @ {g['ratio']:g}: mean effect ({len(g['maps'])} failures)", fontsize=8)
        a.set_ylabel("layer", fontsize=8)
        a.set_xlabel("KV head", fontsize=8)
        a.set_xticks(range(grid.shape[1]))
        fig.colorbar(im, ax=a, fraction=0.05)
        if g["retrieval"] is None:
            b.axis("off")
            b.text(0.5, 0.5, "no retrieval-head scores in this run\n(metric 'retrieval')", ha="center",
                   va="center", fontsize=8)
        else:
            im2 = b.imshow(g["retrieval"], aspect="auto", cmap="viridis", interpolation="nearest")
            b.set_title(f"retrieval score per KV head (ρ = {g['rho']:.2f})", fontsize=8)
            b.set_xlabel("KV head", fontsize=8)
            b.set_xticks(range(grid.shape[1]))
            fig.colorbar(im2, ax=b, fraction=0.05)
    fig.tight_layout()
    return fig
