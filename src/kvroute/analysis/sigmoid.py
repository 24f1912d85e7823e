"""Fitting the hallucination cliff: H(α) = lo + (hi − lo) / (1 + exp(−k (α − α*))), 0 ≤ lo ≤ hi ≤ 1.

H is a rate, so both fitters keep the curve inside [0, 1]: ``0 ≤ lo ≤ hi ≤ 1`` (a top above 1 would
let a curve that is already at its maximum be read as "still rising", i.e. ``beyond_grid``).

* :func:`fit_sigmoid` — the point estimate: a profile grid search gives the starting point,
  then ``scipy.optimize.curve_fit`` refines it inside bounds, parametrised as
  ``(lo, f, k, α*)`` with ``hi = lo + f (1 − lo)`` and ``lo, f ∈ [0, 1]`` so that the triangle
  ``0 ≤ lo ≤ hi ≤ 1`` becomes a box. When curve_fit fails the grid optimum is kept (status
  ``ok_grid``).
* :class:`SigmoidGrid` — the same constrained least-squares fit for thousands of bootstrap
  replicates at once. For fixed (α*, k) the model is linear in (lo, amp = hi − lo); the
  unconstrained optimum is read off one matrix product (``‖y − ȳ‖² − (q·y)²`` with ``q`` the
  centred, normalised sigmoid shape). Where it leaves the triangle ``lo ≥ 0, amp ≥ 0,
  lo + amp ≤ 1`` the optimum lies on the edge ``lo = 0`` or ``hi = 1`` (both solved in closed
  form; the third edge ``amp = 0`` is a flat line, not a cliff). α* is resolved to ``mid_step``.
  Midpoints that fit equally well (a step between two tested ratios fits anywhere in the gap) are
  a tie: the point estimate takes the centre of the tied range and a bootstrap replicate a uniform
  draw from it, so an interval spans what the data cannot tell apart instead of piling on the
  gap's lower end.

One rule decides, for the point estimate *and for every bootstrap replicate*, whether α* is
identified (:func:`edge_codes`): ``no_cliff`` when H rises by less than ``min_amplitude`` (or
falls); ``beyond_grid`` when the midpoint lies in the grid's last gap (past the second-largest
ratio) with a fitted top below 1, or H at the largest ratio is still below the fitted halfway
level; ``below_grid`` when it lies in the first gap with a floor above 0, or H at the smallest
ratio is already above halfway. α* is constrained to [min α, max α]: outside it the midpoint
is not identified by the data.
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

#: integer codes of :func:`edge_codes`, indexing :data:`STATUS_NAMES`
OK, NO_CLIFF, BELOW_GRID, BEYOND_GRID, NO_DATA = range(5)
STATUS_NAMES = ("ok", "no_cliff", "below_grid", "beyond_grid", "no_data")
_TIE_ABS, _TIE_REL = 1e-9, 1e-7  # SSE differences below this are ties


def sigmoid(x: np.ndarray, lo: float | np.ndarray, amp: float | np.ndarray, k: float | np.ndarray,
            mid: float | np.ndarray) -> np.ndarray:
    """``lo + amp / (1 + exp(−k (x − mid)))`` (``amp = hi − lo``), overflow-safe."""
    z = np.clip(-k * (np.asarray(x, float) - mid), -500, 500)
    return lo + amp / (1.0 + np.exp(z))


def _sigmoid_frac(x: np.ndarray, lo: float, frac: float, k: float, mid: float) -> np.ndarray:
    """The sigmoid with ``hi = lo + frac (1 − lo)``: ``lo, frac ∈ [0, 1]`` is exactly ``0 ≤ lo ≤ hi ≤ 1``."""
    return sigmoid(x, lo, frac * (1.0 - lo), k, mid)


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
    """Bounded least-squares sigmoid fits on a fixed (α*, k) grid for many curves over the same ratios ``x``."""

    def __init__(self, x: np.ndarray, *, mid_step: float = MID_STEP, n_k: int = 40) -> None:
        self.x = np.asarray(x, float)  # [n]
        self.mid_step = float(mid_step)
        lo, hi = float(self.x.min()), float(self.x.max())
        n_mid = max(2, int(round((hi - lo) / mid_step)) + 1)
        mids = np.linspace(lo, hi, n_mid)
        ks = np.geomspace(*K_RANGE, n_k)
        self.mids = np.repeat(mids, n_k)  # [m]   m = n_mid * n_k
        self.ks = np.tile(ks, n_mid)  # [m]
        s = sigmoid(self.x[None, :], 0.0, 1.0, self.ks[:, None], self.mids[:, None])  # [m, n]
        n = len(self.x)
        self.s_mean = s.mean(axis=1)  # [m]
        sc = s - self.s_mean[:, None]  # [m, n] centred shapes
        norm = np.linalg.norm(sc, axis=1)  # [m]
        self.norm_f = norm.copy()  # finite copy, for s·y = (q·y)‖sc‖ + s̄ Σy
        self.norm_c = self.norm_f.clip(1e-300)  # the divisor of the fitted amplitude (q·y) / ‖sc‖
        norm[norm == 0] = np.inf
        self.norm = norm
        self.q = sc / self.norm[:, None]  # [m, n] unit vectors
        self.s1 = s.sum(axis=1)  # Σ s        [m]
        self.s2 = (s * s).sum(axis=1)  # Σ s²   [m]
        self.t2 = n - 2 * self.s1 + self.s2  # Σ (1 − s)²  [m]

    def best(self, y: np.ndarray, chunk: int = 128, rng: np.random.Generator | None = None) -> dict[str, np.ndarray]:
        """Best increasing fit with ``0 ≤ lo ≤ hi ≤ 1`` for each row of ``y`` ``[B, n]``.

        Returns arrays ``mid, k, lo, hi, sse, mid_low, mid_high`` of length B (``mid_low``/``mid_high``
        bound the midpoints tied with the best). ``mid`` is the centre of the tied range, or a
        uniform draw from it when ``rng`` is given. Rows with NaN get NaN everywhere.

        Per row, only the shapes that can be the best or tie with it are fitted in the triangle: a shape's constrained
        SSE is at least its unconstrained one, and any point of the triangle bounds the best from above (the fit of
        the shape most aligned with the row, inside the triangle where it is feasible, else on its better edge), so
        a shape whose unconstrained SSE passes that bound (with the tie tolerance, twice) can be neither. Rows are
        taken ``chunk`` at a time; a row's numbers depend on the chunking only through the matrix product's rounding,
        and ``rng`` draws one number per row in row order.
        """
        y = np.atleast_2d(np.asarray(y, float))  # [B, n]
        out = {k: np.full(len(y), np.nan) for k in ("mid", "k", "lo", "hi", "sse", "mid_low", "mid_high")}
        idx = np.flatnonzero(np.isfinite(y).all(axis=1))
        for start in range(0, len(idx), chunk):
            rows = idx[start:start + chunk]
            b = np.arange(len(rows))
            yy = y[rows]  # [b, n]
            ybar = yy.mean(axis=1)  # [b]
            ss_c = ((yy - ybar[:, None]) ** 2).sum(axis=1)  # ‖y − ȳ‖²  [b]
            p = yy @ self.q.T  # [b, m]
            free = ss_c[:, None] - p * p  # the unconstrained SSE of every shape  [b, m]
            # the shape most aligned with the row: where its unconstrained fit is feasible, that fit's SSE bounds the
            # best from above; where not, the better of its two edges does (a point of the triangle)
            j_u = p.argmax(axis=1)
            _, _, feas_u = self._interior(p[b, j_u], ybar, j_u)
            need = ~feas_u  # [b]: the rows whose best may lie on an edge
            bound = free[b, j_u].copy()
            if need.any():
                r = np.flatnonzero(need)
                bound[r] = self._edges(yy[r], p[r, j_u[r]], j_u[r])[0]
            reach = bound + 2 * (_TIE_ABS + _TIE_REL * np.abs(bound))
            rr, mi = np.nonzero(free <= reach[:, None])  # the shapes each row fits, in row order, shapes ascending
            amp, lo, feas = self._interior(p[rr, mi], ybar[rr], mi)
            sse = np.where(feas, free[rr, mi], np.inf)
            starts = np.searchsorted(rr, b)
            if np.bincount(rr, minlength=len(rows)).min() == 0:  # (the reductions below read a row from its start)
                raise AssertionError("a row lost the shape of its bound to the bound")
            # the edges lo = 0 and hi = 1, on the shapes of the rows that need them whose unconstrained SSE beats the
            # row's best feasible one (a shape feasible inside the triangle has its optimum there)
            row_feas = np.minimum.reduceat(sse, starts)
            e = np.flatnonzero(need[rr] & (free[rr, mi] < row_feas[rr]))
            if e.size:
                sse_e, lo_e, amp_e = self._edges(yy[rr[e]], p[rr[e], mi[e]], mi[e])
                better = sse_e < sse[e]
                eb = e[better]
                sse[eb], lo[eb], amp[eb] = sse_e[better], lo_e[better], amp_e[better]
            smin = np.minimum.reduceat(sse, starts)  # [b]
            at_min = np.flatnonzero(sse == smin[rr])
            j = at_min[np.searchsorted(rr[at_min], b)]  # each row's first shape at its minimum (argmin's choice)
            tied = sse <= (smin + _TIE_ABS + _TIE_REL * np.abs(smin))[rr]
            m_lo = np.minimum.reduceat(np.where(tied, self.mids[mi], np.inf), starts)
            m_hi = np.maximum.reduceat(np.where(tied, self.mids[mi], -np.inf), starts)
            mid = 0.5 * (m_lo + m_hi) if rng is None else rng.uniform(m_lo, m_hi)
            out["mid"][rows] = mid
            out["mid_low"][rows], out["mid_high"][rows] = m_lo, m_hi
            out["k"][rows] = self.ks[mi[j]]
            out["lo"][rows] = lo[j]
            out["hi"][rows] = lo[j] + amp[j]
            out["sse"][rows] = np.maximum(smin, 0.0)
        return out

    def _interior(self, p: np.ndarray, ybar: np.ndarray, shape: np.ndarray) -> tuple[np.ndarray, np.ndarray,
                                                                                       np.ndarray]:
        """The unconstrained fit of rows with means ``ybar`` to ``shape`` (grid indices), ``p`` the rows' products
        with the shapes' unit vectors: ``(amp, lo, feasible)``, feasible where ``p > 0``, ``lo ≥ 0`` and
        ``lo + amp ≤ 1`` (within rounding)."""
        amp = p / self.norm_c[shape]
        lo = ybar - amp * self.s_mean[shape]
        return amp, lo, (p > 0) & (lo >= -1e-12) & (lo + amp <= 1 + 1e-12)

    def _edges(self, yy: np.ndarray, p: np.ndarray, shape: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The better of the two edges ``lo = 0`` and ``hi = 1`` (each solved in closed form, clipped to the triangle)
        for rows ``yy`` ``[P, n]`` fitted to ``shape`` ``[P]``, ``p`` their products with the unit vectors:
        ``(sse, lo, amp)``."""
        sy_tot, yy2 = yy.sum(axis=1), (yy**2).sum(axis=1)
        s1, s2, t2 = self.s1[shape], self.s2[shape], self.t2[shape]
        sy = p * self.norm_f[shape] + self.s_mean[shape] * sy_tot  # s·y
        a0 = np.clip(sy / np.maximum(s2, 1e-300), 0.0, 1.0)  # edge lo = 0
        sse0 = yy2 - 2 * a0 * sy + a0 * a0 * s2
        ty = sy_tot - sy - s1 + s2  # (1 − s)·(y − s)
        l1 = np.clip(ty / np.maximum(t2, 1e-300), 0.0, 1.0)  # edge hi = 1
        sse1 = (yy2 - 2 * sy + s2) - 2 * l1 * ty + l1 * l1 * t2
        e0 = sse0 < sse1
        return np.where(e0, sse0, sse1), np.where(e0, 0.0, l1), np.where(e0, a0, 1.0 - l1)

    def midpoints(self, y: np.ndarray, *, min_amplitude: float = MIN_AMPLITUDE,
                  rng: np.random.Generator | None = None) -> tuple[np.ndarray, np.ndarray]:
        """α* and its status code (:data:`STATUS_NAMES`) for each row of ``y`` ``[B, n]``, by the point estimate's rule.

        ``mid`` is NaN wherever the code is not :data:`OK`. This is the rule every bootstrap
        replicate obeys: no cliff, below or beyond the grid exactly as :func:`fit_sigmoid` decides.
        """
        y = np.atleast_2d(np.asarray(y, float))
        codes = np.full(len(y), NO_DATA, dtype=int)
        mid = np.full(len(y), np.nan)
        finite = np.isfinite(y).all(axis=1)
        cliff = np.zeros(len(y), bool)
        cliff[finite] = has_cliff(y[finite], min_amplitude)
        codes[finite & ~cliff] = NO_CLIFF
        rows = np.flatnonzero(cliff)
        if rows.size:
            g = self.best(y[rows], rng=rng)
            c = edge_codes(self.x, y[rows], g["lo"], g["hi"], g["mid"], tol=self.mid_step / 2)
            codes[rows] = c
            mid[rows] = np.where(c == OK, g["mid"], np.nan)
        return mid, codes


