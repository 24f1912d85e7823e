"""The eviction link within instance: a conditional logit over each instance's cells, with ratio effects.

Instances differ in difficulty, and attention scorers evict what a model ignores, so hard
instances carry more eviction *and* fail more, at every ratio. A fit that compares different
instances at one ratio reads that as "eviction raises H" when nothing causal is there (planted
confounded null, :mod:`kvroute.analysis.planted.ger_link`). This model compares an instance only
with itself::

    logit P(H_ij = 1) = u_i + γ_ratio(j) + β · GER_ij

``u_i`` (the instance's difficulty, any value, correlated with its GER or not) is conditioned away:
the likelihood of instance i is that of *which* of its cells hallucinated given *how many* did,
``exp(Σ_{j∈obs} η_j) / Σ_{|S|=k_i} exp(Σ_{j∈S} η_j)`` with ``η = γ + β·GER`` — computed exactly
by enumerating the subsets (an instance has at most a dozen compressed cells per press). ``γ``
absorbs what α does to every instance alike, so β is read from how an instance's GER departs from
its own level and from the common trend across ratios. Instances whose cells all hallucinate or
none do carry no information and drop out (counted).

The fit is Newton–Raphson with a light ridge (``ridge/2 · (β² + Σγ²)``) that keeps separated data
finite; each bootstrap replicate (instances resampled with replacement — the cluster is the
instance) is a weighted fit, and **separation is checked in every replicate**: a replicate whose
slope moves by more than 5% (+0.05) when refitted with a 100× lighter ridge is *separated*, its
slope set only by the ridge. Where the separated replicates reach a percentile of the interval,
that end is open (±∞), never the ridge's number.
"""

from __future__ import annotations

from functools import lru_cache
from itertools import combinations

import numpy as np

#: ridge on every coefficient (a N(0, 1/ridge) prior); light, only against separation
RIDGE = 1e-3
#: the largest number of cells one instance may have (subsets are enumerated: 2^12 = 4,096)
MAX_CELLS = 12


@lru_cache(maxsize=256)
def _subsets(m: int, k: int) -> np.ndarray:
    """Every k-subset of m cells as 0/1 rows ``[C(m, k), m]``."""
    out = np.zeros((0, m))
    rows = [np.isin(np.arange(m), c).astype(float) for c in combinations(range(m), k)]
    return np.stack(rows) if rows else out


def design(ger: np.ndarray, ratio_codes: np.ndarray, n_ratios: int) -> np.ndarray:
    """Per-cell features ``[n, 1 + n_ratios − 1]``: GER, then one-hot ratio effects (the first ratio the reference)."""
    X = np.zeros((len(ger), n_ratios))
    X[:, 0] = ger
    rest = ratio_codes > 0
    X[np.flatnonzero(rest), ratio_codes[rest]] = 1.0
    return X


class InstanceSets:
    """The informative instances of one fit, grouped by (cells, hallucinated) so that each group is one tensor.

    ``groups`` holds ``(instance indices [G], observed features [G, p], subset features [G, S, p])``;
    subset features are the sums of the cell features over each k-subset.
    """

    def __init__(self, X: np.ndarray, y: np.ndarray, inst: np.ndarray) -> None:
        self.p = X.shape[1]
        by: dict[tuple[int, int], list[tuple[int, np.ndarray, np.ndarray]]] = {}
        for i in np.unique(inst):
            rows = np.flatnonzero(inst == i)
            k, m = int(y[rows].sum()), len(rows)
            if k == 0 or k == m:
                continue
            if m > MAX_CELLS:
                raise ValueError(f"instance {i} has {m} cells; the exact conditional likelihood enumerates at most "
                                 f"{MAX_CELLS}")
            Xi = X[rows]  # [m, p]
            by.setdefault((m, k), []).append((int(i), y[rows] @ Xi, _subsets(m, k) @ Xi))
        self.groups = [(np.array([g[0] for g in v]), np.stack([g[1] for g in v]), np.stack([g[2] for g in v]))
                       for v in by.values()]
        self.informative = np.array(sorted(i for idx, _, _ in self.groups for i in idx), int)


def fit_conditional(sets: InstanceSets, weights: np.ndarray, *, ridge: float = RIDGE, max_iter: int = 60,
                    tol: float = 1e-8) -> np.ndarray:
    """Coefficients ``[B, p]`` (β first) of B weighted conditional-logit fits; ``weights`` ``[B, n_instances]``."""
    w = np.atleast_2d(np.asarray(weights, float))
    B, p = w.shape[0], sets.p
    theta = np.zeros((B, p))
    eye = np.eye(p)
    for _ in range(max_iter):
        g = -ridge * theta
        H = np.broadcast_to(-ridge * eye, (B, p, p)).copy()
        for idx, obs, F in sets.groups:
            wi = w[:, idx]  # [B, G]
            s = np.einsum("gsp,bp->bgs", F, theta)  # [B, G, S]
            s -= s.max(-1, keepdims=True)
            pr = np.exp(s)
            pr /= pr.sum(-1, keepdims=True)
            mean = np.einsum("bgs,gsp->bgp", pr, F)  # [B, G, p]
            g += np.einsum("bg,bgp->bp", wi, obs[None] - mean)
            second = np.swapaxes(pr[..., None] * F[None], -1, -2) @ F[None]  # [B, G, p, p] Σ_s pr F Fᵀ
            H -= np.einsum("bg,bgpq->bpq", wi, second - mean[..., :, None] * mean[..., None, :])
        step = -np.linalg.solve(H, g[..., None])[..., 0]  # [B, p]
        step = np.clip(step, -5, 5)
        theta = theta + step
        if np.abs(step).max() < tol:
            break
    return theta


def within_instance_slopes(ger: np.ndarray, y: np.ndarray, ratio: np.ndarray, inst: np.ndarray,
                           weights: np.ndarray, *, ridge: float = RIDGE) -> tuple[np.ndarray, np.ndarray, InstanceSets]:
    """β for the point fit (the first row of ``weights``, usually ones) and for each bootstrap row, with each
    row's separation flag: ``(slopes [B], separated [B], sets)``. ``inst`` are codes 0..I−1 into weights' columns."""
    _, r = np.unique(ratio, return_inverse=True)
    X = design(np.asarray(ger, float), r, int(r.max()) + 1 if len(r) else 1)
    sets = InstanceSets(X, np.asarray(y, float), np.asarray(inst))
    w = np.atleast_2d(np.asarray(weights, float))
    if not sets.groups:
        return np.full(len(w), np.nan), np.zeros(len(w), bool), sets
    live = w[:, sets.informative].sum(1) > 0
    b = fit_conditional(sets, w, ridge=ridge)[:, 0]
    lighter = fit_conditional(sets, w, ridge=ridge / 100)[:, 0]
    separated = np.abs(lighter - b) > 0.05 * np.abs(b) + 0.05
    return np.where(live, b, np.nan), separated & live, sets
