"""An exact upper bound on the paired excess H(α) − H(0): the safe ratio's certification test.

The safe ratio asks, for each compressed ratio α, whether the hallucination rate there exceeds the
uncompressed one by at most δ, with 95% confidence. Both rates are read on the *same* instances,
so the question is one about paired binary outcomes: per instance, ``d = h(α) − h(0) ∈ {−1, 0, +1}``.
With ``b`` instances that turn to hallucination (+1) and ``c`` that turn back (−1), the excess is
``Δ = p₊ − p₋`` and its estimate ``(b − c) / n``.

**The test.** ``H₀: Δ ≥ δ`` against ``Δ < δ``, rejected when the *exact* p-value

    p(δ) = sup over p₋ ∈ [0, (1 − δ)/2] of  P(B − C ≤ b − c | p₊ = p₋ + δ, p₋)

is at most ``1 − confidence``; ``(B, C)`` is trinomial with ``n`` trials. The supremum over the
nuisance share of discordant pairs makes the size at most ``1 − confidence`` whatever the churn
(an unconditional exact test in the manner of Suissa & Shuster, one-sided with a margin, its
outcomes ordered by Tango's score statistic — :func:`score_statistic`). A percentile
bootstrap of ``(b − c)/n`` is anti-conservative at the margin: with true excess exactly δ at every
ratio it certifies a positive safe ratio far more often than 5% of the time (the mutation test in
tests/unit/test_analysis_excess.py measures it). The supremum is taken on a grid of
:data:`NUISANCE_POINTS` values of p₋ (the p-value is smooth in p₋, so the grid's maximum is within
rounding of the true one; the planted test checks the size).

**The bound.** ``excess_upper`` is the smallest margin the test still rejects — the exact one-sided
upper confidence bound of Δ — found by bisection to :data:`BOUND_TOL`; it is what the curve table
prints. The decision at δ is the test at δ itself, not a comparison with the bisected bound.

**Instances with several cells per ratio** (seeds, families pooled over one instance) have a
fractional ``d``; the exact trinomial does not apply and Hoeffding's bound for a mean of values in
[−1, 1] is used instead (valid, conservative); ``rule`` says which was used.

The safe ratio is the largest α whose test rejects at it *and at every smaller ratio*: an
intersection–union test, so its size is that of one test. It certifies; it does not rank presses
(see :mod:`kvroute.analysis.paired` for that).
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
from scipy.special import gammaln, xlogy

from kvroute.analysis.common import AnalysisError

#: grid of the nuisance share p₋ over which the exact p-value is maximised
NUISANCE_POINTS = 201
#: precision of the bisected upper bound
BOUND_TOL = 1e-3
EXACT_RULE = "exact unconditional test on the discordant pairs (trinomial, supremum over the nuisance share)"
HOEFFDING_RULE = "Hoeffding bound on the mean paired difference (instances with several cells per ratio)"


@lru_cache(maxsize=32)
def _trinomial(n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(b, c, log multinomial coefficient)`` over every ``b + c ≤ n``, flattened ``[P]``."""
    b, c = np.meshgrid(np.arange(n + 1), np.arange(n + 1), indexing="ij")
    ok = b + c <= n
    b, c = b[ok], c[ok]
    return b, c, gammaln(n + 1) - gammaln(b + 1) - gammaln(c + 1) - gammaln(n - b - c + 1)


def score_statistic(n: int, b: np.ndarray, c: np.ndarray, margin: float) -> np.ndarray:
    """Tango's score statistic of ``H₀: p₊ − p₋ = margin`` for ``b`` (+1) and ``c`` (−1) of ``n`` pairs.

    ``Z = (b − c − n·margin) / sqrt(n (p̃₊ + p̃₋ − margin²))`` with ``p̃`` the maximum-likelihood
    shares under the restriction (the root of ``2n p̃₋² + B p̃₋ + C = 0``, ``B = −(b + c) +
    margin (2n − b + c)``, ``C = −c · margin (1 − margin)``). It orders the outcomes of the exact
    test: unlike ``b − c`` alone it knows that few discordant pairs make a large excess unlikely.
    A negative margin is the mirror image (``Z(b, c, m) = −Z(c, b, −m)``).
    """
    b, c = np.asarray(b, float), np.asarray(c, float)
    if margin < 0:
        return -score_statistic(n, c, b, -margin)
    B = -(b + c) + margin * (2 * n - b + c)
    C = -c * margin * (1 - margin)
    pm = (-B + np.sqrt(np.maximum(B * B - 8 * n * C, 0.0))) / (4 * n)  # restricted p̃₋
    var = n * np.maximum(2 * pm + margin - margin * margin, 0.0)
    num = b - c - n * margin
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(var > 0, num / np.sqrt(np.where(var > 0, var, 1.0)), np.sign(num) * np.inf)


