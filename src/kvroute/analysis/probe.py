"""Representation probes.

Two probes of the last prompt token, which predicts the first answer token:

* **Answer identity** (:func:`identity_probe`, :func:`identity_by_ratio`) — the probe that counts.
  Which of the instance's candidate values (the gold answer vs its distractors) is the answer,
  read from the sequence lens (``lens_candidates_seq``: per candidate, the log-likelihood of its
  whole in-context token sequence after the prompt under the final norm + unembedding of every
  layer; every distinct distractor is a candidate), or, in stores made before it, from the
  first-token lens (``lens_candidates``: the log-prob of each candidate's first token; distractors
  sharing a first token dropped). A conditional-logit probe
  — softmax over one instance's candidates of ``w · x_c``, with a few weights shared by all
  candidates and instances (``x_c``: the candidate's lens log-prob averaged over ``bins``
  contiguous depth bins, weights ≥ 0 so that only "more likely" can mean "the answer") — is
  fitted across instances and scored out of fold (instance-grouped folds). Its accuracy is compared
  with chance, the mean of 1 / n_candidates, with a bootstrap
  interval over instances; the untrained readout (the last layer's argmax over candidates, i.e.
  the model's own preference among the values) is reported beside it. Everything the question
  alone reveals (the type, the wording) is shared by all candidates of an instance and cancels in
  the softmax, so the probe can only beat chance when the hidden state tells *which* value — when
  the evidence is still usable. Items that are unanswerable, or have no distinguishable
  distractor, are left out and counted.
* **Answer type** (:func:`linear_probe_macro_f1`, :func:`probe_by_ratio`) — a **control that reads
  the question**: a standardised logistic regression on ``probe_features`` for the answer-type tag,
  scored by macro-F1 under stratified k-fold cross-validation. The type follows from the question's
  wording, which the question-agnostic regime never compresses, so this probe stays perfect with
  every evidence token evicted; it shows the hidden state still encodes the question, nothing more.
"""

from __future__ import annotations

import functools
import json
import math
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
from threadpoolctl import ThreadpoolController

from kvroute.analysis.bootstrap import percentile_interval, resample_weights
from kvroute.analysis.common import (
    PRESS_KEYS,
    AnalysisError,
    as_key,
    attach_baseline,
    group_seed,
    has_columns,
    stack_vectors,
)
from kvroute.analysis.condlogit import fit_batch, gold_credit, pad

#: depth bins the identity probe averages the lens over (its number of weights)
IDENTITY_BINS = 4


@functools.cache
def _blas() -> ThreadpoolController:
    """The loaded BLAS/OpenMP pools, found once (finding them costs milliseconds, a probe's fits less)."""
    return ThreadpoolController()


def linear_probe_macro_f1(X: np.ndarray, y: Sequence[object] | np.ndarray, *, folds: int = 5,
                          seed: int = 0) -> tuple[float, float]:
    """Mean and standard deviation over folds of the macro-F1 of a logistic-regression probe (the type control).

    ``X`` is ``[n, d]``; ``y`` holds n class labels. Raises :class:`AnalysisError` when there are
    fewer than 2 classes or some class has fewer members than ``folds``.
    """
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import f1_score
    from sklearn.model_selection import StratifiedKFold
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    X = np.asarray(X, dtype=float)  # [n, d]
    y = np.asarray(y)  # [n]
    if X.ndim != 2:
        raise AnalysisError(f"probe features must be a 2-D array [n, d], got shape {X.shape}")
    if len(X) != len(y):
        raise AnalysisError(f"probe features have {len(X)} rows but there are {len(y)} labels")
    if not np.isfinite(X).all():
        raise AnalysisError("probe features contain NaN or infinite values; drop those rows first")
    if folds < 2:
        raise AnalysisError(f"folds must be at least 2, got {folds}")
    classes, counts = np.unique(y, return_counts=True)
    if len(classes) < 2:
        raise AnalysisError(f"a probe needs at least 2 classes, got {len(classes)} ({', '.join(map(str, classes))})")
    if counts.min() < folds:
        rare = ", ".join(f"{c!s} ({n})" for c, n in zip(classes, counts, strict=True) if n < folds)
        raise AnalysisError(f"too few samples per class for {folds}-fold cross-validation: {rare}; "
                            f"use more instances, fewer folds, or drop the rare classes")
    cv = StratifiedKFold(n_splits=folds, shuffle=True, random_state=seed)
    scores = []
    # one BLAS thread: these problems are tiny, and a threaded BLAS on a busy machine spends ~10x
    # longer synchronising than computing (measured: 13 s → 1.4 s for 180 fits)
    with _blas().limit(limits=1), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # convergence chatter on tiny folds
        for train, test in cv.split(X, y):
            clf = make_pipeline(StandardScaler(), LogisticRegression(max_iter=2000))
            clf.fit(X[train], y[train])
            scores.append(f1_score(y[test], clf.predict(X[test]), average="macro", labels=classes, zero_division=0))
    return float(np.mean(scores)), float(np.std(scores))


