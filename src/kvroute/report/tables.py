"""The report's tables: which columns each shows, under which header; no prose (that is in ``templates/``).

Each function returns the table's HTML, or "" where there is nothing to show (the section's template
says what instead).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from kvroute.analysis.common import attach_baseline
from kvroute.report import html as h

IDENTITY_COLS = [("model", "model"), ("press", "press"), ("regime", "regime"), ("ratio", "α"),
                  ("accuracy", "identity accuracy"), ("accuracy_low", "low"), ("accuracy_high", "high"),
                  ("verdict", "verdict"), ("chance", "chance"), ("p_value", "p (above chance)"),
                  ("untrained", "untrained (last layer)"),
                  ("lens_logprob_final", "log p(gold first token)"), ("lens_top1", "gold top-1"), ("exact", "exact"),
                  ("n", "items"), ("null_folds", "folds with no direction"), ("mean_candidates", "candidates"),
                  ("n_excluded_unanswerable", "unanswerable (out)"),
                  ("n_excluded_no_distractor", "no distractor (out)"), ("n_candidates_dropped", "distractors dropped"),
                  ("note", "note")]

ROUTES_COLS = [("model", "model"), ("regime", "regime"), ("press_a", "press"), ("press_b", "against"),
                ("alpha_a", "α* (press)"), ("status_a", "fit (press)"), ("alpha_b", "α* (routes)"),
                ("status_b", "fit (routes)"), ("delta_alpha", "Δα*"),
                ("delta_alpha_low", "Δα* low"), ("delta_alpha_high", "Δα* high"),
                ("delta_alpha_interval", "Δα* interval (open ends explained)"),
                ("boot_valid", "replicates with cliffs"),
                ("delta_h_top", "mean ΔH, α ≥ 0.7"), ("delta_h_top_low", "low"), ("delta_h_top_high", "high"),
                ("n_instances", "instances")]

WITHIN_COLS = [("model", "model"), ("press", "press"), ("regime", "regime"), ("family", "family"),
                ("or_per_tenth", "OR per +0.1 GER"), ("or_per_tenth_low", "low"), ("or_per_tenth_high", "high"),
                ("risk_difference", "ΔP(H) evicted − retained"), ("risk_difference_low", "low"),
                ("risk_difference_high", "high"), ("n_cells_fit", "cells"), ("n_instances_fit", "instances"),
                ("n_strata_fit", "strata"), ("strata", "stratum"), ("verdict", "within-ratio verdict")]

COND_COLS = [("model", "model"), ("press", "press"), ("regime", "regime"), ("family", "family"),
              ("n_evicted", "cells evicted"), ("p_h_evicted", "P(H | evicted), pooled over ratios"),
              ("n_kept", "cells retained"), ("p_h_kept", "P(H | retained), pooled over ratios"),
              ("risk_ratio", "pooled risk ratio"), ("fisher_p", "Fisher p (pooled)"),
              ("difference_within_ratio", "difference within ratio (MH)")]

DECOMP_COLS = [("model", "model"), ("press", "press"), ("regime", "regime"), ("ratio", "α"),
                ("n_cells", "cells"), ("n_failures", "failures"),
                ("erasure_share", "erased"), ("erasure_share_low", "low"), ("erasure_share_high", "high"),
                ("retained_share", "retained"), ("retained_share_low", "low"), ("retained_share_high", "high"),
                ("undefined_share", "undefined"), ("undefined_share_low", "low"), ("undefined_share_high", "high"),
                ("dominant", "dominant")]


RETRIEVAL_COLS = [("model", "model"), ("retrieval_heads", "retrieval heads"), ("events", "copying events"),
                   ("cells", "compressed cells"), ("auc_retrieval", "AUC: retrieval survival"), ("auc_ger", "AUC: GER"),
                   ("delta", "difference"), ("low", "95% low"), ("high", "95% high"), ("verdict", "verdict")]


REDUNDANCY_COLS = [("model", "model"), ("p", "fitted p"), ("n_cells", "cells"), ("max_k", "largest k")]


def table_or_note(df: pd.DataFrame | None, cols: list[tuple[str, str]], missing: str) -> str:
    if df is None or df.empty:
        return h.note(missing)
    return h.table(df, [c for c in cols if c[0] in df.columns])


def headline_table(rows: list[dict[str, Any]]) -> str:
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


def cliff_table(cliffs: pd.DataFrame | None) -> str:
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


def verdict_table(v: pd.DataFrame | None) -> str:
    if v is None or v.empty:
        return ""
    return h.table(v, [("model", "model"), ("press", "press"), ("regime", "regime"), ("n_lengths", "lengths"),
                       ("cv_kept", "CV of 1 − α*"), ("cv_budget", "CV of budget*"), ("steadier", "steadier"),
                       ("beta", "β"), ("beta_low", "β low"), ("beta_high", "β high"), ("verdict", "verdict"),
                       ("reason", "why")], text_columns=["reason"])


def size_tables(by_model: pd.DataFrame | None, trends: pd.DataFrame | None) -> str:
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




def consensus_trend_table(trend: pd.DataFrame | None) -> str:
    """The full-cache depth trend per model and consensus variant (sink-free first)."""
    if trend is None or trend.empty:
        return ""
    t = trend[trend["ratio"] == 0].drop_duplicates(["model", "regime", "measure"])
    if t.empty:
        return ""
    return h.table(t, [("model", "model"), ("regime", "regime"), ("measure", "measure"), ("early", "early"),
                       ("late", "late"), ("change", "late − early"), ("change_low", "low"),
                       ("change_high", "high"), ("trend", "trend")])


def decomposition_table(d: pd.DataFrame | None) -> str:
    """Shares of the failures at each compressed ratio, with their instance-bootstrap intervals."""
    if d is None or d.empty or "erasure_share" not in d.columns:
        return ""
    d = d[(d["ratio"] > 0) & (d["n_failures"] > 0)]
    if d.empty:
        return ""
    return h.table(d, [c for c in DECOMP_COLS if c[0] in d.columns])


def restoration_table(r: pd.DataFrame | None) -> str:
    if r is None or r.empty:
        return ""
    r = r.copy()
    r["interval"] = [f"[{lo:.2f}, {hi:.2f}]" for lo, hi in zip(r["low"], r["high"], strict=True)]
    cols = [("model", "model"), ("press", "press"), ("ratio", "α"), ("restore", "restore"), ("class", "base failure"),
            ("failures", "failures"), ("repaired", "repaired"), ("listed", "listed (not repaired)"),
            ("share", "share"), ("interval", "95% interval")]
    return h.table(r, [c for c in cols if c[0] in r.columns])


def rigidity_table(r: pd.DataFrame | None) -> str:
    if r is None or r.empty:
        return ""
    cols = [("model", "model"), ("press", "press"), ("regime", "regime"), ("ratio", "α"),
            ("n_retained_failures", "retained failures"), ("n_matched_successes", "matched successes"),
            ("consensus_nosink_fail", "consensus (fail)"), ("consensus_nosink_success", "consensus (success)"),
            ("consensus_nosink_delta", "Δ consensus"), ("rho_nosink_delta", "Δ ρ")]
    return h.table(r, [c for c in cols if c[0] in r.columns])


def breakdown_tables(t: dict[str, pd.DataFrame]) -> list[tuple[str, str]]:
    """(grouping column, table of mean F1 per ratio) for the answer and question types the records carry."""
    parts = []
    for by in ("answer_type", "question_type"):
        b = t.get(f"by_{by}")
        if b is None or b.empty or "f1" not in b.columns:
            continue
        pivot = b.groupby(["model", by, "ratio"])["f1"].mean().unstack("ratio").reset_index()
        cols = [("model", "model"), (by, by)] + [(r, f"F1 α={r:g}") for r in pivot.columns[2:]]
        parts.append((by, h.table(pivot, cols)))
    return parts


def examples_table(df: pd.DataFrame, per_ratio: int, seed: int) -> str:
    """A few answers per ratio, drawn with ``seed``; "" when the records carry no answer text."""
    if "answer" not in df.columns:
        return ""
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


TICKET_COLS = [("model", "model"), ("instance_id", "instance"), ("family", "family"), ("target", "target"),
               ("regime", "regime"), ("entries", "entries kept"), ("total_entries", "context entries"),
               ("fraction", "share of context"), ("question_tokens", "question tokens (always kept)"),
               ("fraction_with_question", "share incl. question"),
               ("tokens_kept", "tokens kept"), ("context_tokens", "context tokens"),
               ("evidence_tokens_in_ticket", "evidence tokens in ticket"), ("evidence_tokens", "evidence tokens"),
               ("answer", "answer"), ("evaluations", "decodes")]

TICKET_CLIFF_COLS = [("model", "model"), ("regime", "regime"), ("family", "ticket family"), ("press", "press"),
                     ("cliff_family", "cliff curve"), ("tickets", "tickets"),
                     ("ticket_median", "ticket (median share)"),
                     ("ticket_median_with_question", "ticket incl. question (median)"),
                     ("kept_at_cliff", "kept at cliff"), ("cliff_over_ticket", "ratio")]


def ticket_tables(tickets: pd.DataFrame | None, cliffs: pd.DataFrame | None) -> tuple[str, str]:
    """The tickets, and their median size against each press's kept share at its cliff ("" where there is none)."""
    from kvroute.analysis.tickets import tickets_vs_cliffs

    if tickets is None or tickets.empty:
        return "", ""
    listed = h.table(tickets, [c for c in TICKET_COLS if c[0] in tickets.columns], text_columns=["answer"])
    cmp = tickets_vs_cliffs(tickets, cliffs)
    if cmp.empty or "press" not in cmp.columns:
        return listed, ""
    return listed, h.table(cmp, [c for c in TICKET_CLIFF_COLS if c[0] in cmp.columns])
