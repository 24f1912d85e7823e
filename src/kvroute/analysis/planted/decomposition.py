"""Planted truth for the failure decomposition: known erased / retained / undefined shares of the failures.

Each simulated record set is one (model, press, regime) at one compressed ratio, with
``n_instances`` instances, each answered under ``n_seeds`` decoding seeds. Instances are of three
kinds:

* **answerable**, GER defined: a cell fails with probability ``p_fail``; a failing cell is erased
  (``ger_all_layers = 1``) with the instance's own probability e_i ~ Beta with mean ε and
  concentration :data:`CONCENTRATION` (an instance that loses its answer tends to lose it under every
  seed, so cells of one instance are correlated and only an instance bootstrap is honest),
  otherwise retained (``ger_all_layers`` in [0, 0.95]);
* **unanswerable** (``ger``/``ger_all_layers`` NaN) and **evidence "none"** (the answer never occurs
  in the context; the record still carries a stale ``ger_all_layers`` of 0, which must not count):
  both have undefined GER and fail with probability ``p_fail_undefined``.

Outcomes: failures are distractor / fabricated / abstained / partial; successes are ``correct`` —
in some scenarios a share of them are sentence answers containing the gold, with F1 in
[0.31, 0.40] and a retained-looking GER (the old F1 < 0.5 rule counted them as retained failures).

The planted shares (s_e, s_r, s_u) of the failures fix the mix: with undefined instances a share
q of all instances, s_u = q·p_u / (q·p_u + (1 − q)·p_a), and ε = s_e / (1 − s_u). Rows: for each
scenario and class, the mean estimated share and the share of sets whose 95% instance-bootstrap
interval covers the truth; ``old_rule_estimate`` is what the pre-fix rule (failure = hallucinated
or F1 < 0.5; NaN GER counted as retained) gives on the same sets; ``cell_bootstrap_coverage`` (with
several seeds per instance) is the coverage of the same bootstrap over cells instead of instances,
which ignores the correlation of an instance's seeds; ``misclassified`` counts cells
whose class differs from the planted one (it must be 0: undefined items are never retained).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from kvroute.analysis.decomposition import FAILURE_CLASSES, failure_classes, failure_decomposition

RATIO = 0.9
CONCENTRATION = 4.0  # Beta(ε·c, (1 − ε)·c): the spread of the instances' erasure propensities
N_BOOT = 1000  # bootstrap replicates per simulated set (the report uses 1000)


@dataclass(frozen=True)
class Scenario:
    name: str
    erasure: float  # planted share of failures that are erased
    undefined: float  # planted share of failures with undefined GER
    sentences: float = 0.0  # share of correct answers that are sentences with F1 in [0.31, 0.40]
    n_instances: int = 120
    n_seeds: int = 1
    p_fail: float = 0.5  # answerable items
    p_fail_undefined: float = 0.7  # unanswerable / evidence-none items

    @property
    def retained(self) -> float:
        return 1.0 - self.erasure - self.undefined

    @property
    def truth(self) -> dict[str, float]:
        return {"erasure": self.erasure, "retained": self.retained, "undefined": self.undefined}

    @property
    def undefined_instances(self) -> float:
        """q: the share of instances with undefined GER that gives the planted undefined share."""
        s, pa, pu = self.undefined, self.p_fail, self.p_fail_undefined
        return s * pa / (pu * (1 - s) + s * pa)

    @property
    def erasure_given_defined(self) -> float:
        return self.erasure / (1.0 - self.undefined)


SCENARIOS: tuple[Scenario, ...] = (
    Scenario("erasure 0.3", 0.3, 0.0),
    Scenario("erasure 0.7", 0.7, 0.0),
    Scenario("erasure 0.3, undefined 0.2, sentence answers", 0.3, 0.2, sentences=0.4),
    Scenario("erasure 0.7, undefined 0.15, sentence answers", 0.7, 0.15, sentences=0.4),
    Scenario("erasure 0.5, undefined 0.25, 3 seeds per instance", 0.5, 0.25, sentences=0.3, n_instances=80,
             n_seeds=3),
)


def simulate(sc: Scenario, rng: np.random.Generator) -> pd.DataFrame:
    """One record set with the planted shares; ``_true_class`` holds each cell's planted class."""
    n, s = sc.n_instances, sc.n_seeds
    kind = np.where(rng.random(n) < sc.undefined_instances, np.where(rng.random(n) < 0.5, "unanswerable", "none"),
                    "answerable")
    eps = sc.erasure_given_defined
    e_i = rng.beta(eps * CONCENTRATION, (1 - eps) * CONCENTRATION, n) if 0 < eps < 1 else np.full(n, eps)
    kind, e = np.repeat(kind, s), np.repeat(e_i, s)
    m = n * s
    defined = kind == "answerable"
    fail = rng.random(m) < np.where(defined, sc.p_fail, sc.p_fail_undefined)
    erased = defined & fail & (rng.random(m) < e)
    true_class = np.select([~fail, ~defined, erased], ["success", "undefined", "erasure"], "retained")
    # GER: 1 when erased; retained failures and successes keep some answer token
    ger_all = np.where(erased, 1.0, rng.uniform(0, 0.95, m))
    ger_all = np.where(kind == "none", 0.0, ger_all)  # stale value on an evidence-"none" record
    ger_all = np.where(kind == "unanswerable", np.nan, ger_all)
    ger = np.where(np.isnan(ger_all), np.nan, np.maximum(ger_all, rng.uniform(0, 1, m)))
    u = rng.random(m)
    fail_outcome = np.select([u < 0.35, u < 0.7, u < 0.85], ["distractor", "fabricated", "abstained"], "partial")
    outcome = np.where(fail, fail_outcome, "correct")
    sentence = ~fail & (rng.random(m) < sc.sentences)
    f1 = np.select([outcome == "partial", sentence, outcome == "correct"],
                   [rng.uniform(0.2, 0.8, m), rng.uniform(0.31, 0.40, m), 1.0], 0.0)
    ids = np.repeat([f"i{i:04d}" for i in range(n)], s)
    return pd.DataFrame({
        "model": "planted", "press": "p", "regime": "agnostic", "family": "base", "instance_id": ids,
        "seed": np.tile(np.arange(s), n), "ratio": RATIO, "outcome": outcome,
        "hallucinated": np.isin(outcome, ("distractor", "fabricated")), "f1": f1, "ger": ger,
        "ger_all_layers": ger_all, "evidence": np.where(kind == "none", "none", "located"),
        "unanswerable": kind == "unanswerable", "_true_class": true_class,
    })