def probe_by_ratio(df: pd.DataFrame, feature_col: str = "probe_features", label_col: str = "answer_type", *,
                   keys: Sequence[str] = PRESS_KEYS, folds: int = 5, seed: int = 0) -> pd.DataFrame:
    """The answer-type control probe per (group, ratio), next to accuracy (mean ``exact``) when records carry it.

    A control: it reads the question (see the module docstring), so it cannot detect evidence loss.

    Classes with fewer than ``folds`` members in a group are left out of that group's probe (and
    named in ``note``); the same instances appear at every ratio, so the class set stays
    comparable along a curve. Groups where the probe still cannot run get NaN and the reason in
    ``note``. Returns an empty frame (with the columns) when the records have no ``feature_col``.
    """
    keys = list(keys)
    cols = [*keys, "ratio", "macro_f1", "macro_f1_std", "accuracy", "n", "n_classes", "note"]
    if not has_columns(df, [feature_col, label_col]):
        return pd.DataFrame(columns=cols)
    data = attach_baseline(df)
    data = data[data[feature_col].notna() & data[label_col].notna()]
    rows = []
    for key, g in data.groupby([*keys, "ratio"], sort=True):
        row = {**as_key([*keys, "ratio"], key), "macro_f1": np.nan, "macro_f1_std": np.nan,
               "accuracy": float(pd.to_numeric(g["exact"], errors="coerce").mean()) if "exact" in g else np.nan,
               "n": len(g), "n_classes": 0, "note": ""}
        labels = g[label_col].astype(str)
        counts = labels.value_counts()
        rare = counts[counts < folds]
        if len(rare) and len(counts) - len(rare) >= 2:
            row["note"] = ("left out classes rarer than the fold count: "
                           + ", ".join(f"{c} ({n})" for c, n in rare.items()))
            g, labels = g[~labels.isin(rare.index)], labels[~labels.isin(rare.index)]
        row["n_classes"] = int(labels.nunique())
        X = stack_vectors(g[feature_col])
        try:
            row["macro_f1"], row["macro_f1_std"] = linear_probe_macro_f1(X, labels.to_numpy(), folds=folds, seed=seed)
        except AnalysisError as e:
            row["note"] = str(e)
        rows.append(row)
    return pd.DataFrame(rows, columns=cols)


# --------------------------------------------------------------------------------------------------
# Answer identity: a conditional-logit probe over each instance's candidate values
# --------------------------------------------------------------------------------------------------