@functools.lru_cache(maxsize=32)
def grid_for(x: tuple[float, ...]) -> SigmoidGrid:
    """A cached :class:`SigmoidGrid` for one ratio grid."""
    return SigmoidGrid(np.array(x))


def has_cliff(y: np.ndarray, min_amplitude: float = MIN_AMPLITUDE) -> np.ndarray:
    """Whether each curve in ``y`` ``[..., n]`` rises by at least ``min_amplitude`` (max − min, later max)."""
    y = np.asarray(y, float)
    rise = np.nanmax(y, axis=-1) - np.nanmin(y, axis=-1)
    # the maximum must come after the minimum: a falling curve is not a cliff
    order = (np.nanargmax(np.where(np.isnan(y), -np.inf, y), axis=-1)
             > np.nanargmin(np.where(np.isnan(y), np.inf, y), axis=-1))
    return (rise >= min_amplitude) & order


def edge_codes(x: np.ndarray, y: np.ndarray, lo: np.ndarray | float, hi: np.ndarray | float, mid: np.ndarray | float, *,
               tol: float = MID_STEP / 2) -> np.ndarray:
    """The identifiability rule for fitted curves ``y`` ``[B, n]`` over sorted ratios ``x``: OK, BELOW_GRID or
    BEYOND_GRID.

    Beyond the grid: the midpoint lies past the second-largest ratio (within ``tol``) — only the
    last ratio would then be above it, and one point cannot separate the top ``hi`` from the
    midpoint, unless the fitted top sits on its bound 1 — or H at the largest ratio is still below
    the fitted halfway level ``(lo + hi) / 2``. Below the grid, symmetrically: the midpoint lies
    before the second-smallest ratio (and the floor is above 0) or H at the smallest ratio is
    already above halfway. (The monotone cross-check uses the same rule: its
    crossing may not lie in the first or last gap.)
    """
    x = np.asarray(x, float)
    y = np.atleast_2d(np.asarray(y, float))
    half = 0.5 * (np.asarray(lo, float) + np.asarray(hi, float))
    mid = np.asarray(mid, float)
    beyond = (mid >= x[-1] - tol) | (y[:, -1] < half)
    below = (mid <= x[0] + tol) | (y[:, 0] > half)
    if len(x) >= 3:  # one ratio past the midpoint cannot tell the top (or the floor) from the midpoint,
        # unless the bound pins it: a fitted top at 1 (floor at 0) is as high (low) as a rate goes
        beyond |= (mid > x[-2] + tol) & (np.asarray(hi, float) < 1 - 1e-6)
        below |= (mid < x[1] - tol) & (np.asarray(lo, float) > 1e-6)
    return np.where(beyond, BEYOND_GRID, np.where(below, BELOW_GRID, OK))


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
                                      f"(H = {y[0]:.3f} at α = {x[0]:g}, {y[-1]:.3f} at α = {x[-1]:g}; "
                                      f"range {np.nanmin(y):.3f}–{np.nanmax(y):.3f})")
    grid = grid_for(tuple(x.tolist()))
    g = grid.best(y[None, :])
    lo0, hi0 = float(g["lo"][0]), float(g["hi"][0])
    frac0 = (hi0 - lo0) / (1.0 - lo0) if lo0 < 1 else 1.0
    p0 = [lo0, frac0, float(g["k"][0]), float(g["mid"][0])]
    params, status, reason = p0, "ok_grid", "curve_fit did not converge; grid optimum kept"
    bounds = ([0.0, 0.0, K_RANGE[0], x[0]], [1.0, 1.0, 2 * K_RANGE[1], x[-1]])
    p0c = np.clip(p0, np.array(bounds[0]) + 1e-9, np.array(bounds[1]) - 1e-9)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # OptimizeWarning about the covariance is irrelevant here
            popt, _ = curve_fit(_sigmoid_frac, x, y, p0=p0c, bounds=bounds, maxfev=5000)
        if np.sum((_sigmoid_frac(x, *popt) - y) ** 2) <= g["sse"][0] + 1e-12:
            params, status, reason = list(popt), "ok", "least-squares sigmoid fit, 0 ≤ lo ≤ hi ≤ 1"
        else:
            reason = "curve_fit ended worse than the grid optimum; grid optimum kept"
    except (RuntimeError, ValueError) as e:
        reason = f"curve_fit failed ({e}); grid optimum kept"
    lo, frac, k, mid = (float(p) for p in params)
    hi = lo + frac * (1.0 - lo)
    rmse = float(np.sqrt(np.mean((sigmoid(x, lo, hi - lo, k, mid) - y) ** 2)))
    code = int(edge_codes(x, y[None, :], lo, hi, mid, tol=grid.mid_step / 2)[0])
    if code == BEYOND_GRID:
        return SigmoidFit("beyond_grid", f"the fitted midpoint lies beyond the second-largest ratio (H has not risen "
                                         f"halfway by {x[-2]:g}, and the top is not pinned at 1): α* > {x[-2]:g} is "
                                         f"not identified",
                          lo=lo, hi=hi, k=k, rmse=rmse)
    if code == BELOW_GRID:
        return SigmoidFit("below_grid",
                          f"H is past halfway by the second-smallest ratio: α* < {x[1]:g} is not identified",
                          lo=lo, hi=hi, k=k, rmse=rmse)
    return SigmoidFit(status, reason, alpha_star=mid, lo=lo, hi=hi, k=k, rmse=rmse)
