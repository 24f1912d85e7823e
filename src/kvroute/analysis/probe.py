"""Representation degradation: a cross-validated linear probe for the answer-type tag (also exported as kvroute.metrics.probe).

The probe is a standardised logistic regression on the last-prompt-token hidden-state features
(``probe_features`` in the records), scored by macro-F1 under stratified k-fold cross-validation.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import numpy as np
import pandas as pd

from kvroute.analysis.common import PRESS_KEYS, AnalysisError, as_key, attach_baseline, has_columns, stack_vectors


def linear_probe_macro_f1(X: np.ndarray, y: Sequence[object] | np.ndarray, *, folds: int = 5,
                          seed: int = 0) -> tuple[float, float]:
    """Mean and standard deviation over folds of the macro-F1 of a logistic-regression probe.

    ``X`` is ``[n, d]``; ``y`` holds n class labels. Raises :class:`AnalysisError` when there are
    fewer than 2 classes or some class has fewer members than ``folds``.
    """
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import f1_score
    from sklearn.model_selection import StratifiedKFold
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler
    from threadpoolctl import threadpool_limits

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
    with threadpool_limits(limits=1), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # convergence chatter on tiny folds
        for train, test in cv.split(X, y):
            clf = make_pipeline(StandardScaler(), LogisticRegression(max_iter=2000))
            clf.fit(X[train], y[train])
            scores.append(f1_score(y[test], clf.predict(X[test]), average="macro", labels=classes, zero_division=0))
    return float(np.mean(scores)), float(np.std(scores))


def probe_by_ratio(df: pd.DataFrame, feature_col: str = "probe_features", label_col: str = "answer_type", *,
                   keys: Sequence[str] = PRESS_KEYS, folds: int = 5, seed: int = 0) -> pd.DataFrame:
    """The probe per (group, ratio), next to accuracy (mean ``exact``) when records carry it.

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
            row["note"] = "left out classes rarer than the fold count: " + ", ".join(f"{c} ({n})" for c, n in rare.items())
            g, labels = g[~labels.isin(rare.index)], labels[~labels.isin(rare.index)]
        row["n_classes"] = int(labels.nunique())
        X = stack_vectors(g[feature_col])
        try:
            row["macro_f1"], row["macro_f1_std"] = linear_probe_macro_f1(X, labels.to_numpy(), folds=folds, seed=seed)
        except AnalysisError as e:
            row["note"] = str(e)
        rows.append(row)
    return pd.DataFrame(rows, columns=cols)
