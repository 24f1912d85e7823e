"""Compress once, ask many: hallucination, GER and α* by turn of a conversation, and what later turns cost.

Records of a run with ``decoding.history`` carry ``conversation`` and ``turn``
(:func:`kvroute.runner.run_conversation`): every question of a conversation is asked after the same
compressed context, turn ``k`` with the ``k − 1`` earlier exchanges in the cache uncompressed.

* ``turn_curves``: per (model, press, regime, turn) and ratio, H with its 95% bootstrap interval over
  conversations, and the mean GER of that turn's own evidence (``ger_evidence``) with its interval.
  Each turn asks a different question about the same context, so a turn's H mixes what compression
  does with how hard its question is: the comparison below subtracts the full cache's own failures.
* ``turn_cliffs``: α* by turn — :func:`kvroute.analysis.cliff.cliff_tables` with ``turn`` among its
  keys, on the caused view (below), its reported interval and its "cannot decide" rule unchanged.
* ``turn_pairs``: per press and later turn ``k``, paired on conversations: the area under H(α) over
  the ratio grid at turn ``k`` minus that at turn 1, on the conversations whose full cache answers
  *both* questions correctly (the caused view, :func:`kvroute.analysis.common.caused_view`: a question
  the model fails uncompressed says nothing about what compression does, and the turns ask different
  questions, so a turn with more hard questions would otherwise look different for that reason
  alone — tested with planted hard questions). A positive difference says the later turn loses more
  to compression than the first. Interval: paired bootstrap over conversations; decision: the
  within-conversation sign-flip test (:func:`kvroute.analysis.paired.sign_flip_p`), Holm-adjusted over
  the (press, turn) pairs of one (model, regime); undecided below ``min_instances`` shared
  conversations. The finding sentence is written here.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from kvroute.analysis.bootstrap import percentile_interval, resample_weights
from kvroute.analysis.cliff import cliff_tables
from kvroute.analysis.common import (
    BASELINE_PRESS,
    AnalysisError,
    attach_baseline,
    caused_view,
    group_seed,
    require_columns,
)
from kvroute.analysis.paired import holm, instance_areas, paired_sentence, sign_flip_p

TURN_KEYS = ("model", "press", "regime", "turn")
PAIR_COLUMNS = ["model", "regime", "press", "turn", "n_shared", "n_ratios", "area_first", "area_turn",
                "difference", "difference_low", "difference_high", "p_value", "p_holm", "decided", "finding"]


def has_turns(df: pd.DataFrame) -> bool:
    """Whether the records hold conversations of more than one turn."""
    return "turn" in df.columns and pd.to_numeric(df["turn"], errors="coerce").max() > 1


def _turn_data(df: pd.DataFrame) -> pd.DataFrame:
    data = attach_baseline(df)
    require_columns(data, ["hallucinated", "instance_id", "ratio", "press", "model", "regime", "turn",
                           "conversation"], "the analysis by turn")
    data = data[data["turn"].notna() & data["hallucinated"].notna() & (data["press"] != BASELINE_PRESS)].copy()
    data["turn"] = data["turn"].astype(int)
    return data


def _interval(values: np.ndarray, n_boot: int, confidence: float, rng: np.random.Generator) -> tuple[float, ...]:
    """Mean of per-conversation ``values`` and its bootstrap percentile interval (NaN ends below 2 values)."""
    if len(values) < 2:
        return (float(values.mean()) if len(values) else float("nan"), float("nan"), float("nan"))
    reps = resample_weights(len(values), n_boot, rng) @ values / len(values)
    lo, hi = percentile_interval(reps, confidence)
    return float(values.mean()), float(lo), float(hi)


def turn_curves(df: pd.DataFrame, *, n_boot: int = 1000, confidence: float = 0.95, seed: int = 0) -> pd.DataFrame:
    """H and the GER of each turn's own evidence, per (model, press, regime, turn, ratio), over conversations."""
    data = _turn_data(df)
    has_ger = "ger_evidence" in data.columns
    rows = []
    for key, g in data.groupby([*TURN_KEYS, "ratio"], sort=True):
        rng = group_seed(seed, ("turn_curves", *key))
        per = g.groupby("conversation")
        h = per["hallucinated"].mean().to_numpy(float)
        row = dict(zip([*TURN_KEYS, "ratio"], key, strict=True))
        row.update(n_conversations=len(h), **dict(zip(("h", "h_low", "h_high"), _interval(h, n_boot, confidence,
                                                                                            rng), strict=True)))
        if has_ger:
            ger = pd.to_numeric(g["ger_evidence"], errors="coerce").groupby(g["conversation"]).mean().dropna()
            row.update(dict(zip(("ger_evidence", "ger_low", "ger_high"),
                                _interval(ger.to_numpy(float), n_boot, confidence, rng), strict=True)))
        rows.append(row)
    return pd.DataFrame(rows)