def _candidate_matrix(v: object) -> np.ndarray | None:
    """One record's ``lens_candidates`` as a float array ``[n_candidates, L]`` (None when absent or unusable)."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return None
    if isinstance(v, str):  # CSV exports keep nested lists as JSON text
        v = json.loads(v) if v.strip() else None
        if v is None:
            return None
    try:
        a = np.array(v, dtype=float)
    except (TypeError, ValueError):  # ragged or not numbers
        return None
    return a if a.ndim == 2 and a.shape[1] > 0 else None


def candidate_features(cands: np.ndarray, bins: int = IDENTITY_BINS) -> np.ndarray:
    """``[n_candidates, L]`` lens log-probs → ``[n_candidates, K]``: K − 1 depth bins, then the last layer alone.

    Features 1 … K − 1 are the means over K − 1 contiguous bins of layers 1 … L − 1; feature K is the
    last layer itself, so that the untrained readout (the last layer's argmax) is exactly the
    probe with weight only on its last feature — a special case of the model, not something an
    average over the top layers dilutes (on SmolLM2-135M the gold is the last layer's argmax in 71%
    of items under oracle at 0.95, but the argmax of the mean over the top quarter of layers in
    33%, below chance). Centred over the instance's candidates (what every candidate shares — the
    question, the layer's overall scale — cancels in the probe's softmax anyway; centring only
    fixes the scale the weights are regularised at). ``K = min(bins, L)``; ``K = 1`` is the last layer.
    """
    cands = np.asarray(cands, dtype=float)
    L = cands.shape[1]
    K = max(1, min(bins, L))
    edges = np.linspace(0, L - 1, K).round().astype(int)  # K − 1 bins over layers 1 … L − 1
    cols = [cands[:, a:b].mean(1) for a, b in zip(edges[:-1], edges[1:], strict=True)]
    f = np.stack([*cols, cands[:, -1]], axis=1)
    return f - f.mean(0, keepdims=True)


def fit_conditional_logit(feats: Sequence[np.ndarray], *, l2: float = 1.0, nonnegative: bool = True) -> np.ndarray:
    """Weights ``w [K]`` maximising Σ_i log softmax_c(w · x_ic)[gold = 0] − l2/2 ‖w‖² (features standardised).

    ``feats``: per item ``[n_candidates, K]``, the gold first. Fitted by projected Newton with the
    exact gradient and Hessian (:func:`kvroute.analysis.condlogit.fit_batch`). ``nonnegative`` (the
    default) bounds ``w ≥ 0``: the probe may only read a candidate as the answer where the lens
    makes it *more* likely. Unbounded, it could learn "the answer is the value the model does not
    predict" — which anti_oracle (it evicts exactly the gold's mentions and keeps the distractors')
    makes true without any usable evidence.
    """
    X, M = pad(feats)
    return fit_batch(X, M, np.ones((1, len(X)), bool), [l2], nonnegative=nonnegative)[0]


def _bootstrap_mean(values: np.ndarray, groups: np.ndarray, n_boot: int, confidence: float,
                    rng: np.random.Generator) -> tuple[float, float]:
    """Percentile interval of the mean of ``values`` resampling ``groups`` (instances) with replacement."""
    uniq, inv = np.unique(groups, return_inverse=True)
    sums = np.bincount(inv, weights=values, minlength=len(uniq))
    counts = np.bincount(inv, minlength=len(uniq)).astype(float)
    w = resample_weights(len(uniq), n_boot, rng)
    lo, hi = (float(x) for x in percentile_interval((w @ sums) / (w @ counts), confidence))
    # a constant resample (an abstaining probe: 1/n everywhere) is the estimate, not its rounding
    est = float(values.mean())
    lo, hi = (min(lo, est) if math.isclose(lo, est, rel_tol=1e-12, abs_tol=1e-15) else lo,
              max(hi, est) if math.isclose(hi, est, rel_tol=1e-12, abs_tol=1e-15) else hi)
    return float(lo), float(hi)


#: the L2 strengths the inner cross-validation chooses among (features standardised)
IDENTITY_L2 = (0.1, 1.0, 10.0)
#: a readout is used only where its inner out-of-fold credit beats chance at this one-sided z (5%)
IDENTITY_GATE_Z = 1.645


def _instance_folds(groups: np.ndarray, folds: int, rng: np.random.Generator) -> np.ndarray:
    """Fold index per item, instances dealt round-robin in a random order (an instance is never split)."""
    uniq = np.unique(groups)
    fold_of = dict(zip(rng.permutation(uniq), np.arange(len(uniq)) % folds, strict=True))
    return np.array([fold_of[x] for x in groups])


def _fold_weights(X: np.ndarray, M: np.ndarray, groups: np.ndarray, fold: np.ndarray, folds: int,
                  l2s: Sequence[float], nonnegative: bool, inner_folds: int, rng: np.random.Generator) -> np.ndarray:
    """Each outer fold's weights ``[folds, K]``, chosen on its training instances: the null, the last-layer readout or
    a fit.

    ``X [N, C, K]``, ``M [N, C]``: every item's features, padded (:func:`~kvroute.analysis.condlogit.pad`);
    ``fold [N]``: the outer fold (0 … ``folds`` − 1) of each item. Per outer fold, the candidates are the *last-layer
    readout* (weight only on the last feature: the untrained readout, nothing fitted) and the
    conditional logit fitted at each L2 strength in ``l2s``, each scored by the credit it earns
    out of fold in an instance-grouped inner cross-validation on the training instances (for the
    last-layer readout that is simply its credit on them). The best is refitted on all of them
    (ties go to the simpler: the readout, then the strongest L2) — but only if its credit beats
    chance there at one-sided z ≥ :data:`IDENTITY_GATE_Z`; otherwise the *null* (``w = 0``: every
    candidate ties, each item earns exactly 1 / n — chance).

    All inner fits (outer fold × inner fold × L2) are one batched solve and the refits another;
    the inner folds are drawn from ``rng`` outer fold by outer fold, and the credits summed in
    the order a fold-by-fold loop would sum them, so the choice is that loop's to the last bit.
    """
    N, _, K = X.shape
    last = np.zeros(K)
    last[-1] = 1.0
    lams = sorted(l2s, reverse=True)
    n_cand = M.sum(1)
    last_credit = gold_credit(X[:, :, -1], M).tolist()  # the readout's credit per item
    # the inner problems: (outer fold, inner fold, L2), with the items they train on and are scored on
    trains, probs = [], []
    inner_of: list[np.ndarray | None] = []
    for f in range(folds):
        tr = np.flatnonzero(fold != f)
        n_inst = len(np.unique(groups[tr]))
        inner = _instance_folds(groups[tr], min(inner_folds, n_inst), rng) if n_inst >= 2 else None
        inner_of.append(inner)
        trains.append(tr)
        if inner is None:
            continue
        for fi in np.unique(inner):
            for lam in lams:
                probs.append((f, lam, tr[inner != fi], tr[inner == fi]))
    inner_credit = np.zeros((0, N))
    if probs:
        A = np.zeros((len(probs), N), bool)
        for b, (_, _, fit_on, _) in enumerate(probs):
            A[b, fit_on] = True
        W = fit_batch(X, M, A, [lam for _, lam, _, _ in probs], nonnegative=nonnegative)  # [B, K]
        inner_credit = gold_credit(np.einsum("nck,bk->bnc", X, W), M)  # [B, N]
    weights = np.zeros((folds, K))
    refit: list[tuple[int, float]] = []
    for f in range(folds):
        tr = trains[f]
        score: dict[str | float, float] = {"last": sum(last_credit[j] for j in tr)}
        if inner_of[f] is not None:
            for lam in lams:
                score[lam] = 0.0
            for b, (fb, lam, _, te) in enumerate(probs):
                if fb == f:
                    score[lam] += sum(inner_credit[b, te].tolist())
        p = 1.0 / n_cand[tr]
        sd = math.sqrt(float((p * (1 - p)).sum()))
        order = list(score)
        best = max(order, key=lambda k: (score[k], -order.index(k)))  # the first (simplest) of the best
        if sd == 0 or (score[best] - p.sum()) / sd < IDENTITY_GATE_Z:
            continue  # the null
        if best == "last":
            weights[f] = last
        else:
            refit.append((f, float(best)))
    if refit:
        A = np.stack([fold != f for f, _ in refit])
        weights[[f for f, _ in refit]] = fit_batch(X, M, A, [lam for _, lam in refit], nonnegative=nonnegative)
    return weights


def identity_probe(candidates: Sequence[np.ndarray], groups: Sequence[object] | None = None, *,
                   folds: int = 5, bins: int = IDENTITY_BINS, l2: float | Sequence[float] = IDENTITY_L2,
                   nonnegative: bool = True, n_boot: int = 1000, confidence: float = 0.95,
                   seed: int = 0) -> dict[str, float | int]:
    """Cross-validated answer-identity accuracy against chance, and the untrained last-layer readout.

    ``candidates``: per item an array ``[n_candidates ≥ 2, L]`` of logit-lens log-probs, the gold
    first (the order carries no information to the probe: its weights are shared by all candidates
    and ties earn 1/k). ``groups``: the instance of each item (folds never split an instance; the
    bootstrap resamples instances); default: every item its own instance. ``nonnegative``: see
    :func:`fit_conditional_logit` (a probe that reads "more likely" only).

    **How each outer fold's readout is chosen.** A conditional logit fitted by likelihood is not
    fitted for accuracy, and on a few dozen instances the two part ways: where the gold is mostly
    slightly behind a distractor but now and then far ahead, the likelihood wants a positive
    weight whose argmax is wrong most of the time, and a tiny weight still commits to that
    ranking, so the fitted probe scored *below chance* out of fold (SmolLM2-135M, oracle at 0.9 /
    0.95: 0.30 / 0.26 against chance 0.37, while the untrained last-layer readout read 0.71 at
    0.95 — a readout the old model could not even express, its top bin averaging the last layer
    away). So each outer fold's readout is chosen on that fold's training instances alone, among
    the untrained last-layer readout (the last layer is its own feature, see
    :func:`candidate_features`) and the conditional logit at each strength in ``l2``, scored by
    their out-of-fold credit in an inner, instance-grouped cross-validation (``folds − 1`` inner
    folds); the winner is used only if it beats chance there at one-sided z ≥ 1.645, and
    otherwise the fold abstains — all weights 0, every candidate ties, credit exactly 1/n.

    Why the gate rather than "best of null, readout, fits": choosing, per fold, between fixed
    readouts by their credit on the *complement* of the test fold is biased below chance on a
    small set — the readout's credit on the training part and on the test part sum to its total,
    so it is chosen exactly where the test part is worse (on the SmolLM2 controls, oracle at 0.9
    whose last-layer readout is 0.42 overall read 0.26 that way). Requiring a significant margin
    on the training instances makes the choice stable across folds where the signal is real, and
    makes choosing a readout whose test part falls below chance an event of ≤ 5% per fold where
    it is not, so no way of fitting can put the probe systematically below chance; and with the
    last-layer readout on the menu it does not fall below its own special case for want of data.
    The price: a weak signal (one that does not clear the gate within ``folds − 1`` folds'
    instances) reads as chance exactly (``null_folds``), so "at chance" means "no readout found";
    a readout *below* chance (anti_oracle's, where the model prefers a distractor) shows in
    ``untrained``, not here.

    Returns ``accuracy`` (mean out-of-fold credit) with ``accuracy_low``/``accuracy_high``,
    ``chance`` (mean 1 / n_candidates), ``p_value`` (one-sided, normal approximation of the
    Poisson-binomial count under chance), ``untrained`` (last-layer argmax) with its interval,
    ``n`` items, ``n_instances``, ``folds`` and ``null_folds`` (outer folds whose chosen weights are
    all 0: no readout beat chance inside the training instances, so every test item of that fold
    earns exactly 1/n). Raises :class:`AnalysisError` on unusable input.
    """
    mats = [np.asarray(c, dtype=float) for c in candidates]
    if not mats:
        raise AnalysisError("the identity probe has no items (every item was unanswerable or had no distractor)")
    for i, m in enumerate(mats):
        if m.ndim != 2 or m.shape[0] < 2:
            raise AnalysisError(f"item {i}: the identity probe needs [n_candidates ≥ 2, L] features, "
                                f"got shape {m.shape}")
        if not np.isfinite(m).all():
            raise AnalysisError(f"item {i}: identity features contain NaN or infinite values; drop those items first")
    if len({m.shape[1] for m in mats}) > 1:
        raise AnalysisError("identity features have different layer counts; probe one model at a time")
    if folds < 2:
        raise AnalysisError(f"folds must be at least 2, got {folds}")
    g = np.asarray(list(groups) if groups is not None else range(len(mats)), dtype=object).astype(str)
    if len(g) != len(mats):
        raise AnalysisError(f"{len(mats)} items but {len(g)} group labels")
    uniq = np.unique(g)
    if len(uniq) < folds:
        raise AnalysisError(f"too few instances ({len(uniq)}) for {folds}-fold cross-validation of the identity probe; "
                            "use more instances or fewer folds")
    l2s = tuple(float(x) for x in np.atleast_1d(np.asarray(l2, dtype=float)))  # a strength or several
    if not l2s:
        raise AnalysisError("l2 must name at least one strength")
    rng = np.random.default_rng(seed)
    X, M = pad([candidate_features(m, bins) for m in mats])  # [N, C, K], [N, C]
    inner = max(2, folds - 1)
    # one BLAS thread: these problems are tiny, and a threaded BLAS on a busy machine spends far
    # longer synchronising than computing (L-BFGS-B here took 4 s on an idle machine, 22–99 s busy)
    with _blas().limit(limits=1):
        credit, null_folds = _procedure(X, M, g, folds, l2s, nonnegative, inner, rng)
        untrained = gold_credit(pad([m[:, -1:] for m in mats])[0][..., 0], M)  # the last layer's argmax  [N]
        # the interval over the whole procedure: folds, inner cross-validation, gate and fit in every replicate
        reps = _procedure_bootstrap(X, M, g, folds, l2s, nonnegative, inner, _probe_reps(n_boot), rng)
        lo, hi = (float(v) for v in percentile_interval(reps, confidence))
        ulo, uhi = _bootstrap_mean(untrained, g, n_boot, confidence, rng)
        # the chance line: the same procedure with the gold's label moved to a random candidate of each item
        null = np.array([_procedure(*_permuted(X, M, rng), g, folds, l2s, nonnegative, inner, rng)[0].mean()
                         for _ in range(_probe_reps(n_boot, permutations=True))])
    acc = float(credit.mean())
    p_chance = np.array([1.0 / m.shape[0] for m in mats])
    var = float((p_chance * (1 - p_chance)).sum())
    z = (credit.sum() - p_chance.sum()) / math.sqrt(var) if var > 0 else float("nan")
    return {"accuracy": acc, "accuracy_low": lo, "accuracy_high": hi,
            "chance": float(p_chance.mean()), "p_value": float(0.5 * math.erfc(z / math.sqrt(2))),
            "null_accuracy": float(null.mean()), "null_high": float(np.quantile(null, confidence)),
            "p_permutation": float((1 + (null >= acc - 1e-12).sum()) / (len(null) + 1)),
            "untrained": float(untrained.mean()), "untrained_low": ulo, "untrained_high": uhi,
            "n": len(mats), "n_instances": len(uniq), "folds": folds, "null_folds": null_folds}


#: below this many instances the identity probe cannot decide: on a planted readout of accuracy 0.65, its
#: whole-procedure interval covered the truth in 78% of sets at 19 instances and in 92% at 64 (tests/unit)
MIN_IDENTITY_INSTANCES = 30
#: bootstrap replicates of the whole identity procedure at the report's default ``n_boot`` of 1000 (each refits
#: every fold, so the probe uses ``n_boot / 10`` of them; at least 10)
PROBE_BOOT = 100
#: label permutations of the identity procedure that make its chance line (``n_boot / 20``; at least 10)
PROBE_PERMUTATIONS = 50


def _probe_reps(n_boot: int, *, permutations: bool = False) -> int:
    """How many times the whole procedure is rerun for the interval (or the permutation null) at ``n_boot``."""
    cap, share = (PROBE_PERMUTATIONS, 20) if permutations else (PROBE_BOOT, 10)
    return max(10, min(cap, n_boot // share))


def _procedure(X: np.ndarray, M: np.ndarray, g: np.ndarray, folds: int, l2s: Sequence[float], nonnegative: bool,
               inner: int, rng: np.random.Generator) -> tuple[np.ndarray, int]:
    """The identity procedure on items ``X``/``M`` of instances ``g``: out-of-fold credit per item ``[N]`` and the
    number of outer folds that abstained."""
    fold = _instance_folds(g, folds, rng)
    W = _fold_weights(X, M, g, fold, folds, l2s, nonnegative, inner, rng)  # [folds, K]
    null_folds = int((~(np.abs(W) > 1e-12).any(1)).sum())  # no readout beat chance: pure ties
    return gold_credit(np.einsum("nck,fk->fnc", X, W), M)[fold, np.arange(len(X))], null_folds


def _procedure_bootstrap(X: np.ndarray, M: np.ndarray, g: np.ndarray, folds: int, l2s: Sequence[float],
                         nonnegative: bool, inner: int, n_boot: int, rng: np.random.Generator) -> np.ndarray:
    """Accuracy of the whole procedure on ``n_boot`` instance resamples ``[n_boot]``. A drawn instance brings all
    its items; one drawn twice keeps one label, so its copies share a fold (no copy trains on its twin)."""
    uniq, inv = np.unique(g, return_inverse=True)
    items = [np.flatnonzero(inv == i) for i in range(len(uniq))]
    out = np.full(n_boot, np.nan)
    for b in range(n_boot):
        draw = rng.integers(0, len(uniq), len(uniq))
        if len(np.unique(draw)) < folds:
            continue
        idx = np.concatenate([items[i] for i in draw])
        out[b] = _procedure(X[idx], M[idx], g[idx], folds, l2s, nonnegative, inner, rng)[0].mean()
    return out


def _permuted(X: np.ndarray, M: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Each item's candidates with a uniformly drawn real candidate moved to the gold's place (position 0)."""
    Xp = X.copy()
    n_real = M.sum(1)
    pick = (rng.random(len(X)) * n_real).astype(int)  # [N] the candidate that becomes the "gold"
    rows = np.arange(len(X))
    Xp[rows, 0], Xp[rows, pick] = X[rows, pick], X[rows, 0]
    return Xp, M


def identity_verdict(row: Mapping[str, Any]) -> str:
    """What one identity-probe row (:data:`IDENTITY_COLUMNS`) can say, in words: "cannot decide" below
    :data:`MIN_IDENTITY_INSTANCES` instances (its interval then covers a planted accuracy in under 90% of sets),
    "at chance" where the interval reaches the chance line (the permutation null's 95% quantile, else the
    analytic chance), "above chance" otherwise; "" where the probe did not run (its note says why)."""
    n, low = _number(row.get("n_instances")), _number(row.get("accuracy_low"))
    if n is None or low is None:
        return ""
    if n < MIN_IDENTITY_INSTANCES:
        return f"cannot decide: {int(n)} instances (fewer than {MIN_IDENTITY_INSTANCES})"
    null_high = _number(row.get("null_high"))
    line = null_high if null_high is not None else _number(row.get("chance"))
    if line is not None and low <= line:
        return "at chance: the interval reaches the chance line"
    return "above chance"


def _number(x: Any) -> float | None:
    """``x`` as a float where it is a finite number, else None (a missing or NaN cell)."""
    if isinstance(x, bool) or not isinstance(x, int | float | np.integer | np.floating) or not np.isfinite(x):
        return None
    return float(x)


IDENTITY_COLUMNS = ("accuracy", "accuracy_low", "accuracy_high", "chance", "p_value", "null_accuracy", "null_high",
                    "p_permutation", "untrained", "untrained_low", "untrained_high", "n", "n_instances", "folds",
                    "null_folds")


#: the identity probe's inputs, preferred first: the whole-sequence lens (every distinct candidate), then
#: the first-token lens (candidates sharing a first token dropped; stores made before the sequence lens)
IDENTITY_INPUTS = ("lens_candidates_seq", "lens_candidates")


def identity_input(df: pd.DataFrame) -> str | None:
    """The column the identity probe reads: the first of :data:`IDENTITY_INPUTS` with any value (None if none)."""
    for col in IDENTITY_INPUTS:
        if col in df and df[col].notna().any():
            return col
    return None


def identity_by_ratio(df: pd.DataFrame, col: str | None = None, *, keys: Sequence[str] = PRESS_KEYS,
                      folds: int = 5, bins: int = IDENTITY_BINS, n_boot: int = 1000, confidence: float = 0.95,
                      seed: int = 0) -> pd.DataFrame:
    """The answer-identity probe per (group, ratio), with the exclusions counted and the lens beside it.

    ``col``: the candidate matrices read (default :func:`identity_input`: the sequence lens when the
    records have it, else the first-token lens); the ``input`` column says which.

    Unanswerable items (``n_excluded_unanswerable``) and items with fewer than two distinguishable
    candidates (``n_excluded_no_distractor``; ``n_candidates_dropped`` counts the distractors left
    out everywhere because their first token equals a kept candidate's) are not probed. Beside the
    probe: ``lens_logprob_final`` (mean gold first-token log-prob at the last layer),
    ``lens_top1`` (share of items whose gold first token is the model's top-1) and ``exact``.
    Groups where the probe cannot run get NaN and the reason in ``note``. Returns an empty frame
    (with the columns) when the records have no ``col``.
    """
    keys = list(keys)
    cols = [*keys, "ratio", *IDENTITY_COLUMNS, "n_excluded_unanswerable", "n_excluded_no_distractor",
            "n_candidates_dropped", "mean_candidates", "lens_logprob_final", "lens_top1", "exact", "input", "verdict",
            "note"]
    col = col or identity_input(df)
    if col is None or not has_columns(df, [col]):
        return pd.DataFrame(columns=cols)
    data = attach_baseline(df)
    data = data[data[col].notna()]
    rows = []
    for key, grp in data.groupby([*keys, "ratio"], sort=True):
        row: dict[str, object] = {**as_key([*keys, "ratio"], key), **dict.fromkeys(IDENTITY_COLUMNS, np.nan),
                                  "input": col, "note": ""}
        mats = [_candidate_matrix(v) for v in grp[col]]
        unans = (grp["unanswerable"].fillna(False).astype(bool).to_numpy() if "unanswerable" in grp
                 else np.zeros(len(grp), bool))
        usable = np.array([m is not None and m.shape[0] >= 2 for m in mats]) & ~unans
        row["n_excluded_unanswerable"] = int(unans.sum())
        row["n_excluded_no_distractor"] = int((~usable & ~unans).sum())
        row["n_candidates_dropped"] = (int(pd.to_numeric(grp["lens_candidates_dropped"], errors="coerce")
                                           .fillna(0).sum())
                                       if col == "lens_candidates" and "lens_candidates_dropped" in grp else 0)
        kept = [m for m, u in zip(mats, usable, strict=True) if u and m is not None]
        row["mean_candidates"] = float(np.mean([m.shape[0] for m in kept])) if kept else np.nan
        for name, src, fn in (("lens_logprob_final", "lens_gold_logprob_final", lambda s: s.mean()),
                              ("lens_top1", "lens_gold_rank_final", lambda s: (s == 0).mean()),
                              ("exact", "exact", lambda s: s.mean())):
            s = pd.to_numeric(grp[src], errors="coerce").dropna() if src in grp else pd.Series(dtype=float)
            row[name] = float(fn(s)) if len(s) else np.nan
        try:
            row.update(identity_probe(kept, grp["instance_id"].to_numpy()[usable], folds=folds, bins=bins,
                                      n_boot=n_boot, confidence=confidence,
                                      # folds seeded without the press: the baseline, shared by every
                                      # press, gets one reading, and presses at a ratio share their folds
                                      seed=int(group_seed(seed, tuple(v for k, v in zip([*keys, "ratio"], key,
                                                                                          strict=True)
                                                                      if k != "press")).integers(2**31))))
        except AnalysisError as e:
            row["note"] = str(e)
        row["verdict"] = identity_verdict(row)
        rows.append(row)
    return pd.DataFrame(rows, columns=cols)


def lens_profiles(df: pd.DataFrame, *, keys: Sequence[str] = PRESS_KEYS) -> pd.DataFrame:
    """Mean logit-lens log-prob of the gold's first token per layer, and the share ranking it top-1, per (group, ratio).

    One row per (group, ratio, layer) with ``layer`` 1 … L, ``logprob``, ``top1`` and ``n``.
    """
    keys = list(keys)
    cols = [*keys, "ratio", "layer", "logprob", "top1", "n"]
    if not has_columns(df, ["lens_gold_logprob"]):
        return pd.DataFrame(columns=cols)
    data = attach_baseline(df)
    data = data[data["lens_gold_logprob"].notna()]
    rows = []
    for key, grp in data.groupby([*keys, "ratio"], sort=True):
        lp = stack_vectors(grp["lens_gold_logprob"])
        rk = stack_vectors(grp["lens_gold_rank"]) if "lens_gold_rank" in grp else np.full_like(lp, np.nan)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            mean_lp, top1 = np.nanmean(lp, 0), np.nanmean(np.where(np.isnan(rk), np.nan, rk == 0), 0)
        for layer in range(lp.shape[1]):
            rows.append({**as_key([*keys, "ratio"], key), "layer": layer + 1, "logprob": float(mean_lp[layer]),
                         "top1": float(top1[layer]), "n": int(np.isfinite(lp[:, layer]).sum())})
    return pd.DataFrame(rows, columns=cols)
