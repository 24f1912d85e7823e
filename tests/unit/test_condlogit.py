"""The batched projected-Newton conditional logit reaches L-BFGS-B's optimum, bound active or not."""

from collections.abc import Callable

import numpy as np
import pytest
from scipy.optimize import minimize
from threadpoolctl import threadpool_limits

from kvroute.analysis.condlogit import fit_batch, gold_credit, pad
from kvroute.analysis.probe import fit_conditional_logit


def _problem(rng: np.random.Generator, n: int, K: int) -> list[np.ndarray]:
    """``n`` items of 2–5 candidates, the gold drawn from a conditional logit whose true weights may be negative."""
    w_true = rng.normal(0, 2, K)
    feats = []
    for _ in range(n):
        c = int(rng.integers(2, 6))
        x = rng.normal(0, rng.uniform(0.1, 5), (c, K))
        p = np.exp(x @ w_true - (x @ w_true).max())
        gold = rng.choice(c, p=p / p.sum())
        feats.append(np.vstack([x[gold], np.delete(x, gold, 0)]))
    return feats


def _scipy(feats: list[np.ndarray], l2: float, nonnegative: bool,
           **options: float) -> tuple[np.ndarray, Callable[[np.ndarray], float]]:
    """The standardised problem by L-BFGS-B (the solver this replaced): weights on the raw scale, and the objective
    of raw weights."""
    X, M = pad(feats)
    sd = X[M].std(0)
    sd = np.where(sd > 0, sd, 1.0)
    Z = X / sd

    def loss(w: np.ndarray) -> tuple[float, np.ndarray]:
        s = np.where(M, Z @ w, -np.inf)
        m = s.max(1, keepdims=True)
        e = np.exp(s - m)
        p = e / e.sum(1, keepdims=True)
        nll = float((m[:, 0] + np.log(e.sum(1)) - s[:, 0]).sum()) + 0.5 * l2 * float(w @ w)
        return nll, np.einsum("nc,nck->k", p, Z) - Z[:, 0].sum(0) + l2 * w

    bounds = [(0.0, None)] * Z.shape[2] if nonnegative else None
    with threadpool_limits(limits=1):  # a threaded BLAS makes L-BFGS-B several times slower on a busy machine
        res = minimize(loss, np.zeros(Z.shape[2]), jac=True, method="L-BFGS-B", bounds=bounds, options=options)
    return res.x / sd, lambda w_raw: loss(w_raw * sd)[0]


@pytest.mark.statistical
def test_projected_newton_reaches_the_lbfgsb_optimum_on_random_problems_with_and_without_active_bounds():
    rng = np.random.default_rng(0)
    n_active = 0
    for trial in range(120):
        feats = _problem(rng, n=int(rng.integers(5, 80)), K=int(rng.integers(1, 5)))
        l2, nonnegative = float(rng.choice([0.01, 0.1, 1.0, 10.0, 100.0])), trial % 4 != 0
        w = fit_conditional_logit(feats, l2=l2, nonnegative=nonnegative)
        # the reference optimum: L-BFGS-B run to its tightest tolerances
        w_ref, f = _scipy(feats, l2, nonnegative, ftol=1e-16, gtol=1e-13, maxiter=10_000, maxcor=20)
        assert f(w) == pytest.approx(f(w_ref), rel=1e-8)
        assert f(w) <= f(w_ref) * (1 + 1e-12)
        assert np.allclose(w, w_ref, rtol=1e-5, atol=1e-6)
        # and never worse than L-BFGS-B at its defaults (what the probe used before)
        w_default, _ = _scipy(feats, l2, nonnegative)
        assert f(w) <= f(w_default) * (1 + 1e-12)
        if nonnegative:
            assert (w >= 0).all()
            n_active += int((w == 0).any())
            assert (w_ref[w == 0] <= 1e-6).all()  # the same weights held at the bound
    assert n_active >= 30  # the bound was active in many of the problems


def test_a_batch_of_masked_problems_equals_fitting_each_subset_alone():
    rng = np.random.default_rng(1)
    feats = _problem(rng, n=40, K=4)
    X, M = pad(feats)
    A = rng.random((6, 40)) < 0.7
    l2 = [10.0, 1.0, 0.1, 10.0, 1.0, 0.1]
    W = fit_batch(X, M, A, l2)
    for b in range(6):
        alone = fit_conditional_logit([feats[j] for j in np.flatnonzero(A[b])], l2=l2[b])
        assert np.allclose(W[b], alone, rtol=1e-9, atol=1e-12)


def test_gold_credit_splits_ties_and_ignores_padding():
    S = np.array([[1.0, 0.0, 0.5], [0.0, 1.0, 9.0], [1.0, 1.0 + 1e-12, 0.0], [2.0, 2.0, 2.0]])
    M = np.array([[True, True, True], [True, True, False], [True, True, True], [True, True, True]])
    assert gold_credit(S, M).tolist() == [1.0, 0.0, 0.5, pytest.approx(1 / 3)]
    assert gold_credit(np.stack([S, -S]), M).shape == (2, 4)
