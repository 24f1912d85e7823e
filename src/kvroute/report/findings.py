"""The report's opening: its headline findings in words, each number with its 95% interval.

Read from the analysis summary (``summary.json``'s ``headline`` and ``consensus_trend``), so the
words and the tables below them can never disagree. One finding per (model, press, regime): where the
cliff sits (α* with its bootstrap interval, or which end of it the data leave open), the safe ratio,
and whether evicting the answer raises hallucination at the same ratio; then, per model, the
answer-identity probe and where the heads agree.
"""

from __future__ import annotations

from typing import Any

from kvroute.report import html as h


def _n(v: Any, digits: int = 3) -> str:
    if v is None or (isinstance(v, float) and v != v):
        return "–"
    return "open" if isinstance(v, float) and (v in (float("inf"), float("-inf"))) else f"{v:.{digits}f}"


def _ci(ci: Any, digits: int = 3) -> str | None:
    return f"[{_n(ci[0], digits)}, {_n(ci[1], digits)}]" if ci and None not in ci else None


def _with_interval(value: float, ci: Any, interval: str | None, identified: str | None, digits: int) -> str:
    """``0.699 [0.512, 0.802]``, or ``0.734, interval (open, 0.823]: lower end not identified``."""
    closed = _ci(ci, digits)
    if closed:
        return f"{value:.3f} {closed}"
    head = (interval or "not identified").split(":")[0].split(" (rounded")[0].strip()
    side = {"open_below": "lower end not identified", "open_above": "upper end not identified"}.get(identified or "")
    return f"{value:.3f}, interval {head}" + (f" ({side})" if side else "")


def cliff_sentence(row: dict[str, Any]) -> str:
    """One (model, press, regime) headline row in words."""
    a = row.get("alpha_star")
    if a is None:
        parts = [f"no cliff located ({row.get('cliff_status') or 'not identified'})"]
    else:
        parts = ["cliff at α* = " + _with_interval(a, row.get("alpha_star_ci"), row.get("alpha_star_interval"),
                                                   row.get("alpha_star_identified"), 3)]
    if row.get("alpha_half") is not None:
        parts.append("halfway crossing " + _with_interval(row["alpha_half"], row.get("alpha_half_ci"),
                                                          row.get("alpha_half_interval"),
                                                          row.get("alpha_half_identified"), 2))
    safe = row.get("safe_ratio")
    parts.append(f"certified safe ratio {safe:g}" if safe is not None else "no safe ratio")
    verdict = row.get("ger_within_verdict")
    if verdict is not None:
        # an odds ratio's end of 0 or ∞ (None in summary.json) is open: separated replicates reach it
        ci = row.get("ger_or_per_tenth_ci")
        ci = [float("inf") if v is None or v == 0 else v for v in ci] if ci else ci
        oci = _ci(ci, 2) or "[–, –]"
        parts.append(f"evicting the answer, within instance at matched ratios: {verdict}, "
                     f"OR {_n(row.get('ger_or_per_tenth'), 2)} {oci}")
    return "; ".join(parts)


def identity_sentence(rows: list[dict[str, Any]]) -> str | None:
    """A model's answer-identity probe at the full cache and at the largest ratio (lowest press)."""
    rows = [r for r in rows if r.get("identity_accuracy_baseline") is not None]
    if not rows:
        return None
    r0 = rows[0]
    chance = r0.get("identity_chance")
    ci0 = r0.get("identity_accuracy_baseline_ci") or [None, None]
    text = (f"answer-identity probe {_n(r0['identity_accuracy_baseline'], 2)} {_ci(ci0, 2) or ''} at the full cache "
            f"(chance {_n(chance, 2)})").replace("  ", " ")
    if ci0[0] is not None and chance is not None and ci0[0] <= chance:
        text += ", an interval that includes chance"
    tops = [r for r in rows if r.get("identity_accuracy_at_max_ratio") is not None]
    if tops:
        w = min(tops, key=lambda r: r["identity_accuracy_at_max_ratio"])
        text += (f"; lowest at α = {w.get('identity_max_ratio'):g}: {w['press']} "
                 f"{_n(w['identity_accuracy_at_max_ratio'], 2)} "
                 f"{_ci(w.get('identity_accuracy_at_max_ratio_ci'), 2) or ''}"
                 ).rstrip()
    return text


def consensus_sentence(trend_rows: list[dict[str, Any]], model: str) -> str | None:
    """Where a model's heads agree at the full cache (sink-free consensus, first vs last third of the layers)."""
    from kvroute.analysis.curves import CONSENSUS_COL, TREND_MEANING

    for r in trend_rows:
        if (r.get("model") == model and r.get("measure") == CONSENSUS_COL and float(r.get("ratio", 1)) == 0.0
                and r.get("trend") is not None):
            ci = _ci([r.get("change_low"), r.get("change_high")], 2)
            return (f"sink-free head consensus {_n(r.get('early'), 2)} in the first third of the layers, "
                    f"{_n(r.get('late'), 2)} in the last (change {ci or 'interval not identified'}): "
                    f"{TREND_MEANING.get(r['trend'], r['trend'])}")
    return None