def turn_cliffs(df: pd.DataFrame, *, n_boot: int = 1000, confidence: float = 0.95, seed: int = 0) -> pd.DataFrame:
    """α* by turn: the cliff table's rows with ``turn`` among the keys, on the caused view (each turn's questions
    that the full cache answers right), since the turns ask different questions."""
    data = caused_view(df[df["turn"].notna()]).assign(turn=lambda d: d["turn"].astype(int))
    return cliff_tables(data, keys=TURN_KEYS, n_boot=n_boot, confidence=confidence, seed=seed)[1]


def _areas(cells: pd.DataFrame, grid: list[float]) -> pd.Series:
    """Per conversation, the area under H(α) over ``grid`` of its question at this turn (caused view)."""
    area = instance_areas(cells, grid)
    conv = cells.drop_duplicates("instance_id").set_index("instance_id")["conversation"]
    return pd.Series(area.to_numpy(float), index=conv.loc[area.index].to_numpy())


def turn_pairs(df: pd.DataFrame, *, n_boot: int = 2000, confidence: float = 0.95, seed: int = 0,
               min_instances: int = 10) -> pd.DataFrame:
    """Each later turn against turn 1, per press: the paired difference of areas under H (module docstring)."""
    data = _turn_data(caused_view(df))
    rows: list[dict[str, Any]] = []
    for (model, regime), g in data.groupby(["model", "regime"], sort=True):
        group: list[dict[str, Any]] = []
        for press, gp in g.groupby("press", sort=True):
            first = gp[gp["turn"] == 1]
            for turn, gt in gp[gp["turn"] > 1].groupby("turn", sort=True):
                grid = sorted(set(first["ratio"].astype(float)) & set(gt["ratio"].astype(float)))
                if len(grid) < 2:
                    continue
                a, b = _areas(first, grid), _areas(gt, grid)
                shared = a.index.intersection(b.index)
                d = (b.loc[shared] - a.loc[shared]).to_numpy(float)
                rng = group_seed(seed, ("turns", model, regime, press, turn))
                mean, lo, hi = _interval(d, n_boot, confidence, rng)
                group.append({"model": model, "regime": regime, "press": press, "turn": int(turn),
                              "n_shared": len(d), "n_ratios": len(grid),
                              "area_first": float(a.loc[shared].mean()) if len(d) else None,
                              "area_turn": float(b.loc[shared].mean()) if len(d) else None,
                              "difference": mean, "difference_low": lo, "difference_high": hi,
                              "p_value": sign_flip_p(d, n_draws=n_boot, rng=rng) if len(d) >= 2 else 1.0})
        if not group:
            continue
        for r, ph in zip(group, holm(np.array([r["p_value"] for r in group])), strict=True):
            r["p_holm"] = float(ph)
            r["decided"] = bool(r["n_shared"] >= min_instances and ph <= 1 - confidence)
            r["finding"] = turn_finding(r, min_instances)
        rows += group
    if not rows:
        raise AnalysisError("no press has turn 1 and a later turn at two or more common ratios with the ratio-0 "
                            "baseline (a run with decoding.history and multi-question tasks)")
    return pd.DataFrame(rows, columns=PAIR_COLUMNS)


def turn_finding(r: dict[str, Any], min_instances: int) -> str:
    """The sentence of one (press, turn) pair."""
    who = f"{r['press']} at turn {r['turn']} ({r['model']}, {r['regime']})"
    iv = (f"{r['difference']:+.3f} [{r['difference_low']:+.3f}, {r['difference_high']:+.3f}] in H over the ratio "
          f"grid against turn 1 (area {r['area_turn']:.3f} vs {r['area_first']:.3f}, paired on {r['n_shared']} "
          f"conversations the full cache answers right at both turns, Holm p = {r['p_holm']:.3g})")
    verb = "loses more" if r["difference"] > 0 else "loses less"
    return paired_sentence(who, iv, f"the later turn {verb} to compression — {iv}", n=r["n_shared"],
                           unit="conversations", min_instances=min_instances, decided=r["decided"])


def turn_alpha_text(cliffs: pd.DataFrame) -> list[str]:
    """α* by turn per (model, press, regime), in words: one line each, the cliff table's own interval words."""
    out = []
    for (model, press, regime), g in cliffs.groupby(["model", "press", "regime"], sort=True):
        parts = []
        for r in g.sort_values("turn").to_dict(orient="records"):
            a = r.get("alpha_star")
            point = "no estimate" if a is None or (isinstance(a, float) and np.isnan(a)) else f"{a:.2f}"
            parts.append(f"turn {int(r['turn'])}: α* {point} ({r.get('alpha_star_interval') or r.get('reason')})")
        out.append(f"{press} ({model}, {regime}): " + "; ".join(parts))
    return out
