"""The report's opening: its headline findings in words, each number with its 95% interval.

Read from the analysis summary (``summary.json``'s ``headline`` and ``consensus_trend``), so the
words and the tables below them can never disagree. One finding per (model, press, regime): where the
cliff sits (α* with its bootstrap interval, or which end of it the data leave open), the safe ratio,
and whether evicting the answer raises hallucination at the same ratio; then, per model, the
answer-identity probe and where the heads agree.
"""

from __future__ import annotations

from typing import Any

from kvroute.analysis.correlation import or_interval
from kvroute.analysis.probe import MIN_IDENTITY_INSTANCES
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


def _cliff_parts(row: dict[str, Any], prefix: str = "") -> list[str]:
    """α* (or why there is none) and the halfway crossing, from the headline keys with ``prefix``."""
    a = row.get(f"{prefix}alpha_star")
    if a is None:
        parts = [f"no cliff located ({row.get(f'{prefix}cliff_status') or 'not identified'})"]
    else:
        parts = ["α* = " + _with_interval(a, row.get(f"{prefix}alpha_star_ci"),
                                                   row.get(f"{prefix}alpha_star_interval"),
                                                   row.get(f"{prefix}alpha_star_identified"), 3)]
    if row.get(f"{prefix}alpha_half") is not None:
        parts.append("halfway crossing " + _with_interval(row[f"{prefix}alpha_half"], row.get(f"{prefix}alpha_half_ci"),
                                                          row.get(f"{prefix}alpha_half_interval"),
                                                          row.get(f"{prefix}alpha_half_identified"), 2))
    return parts


def cliff_sentence(row: dict[str, Any]) -> str:
    """One (model, press, regime) headline row in words: the cliff caused by compression (among the instances
    right uncompressed) first when the summary has it, then every instance's α*, labelled, then the rest."""
    parts: list[str] = []
    n_caused = row.get("caused_n_instances")
    if n_caused is not None:
        parts.append(f"caused by compression ({n_caused} instances right uncompressed): "
                     + ", ".join(_cliff_parts(row, "caused_")) if n_caused else
                     "caused by compression: no instance is right uncompressed")
        parts.append(f"all instances (H(0) = {_n(row.get('h_baseline'), 2)}): " + _cliff_parts(row)[0])
    else:
        parts += _cliff_parts(row)
    safe = row.get("safe_ratio")
    parts.append(f"certified safe ratio {safe:g}" if safe is not None else "no safe ratio")
    verdict = row.get("ger_within_verdict")
    if verdict is not None:
        # an odds ratio's end of 0 or ∞ (None in summary.json) is open where separated replicates push it away
        # from the rest, and that limit itself where every replicate separates one way
        ci = row.get("ger_or_per_tenth_ci")
        parts.append(f"eviction within instance: {verdict}, OR {_n(row.get('ger_or_per_tenth'), 2)} "
                     f"{or_interval(ci[0], ci[1]) if ci else '[–, –]'}")
    return "; ".join(parts)


def identity_sentence(rows: list[dict[str, Any]]) -> str | None:
    """A model's answer-identity probe at the full cache and at the largest ratio (lowest press)."""
    rows = [r for r in rows if r.get("identity_accuracy_baseline") is not None]
    if not rows:
        return None
    r0 = rows[0]
    n = r0.get("identity_n_instances_baseline")
    if n is not None and n < MIN_IDENTITY_INSTANCES:
        return (f"answer-identity probe: cannot decide from {n} instances (fewer than {MIN_IDENTITY_INSTANCES}, "
                "where its interval covers a planted accuracy in under 90% of sets)")
    chance, null_high = r0.get("identity_chance"), r0.get("identity_null_high_baseline")
    ci0 = r0.get("identity_accuracy_baseline_ci") or [None, None]
    text = (f"answer-identity probe {_n(r0['identity_accuracy_baseline'], 2)} {_ci(ci0, 2) or ''} at the full cache"
            f"{f' over {n} instances' if n is not None else ''} (chance {_n(chance, 2)}"
            + (f"; 95% of label permutations ≤ {_n(null_high, 2)}" if null_high is not None else "") + ")"
            ).replace("  ", " ")
    line = null_high if null_high is not None else chance
    if ci0[0] is not None and line is not None and ci0[0] <= line:
        text += ", an interval that reaches the chance line: it cannot tell the answer from the distractors here"
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
    n = row.get("n_lengths")
    text = f"{row.get('verdict')} over {n} context length{'' if n == 1 else 's'}"
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


#: the parts of summary.json the findings and the league are written from (what the docs' copy keeps)
FINDINGS_KEYS = ("headline", "consensus_trend", "length_verdicts", "size_trends", "press_league", "settings", "notes")


def findings_summary(summary: dict[str, Any]) -> dict[str, Any]:
    """The part of a summary.json the findings and the league are written from: small enough to commit beside the
    docs that quote it, and giving the same lines."""
    return {k: summary[k] for k in FINDINGS_KEYS if k in summary}


def findings_lines(summary: dict[str, Any]) -> list[str]:
    """The findings as the console and the docs show them: one ``• label: sentence`` line each (the docs quote
    these lines verbatim from a committed summary.json; tests/unit/test_docs_findings.py regenerates them)."""
    return [f"  • {label}: {text}" for label, text in findings(summary)]


def scaling_findings(summary: dict[str, Any]) -> list[tuple[str, str]]:
    """``(label, sentence)`` pairs: how the cliff moves with context length and with model size."""
    out = []
    for r in summary.get("length_verdicts") or []:
        out.append((f"α* against context length · {r.get('model')} · {r.get('press')}", length_sentence(r)))
    for r in summary.get("size_trends") or []:
        out.append((f"α* against model size · {r.get('family')} · {r.get('press')}", size_sentence(r)))
    return out


def findings_html(summary: dict[str, Any]) -> str:
    """The findings as an HTML list (every piece escaped), or a note when there is no headline row; the key to
    reading them is :func:`findings_key_html` (the report puts it below the opening figure)."""
    items = findings(summary)
    if not items:
        return h.note("No headline finding: "
                      + ((summary.get("notes") or {}).get("cliff") or "no cliff could be fitted"))
    lis = "".join(f"<li><strong>{h.esc(label)}</strong>: {h.esc(text)}</li>" for label, text in items)
    return f'<ul class="findings">{lis}</ul>'


def findings_key_html(summary: dict[str, Any]) -> str:
    """How to read the findings: what each number is (empty when there is no headline row)."""
    if not summary.get("headline"):
        return ""
    settings = summary.get("settings") or {}
    key = (f"{settings.get('confidence', 0.95):.0%} bootstrap intervals over instances in brackets. Caused by "
           "compression: H(α) among the instances right with the full cache (H(0) = 0); all instances: the "
           "unconditional H(α) and its uncompressed rate H(0). α*: the fitted sigmoid midpoint, with the interval "
           "the sigmoid and the model-free halfway crossing both allow ('cannot decide' where they disagree or it "
           f"spans more than 0.35 of α); certified safe ratio: the largest ratio whose H is shown within δ = "
           f"{settings.get('delta', 0.05):g} of the uncompressed one by an exact paired test; OR: odds of "
           "hallucinating per +0.1 GER (answer evicted from more heads) for the same instance at matched ratios "
           "('open' where bootstrap replicates separate).")
    return f'<p class="meta">{h.esc(key)}</p>'


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
