"""Fitting the hallucination cliff: H(α) = lo + (hi − lo) / (1 + exp(−k (α − α*))).

Two fitters share one model:

* :func:`fit_sigmoid` — the point estimate: a profile grid search gives the starting point,
  then ``scipy.optimize.curve_fit`` refines it inside bounds. When curve_fit fails the grid
  optimum is kept (status ``ok_grid``); when the data show no cliff, or the midpoint sits at the
  edge of the ratio grid, the fit reports that instead of a number.
* :class:`SigmoidGrid` — the same least-squares fit for thousands of bootstrap replicates at
  once. For fixed (α*, k) the model is linear in (lo, hi − lo), so the residual sum of squares
  is ``‖y − ȳ‖² − (q·y)²`` with ``q`` the centred, normalised sigmoid shape; one matrix
  product scores every (α*, k) pair for every replicate. α* is resolved to ``mid_step``.

``α*`` is constrained to the tested ratio range [min α, max α]: outside it the midpoint is not
identified by the data, and a fit that lands on the edge is reported as ``beyond_grid``.
"""

from __future__ import annotations

import functools
import warnings
from dataclasses import dataclass

import numpy as np

#: a cliff must raise H by at least this much over the grid, or the fit reports ``no_cliff``
MIN_AMPLITUDE = 0.1
K_RANGE = (3.0, 500.0)  # steepness, per unit of ratio
MID_STEP = 0.0025


def sigmoid(x: np.ndarray, lo: float | np.ndarray, amp: float | np.ndarray, k: float | np.ndarray,
            mid: float | np.ndarray) -> np.ndarray:
    """``lo + amp / (1 + exp(−k (x − mid)))`` (``amp = hi − lo``), overflow-safe."""
    z = np.clip(-k * (np.asarray(x, float) - mid), -500, 500)
    return lo + amp / (1.0 + np.exp(z))


@dataclass(frozen=True)
class SigmoidFit:
    """One fitted cliff. ``alpha_star`` is None unless ``status`` starts with ``ok``."""

    status: str  # ok | ok_grid | no_cliff | beyond_grid | below_grid | too_few_ratios
    reason: str
    alpha_star: float | None = None
    lo: float | None = None
    hi: float | None = None
    k: float | None = None
    rmse: float | None = None

    @property
    def ok(self) -> bool:
        return self.status.startswith("ok")


class SigmoidGrid:
    """Least-squares sigmoid fits on a fixed (α*, k) grid for many curves over the same ratios ``x``."""

    def __init__(self, x: np.ndarray, *, mid_step: float = MID_STEP, n_k: int = 40) -> None:
        self.x = np.asarray(x, float)  # [n]
        lo, hi = float(self.x.min()), float(self.x.max())
        n_mid = max(2, int(round((hi - lo) / mid_step)) + 1)
        mids = np.linspace(lo, hi, n_mid)
        ks = np.geomspace(*K_RANGE, n_k)
        self.mids = np.repeat(mids, n_k)  # [m]   m = n_mid * n_k
        self.ks = np.tile(ks, n_mid)  # [m]
        s = sigmoid(self.x[None, :], 0.0, 1.0, self.ks[:, None], self.mids[:, None])  # [m, n]
        self.s_mean = s.mean(axis=1)  # [m]
        sc = s - self.s_mean[:, None]  # [m, n] centred shapes
        self.norm = np.linalg.norm(sc, axis=1)  # [m]
        self.norm[self.norm == 0] = np.inf
        self.q = sc / self.norm[:, None]  # [m, n] unit vectors

    def best(self, y: np.ndarray, chunk: int = 256) -> dict[str, np.ndarray]:
        """Best increasing fit for each row of ``y`` ``[B, n]``: arrays ``mid, k, lo, hi, sse`` of length B.

        Rows with NaN get NaN everywhere.
        """
        y = np.atleast_2d(np.asarray(y, float))  # [B, n]
        out = {k: np.full(len(y), np.nan) for k in ("mid", "k", "lo", "hi", "sse")}
        finite = np.isfinite(y).all(axis=1)
        idx = np.flatnonzero(finite)
        for start in range(0, len(idx), chunk):
            rows = idx[start:start + chunk]
            yy = y[rows]  # [b, n]
            proj = yy @ self.q.T  # [b, m]; positive = increasing fit
            j = proj.argmax(axis=1)  # [b]
            p = proj[np.arange(len(rows)), j]
            amp = np.maximum(p, 0.0) / self.norm[j]
            ybar = yy.mean(axis=1)
            lo = ybar - amp * self.s_mean[j]
            yc = yy - ybar[:, None]
            out["mid"][rows] = self.mids[j]
            out["k"][rows] = self.ks[j]
            out["lo"][rows] = lo
            out["hi"][rows] = lo + amp
            out["sse"][rows] = (yc * yc).sum(axis=1) - np.maximum(p, 0.0) ** 2
        return out