@lru_cache(maxsize=512)
def _null_tail(n: int, margin: float, points: int) -> tuple[np.ndarray, np.ndarray]:
    """``(z, p)``: every outcome's score statistic, sorted ``[P]``, and the exact p-value of observing it —
    the largest probability, over the nuisance grid, of a statistic at most that one."""
    bb, cc, logc = _trinomial(n)
    z = score_statistic(n, bb, cc, margin)
    order = np.argsort(z, kind="stable")
    z, bb, cc, logc = z[order], bb[order], cc[order], logc[order]
    hi = (1 - margin) / 2  # p₋ ≤ hi keeps p₊ = p₋ + margin ≤ 1 − p₋
    lo = max(0.0, -margin)  # p₊ ≥ 0
    pm = np.linspace(lo, hi, points)[:, None]  # [G, 1]
    pp = pm + margin
    p0 = np.clip(1 - pp - pm, 0.0, 1.0)
    pmf = np.exp(logc + xlogy(bb, pp) + xlogy(cc, pm) + xlogy(n - bb - cc, p0))  # [G, P]
    tail = np.cumsum(pmf, axis=1).max(0)  # [P] sup over p₋ of P(Z ≤ z_k)
    return z, np.minimum(tail, 1.0)


def exact_p_value(n: int, b: int, c: int, margin: float, *, points: int = NUISANCE_POINTS) -> float:
    """One-sided exact p-value of ``H₀: p₊ − p₋ ≥ margin`` given ``b`` (+1) and ``c`` (−1) of ``n`` pairs.

    Outcomes are ordered by :func:`score_statistic`; the p-value is the largest probability, over
    the nuisance share p₋ on the boundary ``p₊ = p₋ + margin``, of a statistic at most the observed one.
    """
    if n < 1:
        raise AnalysisError("the exact excess test needs at least one instance")
    if margin <= -1:
        return 1.0
    if margin >= 1:
        return 0.0 if b < n else 1.0
    z, tail = _null_tail(n, float(margin), points)
    z_obs = float(score_statistic(n, np.array([b]), np.array([c]), margin)[0])
    k = int(np.searchsorted(z, z_obs + 1e-9 * max(1.0, abs(z_obs)) if np.isfinite(z_obs) else z_obs, side="right"))
    return float(tail[k - 1]) if k > 0 else 0.0


@lru_cache(maxsize=4096)
def exact_upper_bound(n: int, b: int, c: int, confidence: float = 0.95, *, tol: float = BOUND_TOL) -> float:
    """The exact one-sided ``confidence`` upper bound of ``p₊ − p₋`` (the smallest margin still rejected)."""
    alpha = 1 - confidence
    lo, hi = (b - c) / n, 1.0  # the estimate itself is never rejected as a margin
    if exact_p_value(n, b, c, hi) > alpha:
        return 1.0
    while hi - lo > tol:
        mid = (lo + hi) / 2
        if exact_p_value(n, b, c, mid) <= alpha:
            hi = mid
        else:
            lo = mid
    return hi


def paired_excess(h_ratio: np.ndarray, h_base: np.ndarray, delta: float, confidence: float = 0.95, *,
                  bound: bool = True) -> tuple[bool, float, str]:
    """Is H(α) − H(0) ≤ ``delta`` shown at ``confidence``? ``(shown, upper bound, rule)``.

    ``h_ratio`` and ``h_base`` are ``[n]`` per-instance hallucination rates (0/1 when each
    instance has one cell per ratio) of the instances present at both; NaN pairs are dropped.
    ``bound=False`` skips the bisected bound (NaN), for simulations that need the decision only.
    """
    h1, h0 = np.asarray(h_ratio, float), np.asarray(h_base, float)
    ok = np.isfinite(h1) & np.isfinite(h0)
    d = h1[ok] - h0[ok]
    n = len(d)
    if n == 0:
        return False, float("nan"), "no instance with cells at both ratios"
    if np.all((d == 0) | (np.abs(d) == 1)):
        b, c = int((d > 0).sum()), int((d < 0).sum())
        shown = exact_p_value(n, b, c, delta) <= 1 - confidence
        return shown, exact_upper_bound(n, b, c, confidence) if bound else float("nan"), EXACT_RULE
    upper = float(d.mean() + 2 * np.sqrt(np.log(1 / (1 - confidence)) / (2 * n)))  # range 2
    return upper <= delta, min(upper, 1.0), HOEFFDING_RULE