def old_rule_shares(df: pd.DataFrame) -> dict[str, float]:
    """The shares the pre-fix rule reported: failure = hallucinated or F1 < 0.5, NaN GER counted as retained."""
    fail = df["hallucinated"].astype(bool) | (df["f1"] < 0.5)
    erased = pd.to_numeric(df["ger_all_layers"], errors="coerce").ge(1.0).fillna(False)
    nf = int(fail.sum())
    ne = int((fail & erased).sum())
    return {"erasure": ne / nf, "retained": (nf - ne) / nf, "undefined": 0.0} if nf else {}


def coverage(n_sets: int = 200, seed: int = 0, n_boot: int = N_BOOT) -> list[dict]:
    """Recovery and 95% interval coverage of the erased / retained / undefined shares, per scenario."""
    rows: list[dict] = []
    for si, sc in enumerate(SCENARIOS):
        rng = np.random.default_rng([seed, si])
        est: dict[str, list[float]] = {c: [] for c in FAILURE_CLASSES}
        cov: dict[str, list[bool]] = {c: [] for c in FAILURE_CLASSES}
        width: dict[str, list[float]] = {c: [] for c in FAILURE_CLASSES}
        old: dict[str, list[float]] = {c: [] for c in FAILURE_CLASSES}
        naive: dict[str, list[bool]] = {c: [] for c in FAILURE_CLASSES}
        misclassified, n_failures = 0, []
        for k in range(n_sets):
            df = simulate(sc, rng)
            misclassified += int((failure_classes(df).to_numpy() != df["_true_class"].to_numpy()).sum())
            d = failure_decomposition(df.drop(columns="_true_class"), n_boot=n_boot, seed=seed + k).iloc[0]
            n_failures.append(d.n_failures)
            for c in FAILURE_CLASSES:
                lo, hi, t = d[f"{c}_share_low"], d[f"{c}_share_high"], sc.truth[c]
                est[c].append(d[f"{c}_share"])
                cov[c].append(lo is not None and np.isfinite(lo) and lo - 1e-12 <= t <= hi + 1e-12)
                width[c].append(hi - lo)
            for c, v in old_rule_shares(df).items():
                old[c].append(v)
            if sc.n_seeds > 1:  # the same bootstrap over cells, as if the seeds of an instance were independent
                cells = df.drop(columns="_true_class").assign(
                    instance_id=df["instance_id"] + "/" + df["seed"].astype(str))
                dn = failure_decomposition(cells, n_boot=n_boot, seed=seed + k).iloc[0]
                for c in FAILURE_CLASSES:
                    naive[c].append(bool(dn[f"{c}_share_low"] - 1e-12 <= sc.truth[c] <= dn[f"{c}_share_high"] + 1e-12))
        for c in FAILURE_CLASSES:
            t = sc.truth[c]
            rows.append({
                "estimator": "failure_share", "parameter": f"{c} share of failures", "scenario": sc.name,
                "truth": t, "n_sets": n_sets, "mean_estimate": float(np.mean(est[c])),
                "coverage": float(np.mean(cov[c])), "mean_width": float(np.mean(width[c])),
                "old_rule_estimate": float(np.mean(old[c])) if old[c] else None,
                "cell_bootstrap_coverage": float(np.mean(naive[c])) if naive[c] else None,
                "mean_failures": float(np.mean(n_failures)), "n_instances": sc.n_instances, "n_seeds": sc.n_seeds,
                "n_boot": n_boot, "misclassified": misclassified,
                "note": ("no undefined items: the share is exactly 0 (trivial coverage)" if c == "undefined" and t == 0
                         else "undefined GER is its own class, never retained" if c == "undefined"
                         else "instance bootstrap; seeds of one instance are correlated" if sc.n_seeds > 1
                         else "instance bootstrap"),
            })
    return rows