@functools.lru_cache(maxsize=32)
def grid_for(x: tuple[float, ...]) -> SigmoidGrid:
    """A cached :class:`SigmoidGrid` for one ratio grid."""
    return SigmoidGrid(np.array(x))


def has_cliff(y: np.ndarray, min_amplitude: float = MIN_AMPLITUDE) -> np.ndarray:
    """Whether each curve in ``y`` ``[..., n]`` rises by at least ``min_amplitude`` (max − min, later max)."""
    y = np.asarray(y, float)
    rise = np.nanmax(y, axis=-1) - np.nanmin(y, axis=-1)
    # the maximum must come after the minimum: a falling curve is not a cliff
    order = np.nanargmax(np.where(np.isnan(y), -np.inf, y), axis=-1) > np.nanargmin(np.where(np.isnan(y), np.inf, y), axis=-1)
    return (rise >= min_amplitude) & order


def fit_sigmoid(x: np.ndarray, y: np.ndarray, *, min_amplitude: float = MIN_AMPLITUDE) -> SigmoidFit:
    """Fit the cliff sigmoid to points ``(x, y)`` (NaN points dropped); see the module docstring."""
    from scipy.optimize import curve_fit

    x, y = np.asarray(x, float), np.asarray(y, float)
    keep = np.isfinite(x) & np.isfinite(y)
    x, y = x[keep], y[keep]
    order = np.argsort(x)
    x, y = x[order], y[order]
    if len(np.unique(x)) < 4:
        return SigmoidFit("too_few_ratios", f"a 4-parameter sigmoid needs at least 4 ratios, got {len(np.unique(x))}")
    if not has_cliff(y, min_amplitude):
        return SigmoidFit("no_cliff", f"H rises by less than {min_amplitude:g} over the ratios tested "
                                      f"({np.nanmin(y):.3f} to {np.nanmax(y):.3f})")
    g = grid_for(tuple(x.tolist())).best(y[None, :])
    p0 = [g["lo"][0], g["hi"][0] - g["lo"][0], g["k"][0], g["mid"][0]]
    params, status, reason = p0, "ok_grid", "curve_fit did not converge; grid optimum kept"
    bounds = ([-0.05, 0.0, K_RANGE[0], x[0]], [1.05, 1.05, 2 * K_RANGE[1], x[-1]])
    p0 = np.clip(p0, np.array(bounds[0]) + 1e-9, np.array(bounds[1]) - 1e-9)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # OptimizeWarning about the covariance is irrelevant here
            popt, _ = curve_fit(sigmoid, x, y, p0=p0, bounds=bounds, maxfev=5000)
        if np.sum((sigmoid(x, *popt) - y) ** 2) <= g["sse"][0] + 1e-12:
            params, status, reason = list(popt), "ok", "least-squares sigmoid fit"
        else:
            reason = "curve_fit ended worse than the grid optimum; grid optimum kept"
    except (RuntimeError, ValueError) as e:
        reason = f"curve_fit failed ({e}); grid optimum kept"
    lo, amp, k, mid = (float(p) for p in params)
    rmse = float(np.sqrt(np.mean((sigmoid(x, lo, amp, k, mid) - y) ** 2)))
    half = lo + 0.5 * amp  # the fitted curve's height at α*
    if mid >= x[-1] - 1e-6 or y[-1] < half:
        return SigmoidFit("beyond_grid", f"H has not risen halfway by the largest ratio: α* ≥ {x[-1]:g} is not identified",
                          lo=lo, hi=lo + amp, k=k, rmse=rmse)
    if mid <= x[0] + 1e-6 or y[0] > half:
        return SigmoidFit("below_grid", f"H is past halfway at the smallest ratio: α* ≤ {x[0]:g} is not identified",
                          lo=lo, hi=lo + amp, k=k, rmse=rmse)
    return SigmoidFit(status, reason, alpha_star=mid, lo=lo, hi=lo + amp, k=k, rmse=rmse)