def _interval_of(row: dict[str, Any], name: str) -> str:
    """The interval of ``row[name]`` from ``row[name + "_low"]`` and ``row[name + "_high"]``, two decimals."""
    return _ci([row.get(f"{name}_low"), row.get(f"{name}_high")], 2) or "(interval not identified)"


def size_sentence(row: dict[str, Any]) -> str:
    """One α*-against-size trend row (``summary["size_trends"]``) in words."""
    text = f"{row.get('verdict')} over {row.get('n_models')} models"
    if row.get("slope") is not None:
        text += f", slope {_n(row['slope'], 2)} logit α* per tenfold parameters {_interval_of(row, 'slope')}"
    preds = [k[5:] for k in row if k.startswith("pred_") and k.count("_") == 1 and row.get(k) is not None]
    if preds:
        lab = preds[-1]
        ci = _ci([row.get(f"pred_{lab}_low"), row.get(f"pred_{lab}_high")], 2)
        text += f"; projected α* at {lab}: {_n(row[f'pred_{lab}'], 2)} {ci or '(no interval)'}"
        if row.get(f"pred_{lab}_has_paper") is not None:
            text += (", an interval that holds the paper's 0.9" if row[f"pred_{lab}_has_paper"]
                     else ", an interval that excludes the paper's 0.9")
    return text


def length_sentence(row: dict[str, Any]) -> str:
    """One α*-against-context-length verdict row (``summary["length_verdicts"]``) in words."""
    text = f"{row.get('verdict')} over {row.get('n_lengths')} context lengths"
    if row.get("beta") is not None:
        text += (f", elasticity of the critical budget β = {_n(row['beta'], 2)} {_interval_of(row, 'beta')} "
                 "(0: fixed budget, 1: fixed ratio)")
    return text


def findings(summary: dict[str, Any]) -> list[tuple[str, str]]:
    """``(label, sentence)`` pairs: the cliffs per (model, press, regime), then per model its probe and consensus."""
    rows = summary.get("headline") or []
    regimes = len({r.get("regime") for r in rows}) > 1
    out = []
    for r in rows:
        label = f"{r['model']} · {r['press']}" + (f" ({r['regime']})" if regimes else "")
        out.append((label, cliff_sentence(r)))
    trend = summary.get("consensus_trend") or []
    for model in dict.fromkeys(r["model"] for r in rows):
        for s in (identity_sentence([r for r in rows if r["model"] == model]), consensus_sentence(trend, model)):
            if s:
                out.append((str(model), s))
    return out


def scaling_findings(summary: dict[str, Any]) -> list[tuple[str, str]]:
    """``(label, sentence)`` pairs: how the cliff moves with context length and with model size."""
    out = []
    for r in summary.get("length_verdicts") or []:
        out.append((f"α* against context length · {r.get('model')} · {r.get('press')}", length_sentence(r)))
    for r in summary.get("size_trends") or []:
        out.append((f"α* against model size · {r.get('family')} · {r.get('press')}", size_sentence(r)))
    return out


def findings_html(summary: dict[str, Any]) -> str:
    """The findings as an HTML list (every piece escaped), or a note when there is no headline row."""
    items = findings(summary)
    if not items:
        return h.note("No headline finding: "
                      + ((summary.get("notes") or {}).get("cliff") or "no cliff could be fitted"))
    settings = summary.get("settings") or {}
    lis = "".join(f"<li><strong>{h.esc(label)}</strong>: {h.esc(text)}</li>" for label, text in items)
    key = (f"{settings.get('confidence', 0.95):.0%} bootstrap intervals over instances in brackets. α*: the fitted "
           "sigmoid midpoint of the hallucination rate H(α); halfway crossing: the model-free cross-check; safe ratio: "
           f"the largest ratio whose H stays within δ = {settings.get('delta', 0.05):g} of the uncompressed one; OR: "
           "odds of hallucinating per +0.1 GER (answer evicted from more heads) at the same ratio.")
    return f'<ul class="findings">{lis}</ul><p class="meta">{h.esc(key)}</p>'


def scaling_findings_html(summary: dict[str, Any]) -> str:
    """How the cliff moves with context length and model size, as an HTML list (shown below the cliff figure);
    empty when the run has neither several lengths nor several sized models."""
    items = scaling_findings(summary)
    if not items:
        return ""
    lis = "".join(f"<li><strong>{h.esc(label)}</strong>: {h.esc(text)}</li>" for label, text in items)
    return ('<h3>How the cliff moves</h3><ul class="findings">' + lis + "</ul>"
            '<p class="meta">Sections 2 and 2b: the length law (β, the elasticity of the critical kept budget with '
            "the context length) and the size trend (logit α* against log10 parameters, projected beyond the "
            "largest model measured).</p>")
