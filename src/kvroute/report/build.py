"""``build_report``: records → ``report.html`` (self-contained) + ``summary.json`` + ``figures/*.png``."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from kvroute import __version__
from kvroute.analysis.common import AnalysisError, attach_baseline
from kvroute.analysis.summary import AnalysisConfig, run_analysis
from kvroute.files import write_folder
from kvroute.progress import SILENT, Progress
from kvroute.report import figures_cliff as fc
from kvroute.report import figures_extra as fx
from kvroute.report import figures_routing as fr
from kvroute.report import html as h
from kvroute.report.findings import findings_html, findings_key_html, scaling_findings_html
from kvroute.report.heatmap import SurvivalExample, survival_figure
from kvroute.report.league import league_html
from kvroute.report.manifest import manifest_html
from kvroute.report.render import data_uri, png_bytes

log = logging.getLogger(__name__)

#: every figure the report can hold: (element id, section heading)
FIGURES: tuple[tuple[str, str], ...] = (
    ("fig-cliff-caused", "Hallucination caused by compression"),
    ("fig-cliff", "Hallucination cliff"),
    ("fig-context", "α* against context length"),
    ("fig-size", "α* against model size"),
    ("fig-ger", "GER and hallucination"),
    ("fig-rau", "Retention, accessibility, utilization"),
    ("fig-decomposition", "Failure decomposition"),
    ("fig-consensus", "Layer-wise head consensus"),
    ("fig-survival", "Evidence survival in one instance"),
    ("fig-identity", "Answer identity probe"),
    ("fig-lens", "Logit lens of the gold answer"),
    ("fig-probe", "Answer-type probe (control: reads the question)"),
    ("fig-redundancy", "Redundancy: reachability against heads keeping the evidence"),
    ("fig-routes", "Route-preserving selection against AdaKV and per-head top-k"),
)

#: what a report folder may hold besides the files one report writes (figures of an earlier report)
REPORT_FILES = frozenset({"report.html", "summary.json", "figures/*"})


def build_report(df: pd.DataFrame, out_dir: str | Path, *, manifest: dict[str, Any] | None = None,
                 title: str = "kvroute report", survival: SurvivalExample | None = None,
                 config: AnalysisConfig | None = None, examples_per_ratio: int = 3,
                 tickets: pd.DataFrame | None = None, ticket_images: list[tuple[str, bytes]] | None = None,
                 restoration: pd.DataFrame | None = None, progress: Progress = SILENT) -> Path:
    """Analyse ``df`` and write ``report.html``, ``summary.json`` and ``figures/`` into ``out_dir``.

    ``restoration``: :func:`kvroute.analysis.restoration.restoration_table` of the run's restored cells (``df``
    holds the presses' own cells only).

    ``survival`` is one instance's keep-mask for the survival heatmap (the records do not hold
    keep-masks). Sections whose data are missing say so instead of showing a figure. The page opens
    with the findings in words and the cliff figure; the run manifest closes it. ``progress`` shows
    the analysis and the figures as two stages. Returns the path of ``report.html``.

    Nothing is written until every file is made; then ``out_dir`` is replaced whole
    (:func:`kvroute.files.write_folder`: a temporary folder next to it, swapped in with one rename), so
    a report that fails or is killed leaves no half-written folder and an earlier report unchanged.
    """
    cfg = config or AnalysisConfig()
    with progress.task(f"report: analysing {len(df)} records ({cfg.n_boot} bootstrap replicates)", total=None):
        analysis = run_analysis(df, cfg)
    s, t = analysis.summary, analysis.tables
    out = Path(out_dir)
    files: dict[str, bytes] = {}  # relative path → bytes, written together at the end
    notes = s["notes"]

    def fig(fig_id: str, make: Callable[[], Figure | None], caption: str, missing: str) -> str:
        try:
            f = make()
        except AnalysisError as e:
            return h.note(f"{missing} ({e})")
        finally:
            bar.advance()
        if f is None:
            return h.note(missing)
        png = png_bytes(f)
        files[f"figures/{fig_id.removeprefix('fig-')}.png"] = png
        return h.figure(fig_id, data_uri(png), caption)

    def why(*sections: str) -> str:
        return "; ".join(notes[x] for x in sections if x in notes) or "no data for this figure"

    with progress.task("report: drawing the figures", total=len(FIGURES)) as bar:
        baseline_note = " ('none' = the uncompressed baseline)" if "none" in s["presses"] else ""
        cliff_caption = ("H(α), the hallucination rate against the compression ratio, per press with 95% bootstrap "
                         "bands over instances; the dotted curve is the fitted sigmoid, the vertical line α*, the "
                         "shaded span its interval (hatched where one end is not identified), the dashed line the "
                         "monotone cross-check α½, ▲ the safe ratio.")
        caused_caption = ("H(α) among the instances the model answers right with the full cache — the hallucination "
                          "compression causes — one panel per press, with 95% bootstrap bands over those instances; "
                          "in grey every instance's H(α) and its uncompressed rate (dotted); the dashed line is the "
                          "model-free halfway crossing, shaded where its interval is decided.")
        opening = h.section("findings", "Findings", findings_html(s),
                            fig("fig-cliff-caused", lambda: fc.caused_cliff_figure(
                                t.get("cliff_curves_caused"), t.get("cliff_curves"), t.get("cliffs_caused")),
                                caused_caption, why("cliff_caused")),
                            findings_key_html(s),
                            fig("fig-cliff", lambda: fc.cliff_figure(t.get("cliff_curves"), t.get("cliffs")),
                                cliff_caption, why("cliff")),
                            scaling_findings_html(s))
        body = [
            h.section("run", "What was run", h.paragraph(
                f"{s['n_records']} cell records over {s['n_instances']} instances"
                + (f" ({s['n_instances_evidence_none']} with no answer located in the context: GER undefined, left out "
                   "of the retention statistics)" if s.get("n_instances_evidence_none") else "")
                + f"; models: {', '.join(s['models'])}; "
                f"presses: {', '.join(s['presses'])}{baseline_note}; regimes: {', '.join(s['regimes'])}; families: "
                f"{', '.join(s['families'])}; ratios: {', '.join(f'{r:g}' for r in s['ratios'])}. The run manifest "
                "(versions, git commit, timings) is at the end.")),
            h.section("headline", "Headline numbers", h.paragraph(
                "Families pooled, per model, press and regime. α* is the fitted sigmoid midpoint with its 95% "
                "bootstrap interval over instances; the safe ratio is the largest ratio whose hallucination rate stays "
                f"within δ = {cfg.delta:g} of the baseline at {cfg.confidence:.0%} confidence (one-sided). The GER "
                "link is read within ratio (odds ratio per +0.1 GER and ΔP(H) evicted − retained at the same α, "
                "section 3); the pooled r across ratios is confounded by α and shown only for comparison with the "
                "paper."),
                _headline_table(s["headline"]) if s["headline"] else h.note(why("cliff"))),
            h.section("cliff", "1. Hallucination cliff",
                      '<p>The H(α) figure opens the report (<a href="#fig-cliff">Findings</a>); '
                      'the fits per family:</p>',
                      _cliff_table(t.get("cliffs"))),
            h.section("league", "Press league: the routing view at matched budgets",
                      league_html(t.get("press_league"), why("press_league"), delta=cfg.delta,
                                  confidence=cfg.confidence, min_instances=cfg.league_min_instances)),
            h.section("context", "2. α* against context length",
                      fig("fig-context", lambda: fc.context_figure(t.get("length_cliffs"), t.get("length_verdicts")),
                          "α* and the critical kept-token budget (1 − α*)·T against T (long-context family), "
                          "95% intervals.",
                          why("context_length")),
                      _verdict_table(t.get("length_verdicts"))),
            h.section("size", "2b. α* against model size",
                      h.paragraph("Per task family, and the families pooled ('all') when every model ran the same "
                                  "instances (else pooled curves would compare family mixes), each model's cliff "
                                  "fitted as in section 1, and the least-squares "
                                  "line of logit α* on log10 of the parameter count, carried to the paper's 3B, 7B "
                                  "and 14B. Intervals: 95% percentile bootstrap over instances (resampled jointly "
                                  "for all models when they ran the same instances); a replicate counts only when "
                                  "every model's α* is identified in it. The projection is an extrapolation: it holds "
                                  "only if the trend stays log-linear beyond the largest model measured."),
                      fig("fig-size", lambda: fc.size_figure(t.get("size_cliffs"), t.get("size_trends")),
                          "α* against the parameter count per family; the dotted line is the fitted trend, hollow "
                          "points its projection with 95% intervals, the dashed line the paper's α* ≈ 0.9.",
                          why("model_size")),
                      _size_tables(t.get("size_cliffs"), t.get("size_trends"))),
            h.section("ger", "3. GER and hallucination",
                      h.paragraph("Within ratio (the main reading): does eviction of the answer raise the "
                                  "hallucination probability at the same α? Logistic regression of each compressed "
                                  "cell's hallucinated flag on its GER with one intercept per ratio (ratio × family "
                                  "when families are pooled; strata without variation in H or GER left out), and the "
                                  "Mantel–Haenszel difference P(H | globally evicted) − P(H | retained) over the same "
                                  "strata; 95% intervals from a bootstrap that resamples instances with all their "
                                  "cells."),
                      _table_or_note(t.get("ger_within_ratio"), _WITHIN_COLS, why("ger_within_ratio")),
                      fig("fig-ger", lambda: fc.ger_figure(t.get("ger_points"), t.get("ger_correlation")),
                          "Pooled across ratios, for comparison with the paper's r = 0.79–0.93 only: mean GER against "
                          "hallucination rate, one point per ratio, r is Pearson's over those points. Both curves rise "
                          "with α, so r is high whether or not eviction matters at a given ratio (confounded by α), "
                          "and its p-value treats the ratio points as independent.",
                          why("ger_correlation")),
                      _table_or_note(t.get("conditional"), _COND_COLS, why("conditional"))),
            h.section("rau", "4. Retention, accessibility, utilization",
                      fig("fig-rau", lambda: fr.rau_figure(t.get("routing")),
                          "Per ratio: retention (1 − GER), accessibility (evidence attention mass relative to the full "
                          "cache, reachability shares) and utilization (F1, gold log-prob Δ), with the hallucination "
                          "rate.",
                          why("routing")),
                      _breakdown_tables(t)),
            h.section("decomposition", "5. Failure decomposition: erasure or rigidity?",
                      fig("fig-decomposition", lambda: fr.decomposition_figure(t.get("decomposition")),
                          f"Failures (outcome other than correct: listed, distractor, abstained, partial or "
                          f"fabricated) split "
                          f"into erasure (ger_all_layers ≥ {cfg.ger_threshold:g}), retained failures (the answer kept "
                          f"in some head) and failures whose GER is undefined (no answer occurrence in the context: "
                          f"unanswerable items, evidence 'none'), which are never counted as retained.",
                          why("decomposition")),
                      _decomposition_table(t.get("decomposition")),
                      _rigidity_table(t.get("rigidity"), why("rigidity"))),
            h.section("restoration", "5b. Causal restoration: what putting entries back repairs",
                      _restoration_table(restoration, cfg.ger_threshold)),
            h.section("consensus", "6. Layer-wise head consensus",
                      fig("fig-consensus", lambda: fr.consensus_figure(t.get("consensus_nosink_profiles"),
                                                                       group=t.get("consensus_group_nosink_profiles")),
                          "Sink-free Consensus(ℓ) = distinct argmax keys / query heads at the last prompt token, "
                          "argmax after the first n_sink positions (attention sinks excluded), per model; low means "
                          "the heads agree. Full cache (solid, with its 95% instance-bootstrap interval) against "
                          "compressed ratios (dashed, mean over presses); dotted: the GQA-aware value over KV groups, "
                          "the one to compare across models with different group sizes.",
                          why("consensus_nosink_profiles")),
                      _consensus_trend_table(t.get("consensus_trend"))),
            h.section("survival", "7. Evidence survival in one instance",
                      fig("fig-survival", lambda: survival_figure(survival) if survival is not None else None,
                          "Which layers and KV heads keep the evidence tokens of one instance "
                          "under one press and ratio.",
                          "No keep-mask was supplied "
                          "(pass survival=SurvivalExample(keep, evidence, ...) to build_report).")),
            h.section("probe", "8. Representation: answer identity and the logit lens",
                      h.paragraph("Probes that can fail when the evidence is gone. Answer identity: which of the "
                                  "instance's candidate values (the gold vs its distractors) is the answer, read from "
                                  "the last prompt token through the logit lens (final norm + unembedding at every "
                                  "layer, the log-prob of each candidate's first in-context token). A "
                                  "conditional-logit probe (softmax over one instance's candidates, one shared weight "
                                  "per depth quarter) is scored out of fold with instance-grouped folds, against "
                                  "chance = mean 1 / candidates; the untrained readout is the last layer's argmax, the "
                                  "model's own preference. Whatever the question alone reveals is shared by all "
                                  "candidates and cancels. Unanswerable items and items without a distinguishable "
                                  "distractor (first tokens coincide) are left out and counted."),
                      fig("fig-identity", lambda: fx.identity_figure(t.get("identity_probe")),
                          "Answer-identity accuracy per ratio with its 95% instance-bootstrap band (solid), the "
                          "untrained last-layer readout (dotted) and chance (dashed grey).", why("identity_probe")),
                      _table_or_note(t.get("identity_probe"), _IDENTITY_COLS, why("identity_probe")),
                      fig("fig-lens", lambda: fx.lens_figure(t.get("lens_profiles")),
                          "Mean log-probability of the gold answer's first in-context token under the logit lens, per "
                          "layer, full cache against the compressed ratios.", why("lens_profiles")),
                      h.paragraph("Control: the answer-type probe reads the question. The type (Person, Date, …) "
                                  "follows from the question's wording, which the question-agnostic regime never "
                                  "compresses, so this probe stays high with every evidence token evicted; it shows "
                                  "that the question is encoded, not that the evidence is usable."),
                      fig("fig-probe", lambda: fr.probe_figure(t.get("probe")),
                          "Control (reads the question): macro-F1 of a cross-validated logistic-regression probe for "
                          "the answer type on the last-prompt-token features (± std over folds), next to exact-match "
                          "accuracy.",
                          why("probe"))),
            h.section("routes", "Route-preserving selection: does it move the cliff?",
                      h.paragraph("Pairs of presses with the same scorer that differ only in selection: `+routes` "
                                  "(coverage across heads) against `+adakv` and per-head top-k. Δα* = α*(routes) − "
                                  "α*(other), with a 95% bootstrap interval that resamples instances jointly for both "
                                  "presses; ΔH is the change in hallucination rate (negative = routes hallucinates "
                                  "less)."),
                      fig("fig-routes", lambda: fx.routes_figure(t.get("selection_comparison")),
                          "ΔH(α) = H(routes) − H(other) per ratio with paired 95% bootstrap bands.",
                          why("selection_comparison") if "selection_comparison" in notes else
                          "no press pair differing only in +routes selection in these records"),
                      _table_or_note(t.get("selection_comparison"), _ROUTES_COLS,
                                     "no press pair differing only in +routes selection in these records")),
            h.section("redundancy", "10. Redundancy: reachability against the heads that keep the evidence",
                      fig("fig-redundancy", lambda: fx.redundancy_figure(t.get("redundancy"), t.get("redundancy_fit")),
                          "Empirical share of compressed cells whose evidence stays directly reachable, against k = "
                          "the number of (layer, KV head) pairs keeping an evidence token (Wilson 95% intervals), "
                          "beside 1 − (1 − p)^k with p fitted by maximum likelihood.", why("redundancy")),
                      _table_or_note(t.get("redundancy_fit"), [("model", "model"), ("p", "fitted p"),
                                                               ("n_cells", "cells"), ("max_k", "largest k")],
                                     why("redundancy"))),
            h.section("retrieval", "10b. Retrieval heads: does the answer's survival in them predict hallucination?",
                      h.paragraph("Retrieval heads (Wu et al. 2024), per model from its full-cache cells "
                                  "(metric 'retrieval'): a head's score is the share of copied answer tokens "
                                  "generated while it attended most to that token in the answer; heads scoring at "
                                  "least 0.1 are retrieval heads. "
                                  "Retrieval survival of a compressed cell is the mean share of the answer's tokens "
                                  "their KV heads keep. Within each ratio, the AUC for hallucination of 1 − retrieval "
                                  "survival against that of GER (weighted over ratios), and their difference with a "
                                  "95% instance-bootstrap interval."),
                      _table_or_note(t.get("retrieval"), _RETRIEVAL_COLS, why("retrieval"))),
            h.section("tickets", "11. Token-route lottery tickets",
                      *_ticket_parts(tickets, ticket_images, t.get("cliffs"))),
            h.section("examples", "12. Example answers per ratio", h.paragraph(
                "A few answers per ratio, chosen at random (seeded), shown verbatim as text."),
                _examples(df, examples_per_ratio, cfg.seed)),
            h.section("notes", "Notes and operational choices",
                      h.table([{"setting": k, "value": v} for k, v in s["settings"].items()],
                              [("setting", "setting"), ("value", "value")]),
                      h.table([{"section": k, "note": v} for k, v in notes.items()],
                              [("section", "section"), ("note", "note")])
                      if notes else h.paragraph("Every section ran.")),
            h.section("manifest", "Run manifest", manifest_html(manifest)),
        ]
        toc = [("findings", "Findings"), ("run", "What was run"), ("headline", "Headline numbers"),
               ("cliff", "Hallucination cliff"),
               ("league", "Press league"), ("context", "α* against context length"),
               ("size", "α* against model size"), ("ger", "GER and hallucination"),
               ("rau", "Retention, accessibility, utilization"), ("decomposition", "Failure decomposition"),
               ("restoration", "Causal restoration"),
               ("consensus", "Layer-wise consensus"), ("survival", "Evidence survival"),
               ("probe", "Identity and logit lens"),
               ("routes", "Route-preserving selection"), ("redundancy", "Redundancy"),
               ("retrieval", "Retrieval heads"), ("tickets", "Lottery tickets"),
               ("examples", "Example answers"),
               ("notes", "Notes"), ("manifest", "Run manifest")]
    meta = (f"kvroute {__version__} · {s['n_records']} records · "
            f"bootstrap {cfg.n_boot} replicates over instances, seed {cfg.seed}")
    files["summary.json"] = json.dumps(s, indent=2, allow_nan=False, ensure_ascii=False).encode("utf-8")
    files["report.html"] = h.page(title, meta, toc, body, opening=opening).encode("utf-8")  # last: the entry point
    write_folder(out, files, owned=REPORT_FILES)
    path = out / "report.html"
    log.info("wrote %s", path)
    return path


def _ticket_parts(tickets: pd.DataFrame | None, images: list[tuple[str, bytes]] | None,
                  cliffs: pd.DataFrame | None) -> list[str]:
    from kvroute.analysis.tickets import tickets_vs_cliffs

    if tickets is None or tickets.empty:
        return [h.note("No tickets in this run (write some with `kvroute ticket --out RUN_DIR`).")]
    cols = [("model", "model"), ("instance_id", "instance"), ("family", "family"), ("target", "target"),
            ("regime", "regime"), ("entries", "entries kept"), ("total_entries", "context entries"),
            ("fraction", "share of context"), ("question_tokens", "question tokens (always kept)"),
            ("fraction_with_question", "share incl. question"),
            ("tokens_kept", "tokens kept"), ("context_tokens", "context tokens"),
            ("evidence_tokens_in_ticket", "evidence tokens in ticket"), ("evidence_tokens", "evidence tokens"),
            ("answer", "answer"), ("evaluations", "decodes")]
    parts = [h.paragraph("A ticket is a set of kept (layer, KV head, token) entries, found by greedy pruning along the "
                         "answer's attention mass with batched re-checks and a backward pass, that still yields the "
                         "answer. Every ticket listed was decoded and passed."),
             h.table(tickets, [c for c in cols if c[0] in tickets.columns], text_columns=["answer"])]
    cmp = tickets_vs_cliffs(tickets, cliffs)
    if not cmp.empty and "press" in cmp.columns:
        parts.append(h.paragraph("Median ticket size against the share of the context a press keeps at its cliff "
                                 "(1 − α*), matched by model, regime and the tickets' task family (the pooled curve "
                                 "when that family has no curve of its own): how much more of the cache a press needs "
                                 "than the routes that carry the answer. Both count context entries; the question "
                                 "suffix, kept whole in every cell, is shown apart in the table above."))
        parts.append(h.table(cmp, [c for c in [("model", "model"), ("regime", "regime"), ("family", "ticket family"),
                                   ("press", "press"), ("cliff_family", "cliff curve"), ("tickets", "tickets"),
                                   ("ticket_median", "ticket (median share)"),
                                   ("ticket_median_with_question", "ticket incl. question (median)"),
                                   ("kept_at_cliff", "kept at cliff"),
                                   ("cliff_over_ticket", "ratio")] if c[0] in cmp.columns]))
    for caption, png in (images or [])[:3]:
        parts.append(h.figure(f"fig-ticket-{len(parts)}", data_uri(png), caption))
    return parts


_IDENTITY_COLS = [("model", "model"), ("press", "press"), ("regime", "regime"), ("ratio", "α"),
                  ("accuracy", "identity accuracy"), ("accuracy_low", "low"), ("accuracy_high", "high"),
                  ("chance", "chance"), ("p_value", "p (above chance)"), ("untrained", "untrained (last layer)"),
                  ("lens_logprob_final", "log p(gold first token)"), ("lens_top1", "gold top-1"), ("exact", "exact"),
                  ("n", "items"), ("null_folds", "folds with no direction"), ("mean_candidates", "candidates"),
                  ("n_excluded_unanswerable", "unanswerable (out)"),
                  ("n_excluded_no_distractor", "no distractor (out)"), ("n_candidates_dropped", "distractors dropped"),
                  ("note", "note")]

_ROUTES_COLS = [("model", "model"), ("regime", "regime"), ("press_a", "press"), ("press_b", "against"),
                ("alpha_a", "α* (press)"), ("status_a", "fit (press)"), ("alpha_b", "α* (routes)"),
                ("status_b", "fit (routes)"), ("delta_alpha", "Δα*"),
                ("delta_alpha_low", "Δα* low"), ("delta_alpha_high", "Δα* high"),
                ("delta_alpha_interval", "Δα* interval (open ends explained)"),
                ("boot_valid", "replicates with cliffs"),
                ("delta_h_top", "mean ΔH, α ≥ 0.7"), ("delta_h_top_low", "low"), ("delta_h_top_high", "high"),
                ("n_instances", "instances")]

_WITHIN_COLS = [("model", "model"), ("press", "press"), ("regime", "regime"), ("family", "family"),
                ("or_per_tenth", "OR per +0.1 GER"), ("or_per_tenth_low", "low"), ("or_per_tenth_high", "high"),
                ("risk_difference", "ΔP(H) evicted − retained"), ("risk_difference_low", "low"),
                ("risk_difference_high", "high"), ("n_cells_fit", "cells"), ("n_instances_fit", "instances"),
                ("n_strata_fit", "strata"), ("strata", "stratum"), ("verdict", "within-ratio verdict")]

_COND_COLS = [("model", "model"), ("press", "press"), ("regime", "regime"), ("family", "family"),
              ("n_evicted", "cells evicted"), ("p_h_evicted", "P(H | evicted), pooled over ratios"),
              ("n_kept", "cells retained"), ("p_h_kept", "P(H | retained), pooled over ratios"),
              ("risk_ratio", "pooled risk ratio"), ("fisher_p", "Fisher p (pooled)"),
              ("difference_within_ratio", "difference within ratio (MH)")]


def _table_or_note(df: pd.DataFrame | None, cols: list[tuple[str, str]], missing: str) -> str:
    if df is None or df.empty:
        return h.note(missing)
    return h.table(df, [c for c in cols if c[0] in df.columns])


def _headline_table(rows: list[dict[str, Any]]) -> str:
    return h.table(rows, [
        ("model", "model"), ("press", "press"), ("regime", "regime"), ("alpha_star", "α*"),
        ("alpha_star_interval", "α* 95% CI"),
        ("cliff_status", "fit"), ("alpha_half", "α½ (monotone)"), ("alpha_half_interval", "α½ 95% CI"),
        ("alpha_chi_max", "argmax χ"), ("safe_ratio", "safe ratio"), ("h_baseline", "H(0)"),
        ("ger_or_per_tenth", "OR per +0.1 GER (within ratio)"), ("ger_or_per_tenth_ci", "OR 95% CI"),
        ("ger_risk_difference", "ΔP(H) evicted − retained (within ratio)"), ("ger_within_verdict", "GER link"),
        ("ger_pearson_r", "pooled r (confounded by α)"), ("p_h_given_evicted", "P(H|evicted), pooled"),
        ("p_h_given_retained", "P(H|retained), pooled"), ("context_length_verdict", "length law"),
        ("identity_accuracy_baseline", "identity acc. (α=0)"), ("identity_chance", "chance"),
        ("identity_max_ratio", "largest α"), ("identity_accuracy_at_max_ratio", "identity acc. (largest α)"),
        ("identity_accuracy_at_max_ratio_ci", "95% CI"),
        ("control_type_probe_f1_baseline", "control: type-probe F1 (α=0, reads the question)")])


def _cliff_table(cliffs: pd.DataFrame | None) -> str:
    if cliffs is None or cliffs.empty:
        return ""
    return h.table(cliffs, [("model", "model"), ("press", "press"), ("regime", "regime"), ("family", "family"),
                            ("alpha_star", "α*"), ("alpha_star_low", "CI low"), ("alpha_star_high", "CI high"),
                            ("alpha_star_identified", "identified"), ("status", "fit"),
                            ("boot_below_grid", "reps below grid"), ("boot_beyond_grid", "reps beyond grid"),
                            ("boot_no_cliff", "reps no cliff"), ("alpha_half", "α½ (monotone)"),
                            ("alpha_half_low", "α½ low"), ("alpha_half_high", "α½ high"),
                            ("alpha_half_identified", "α½ identified"), ("alpha_chi_max", "argmax χ"),
                            ("chi_max", "max χ"),
                            ("safe_ratio", "safe ratio"), ("n_instances", "instances"), ("reason", "note")],
                   text_columns=["reason"])


def _verdict_table(v: pd.DataFrame | None) -> str:
    if v is None or v.empty:
        return ""
    return h.table(v, [("model", "model"), ("press", "press"), ("regime", "regime"), ("n_lengths", "lengths"),
                       ("cv_kept", "CV of 1 − α*"), ("cv_budget", "CV of budget*"), ("steadier", "steadier"),
                       ("beta", "β"), ("beta_low", "β low"), ("beta_high", "β high"), ("verdict", "verdict"),
                       ("reason", "why")], text_columns=["reason"])


def _size_tables(by_model: pd.DataFrame | None, trends: pd.DataFrame | None) -> str:
    if by_model is None or by_model.empty:
        return ""
    out = h.table(by_model, [c for c in [
        ("family", "family"), ("press", "press"), ("regime", "regime"), ("model", "model"), ("params", "parameters"),
        ("n_instances", "instances"), ("h0", "H(0)"), ("alpha_star", "α*"), ("alpha_star_low", "CI low"),
        ("alpha_star_high", "CI high"), ("status", "fit"), ("reason", "note")] if c[0] in by_model.columns],
        text_columns=["reason"])
    if trends is None or trends.empty:
        return out
    cols = [("family", "family"), ("press", "press"), ("regime", "regime"), ("n_models", "models fitted"),
            ("slope", "slope (logit α* per 10× N)"), ("slope_low", "low"), ("slope_high", "high")]
    for c in trends.columns:
        if c.startswith("pred_") and c.count("_") == 1:
            lab = c[5:]
            cols += [(c, f"α* at {lab}"), (f"{c}_low", "low"), (f"{c}_high", "high"),
                     (f"{c}_has_paper", "contains 0.9")]
    cols += [("boot_valid", "replicates used"), ("verdict", "verdict"), ("reason", "why")]
    return out + h.table(trends, [c for c in cols if c[0] in trends.columns], text_columns=["reason"])


def _consensus_trend_table(trend: pd.DataFrame | None) -> str:
    """The full-cache depth trend per model and consensus variant (sink-free first)."""
    if trend is None or trend.empty:
        return ""
    t = trend[trend["ratio"] == 0].drop_duplicates(["model", "regime", "measure"])
    if t.empty:
        return ""
    return (h.paragraph("Where the heads agree at the full cache: mean consensus over the first and the last third of "
                        "the layers; 'funnel' (late convergence) or 'diversifying' only when the 95% "
                        "instance-bootstrap interval of late − early excludes 0. consensus_withsink (sinks included) "
                        "is shown for reference only.")
            + h.table(t, [("model", "model"), ("regime", "regime"), ("measure", "measure"), ("early", "early"),
                          ("late", "late"), ("change", "late − early"), ("change_low", "low"),
                          ("change_high", "high"), ("trend", "trend")]))


_DECOMP_COLS = [("model", "model"), ("press", "press"), ("regime", "regime"), ("ratio", "α"),
                ("n_cells", "cells"), ("n_failures", "failures"),
                ("erasure_share", "erased"), ("erasure_share_low", "low"), ("erasure_share_high", "high"),
                ("retained_share", "retained"), ("retained_share_low", "low"), ("retained_share_high", "high"),
                ("undefined_share", "undefined"), ("undefined_share_low", "low"), ("undefined_share_high", "high"),
                ("dominant", "dominant")]


def _decomposition_table(d: pd.DataFrame | None) -> str:
    """Shares of the failures at each compressed ratio, with their instance-bootstrap intervals."""
    if d is None or d.empty or "erasure_share" not in d.columns:
        return ""
    d = d[(d["ratio"] > 0) & (d["n_failures"] > 0)]
    if d.empty:
        return ""
    return (h.paragraph("Shares of the failures at each compressed ratio (erased / retained / undefined GER; they add "
                        "up to 1), with 95% intervals from a bootstrap over instances.")
            + h.table(d, [c for c in _DECOMP_COLS if c[0] in d.columns]))


_RETRIEVAL_COLS = [("model", "model"), ("retrieval_heads", "retrieval heads"), ("events", "copying events"),
                   ("cells", "compressed cells"), ("auc_retrieval", "AUC: retrieval survival"), ("auc_ger", "AUC: GER"),
                   ("delta", "difference"), ("low", "95% low"), ("high", "95% high"), ("verdict", "verdict")]


def _restoration_table(r: pd.DataFrame | None, ger_threshold: float) -> str:
    intro = h.paragraph(
        "A restored cell is its press's keep-mask at its ratio with chosen entries kept again (the sweep config's "
        "`restore` list: answer, evidence, random — as many other tokens, the null —, distractor — as many "
        "tokens of the distractor values, the null of the answer's kind —, optionally one band of layers or some KV "
        "heads), decoded like any cell. Among the base cells that failed where the full cache "
        "answered correctly (the failures compression caused), by failure class "
        f"(erasure: ger_all_layers ≥ {ger_threshold:g}; retained; undefined GER), the share the restoration "
        "repaired (the restored cell answers correctly; one that names the gold among other candidates — listed — "
        "is not a repair and is counted apart), with Wilson 95% intervals over instances. A failure "
        "that restore=answer repairs, and restore=distractor does not, was an erasure of the answer causally; a "
        "retained failure that restore=evidence does not repair is rigidity-like.")
    if r is None or r.empty:
        return intro + h.note("no restored cells in these records (add restore = [\"answer\", \"evidence\", "
                              "\"random\", \"distractor\"] to the sweep config)")
    r = r.copy()
    r["interval"] = [f"[{lo:.2f}, {hi:.2f}]" for lo, hi in zip(r["low"], r["high"], strict=True)]
    cols = [("model", "model"), ("press", "press"), ("ratio", "α"), ("restore", "restore"), ("class", "base failure"),
            ("failures", "failures"), ("repaired", "repaired"), ("listed", "listed (not repaired)"),
            ("share", "share"), ("interval", "95% interval")]
    return intro + h.table(r, [c for c in cols if c[0] in r.columns])


def _rigidity_table(r: pd.DataFrame | None, missing: str) -> str:
    if r is None or r.empty:
        return h.note(missing)
    cols = [("model", "model"), ("press", "press"), ("regime", "regime"), ("ratio", "α"),
            ("n_retained_failures", "retained failures"), ("n_matched_successes", "matched successes"),
            ("consensus_nosink_fail", "consensus (fail)"), ("consensus_nosink_success", "consensus (success)"),
            ("consensus_nosink_delta", "Δ consensus"), ("rho_nosink_delta", "Δ ρ")]
    return (h.paragraph("Retained failures against successes at the same ratio with matched GER (binned), sink-free "
                        "consensus and ρ: a negative Δ consensus / positive Δ ρ means the failing cells' heads agree "
                        "more — rigidity.")
            + h.table(r, [c for c in cols if c[0] in r.columns]))


def _breakdown_tables(t: dict[str, pd.DataFrame]) -> str:
    parts = []
    for by in ("answer_type", "question_type"):
        b = t.get(f"by_{by}")
        if b is None or b.empty or "f1" not in b.columns:
            continue
        pivot = b.groupby(["model", by, "ratio"])["f1"].mean().unstack("ratio").reset_index()
        cols = [("model", "model"), (by, by)] + [(r, f"F1 α={r:g}") for r in pivot.columns[2:]]
        parts.append(h.paragraph(f"Mean F1 by {by.replace('_', ' ')} (presses pooled).") + h.table(pivot, cols))
    return "".join(parts)


def _examples(df: pd.DataFrame, per_ratio: int, seed: int) -> str:
    if "answer" not in df.columns:
        return h.note("The records carry no answer text.")
    data = attach_baseline(df)
    rng = np.random.default_rng(seed)
    picks = []
    for _, g in data.sort_values(["ratio", "model", "press", "instance_id"]).groupby("ratio", sort=True):
        idx = rng.choice(len(g), size=min(per_ratio, len(g)), replace=False)
        picks.append(g.iloc[np.sort(idx)])
    ex = pd.concat(picks)
    cols = [("ratio", "α"), ("model", "model"), ("press", "press"), ("instance_id", "instance"),
            ("outcome", "outcome"), ("f1", "F1"), ("gold", "gold"), ("answer", "answer")]
    return h.table(ex, [c for c in cols if c[0] in ex.columns], text_columns=["gold", "answer"])


def build_run_report(run: str | Path, out_dir: str | Path | None = None, *, title: str = "kvroute report",
                     config: AnalysisConfig | None = None, survival_file: str | Path | None = None,
                     progress: Progress = SILENT) -> Path:
    """The report of a run: its records, manifest, tickets and a saved keep-mask, read from disk and reported.

    The one way ``kvroute report`` and ``kvroute demo`` turn a run into a report. ``run`` is a run
    folder (store, manifest, ``tickets.jsonl``, ``tickets/*.png``, ``masks/*.npz``) or a records file
    (.parquet, .csv, .jsonl; its folder is read for the rest). ``out_dir`` defaults to ``RUN/report``.
    ``survival_file`` picks the keep-mask for the survival heatmap (default: the first under ``masks/``).
    A session that a killed sweep left "running" reads "interrupted" in the report (in memory only).
    """
    from kvroute.analysis.load import load_manifest, load_records
    from kvroute.analysis.restoration import restoration_table
    from kvroute.analysis.tickets import load_tickets
    from kvroute.report.heatmap import load_survival

    run = Path(run)
    base = run if run.is_dir() else run.parent
    df = load_records(run)
    restoration = restoration_table(load_records(run, with_restored=True))
    if survival_file is None:
        masks = sorted((base / "masks").glob("*.npz"))
        survival_file = masks[0] if masks else None
    pngs = sorted((base / "tickets").glob("*.png"))[:3]
    images = [(f"Token-route lottery ticket for instance {p.stem}: which layers and KV heads keep its evidence "
               "tokens.", p.read_bytes()) for p in pngs]
    manifest = load_manifest(run)
    if manifest is not None:
        from kvroute.sweep.manifest import mark_stale

        mark_stale(manifest, base)
    return build_report(df, Path(out_dir) if out_dir is not None else base / "report", manifest=manifest,
                        title=title, config=config, tickets=load_tickets(run),
                        survival=load_survival(survival_file) if survival_file is not None else None,
                        ticket_images=images, restoration=restoration, progress=progress)
