"""Planted truth for the serving cost: a press and its constrained variants with known costs, paired.

Each simulated data set has ``n`` instances answered by a press ``p`` and three constrained variants at
every ratio of :data:`RATIOS`. Instance ``i`` has a difficulty ``u_i ~ U(0, 1)`` shared by every press and
ratio; a cell at α hallucinates when ``u_i < H(α)`` with ``H`` the press's curve (a late cliff, not the
logistic any estimator fits). A variant with planted cost ``c`` answers on ``H(α + c)``: its cliff comes
``c`` earlier, as a constraint that evicts evidence sooner would. **Churn**: each cell is, with
probability ``churn``, redrawn as an independent Bernoulli of its own curve (answers that flip for no
reason), so even the zero-cost control has non-zero paired differences.

The truth of a variant is the difference of the true areas under its curve and the press's over the grid
(:func:`true_difference`, the estimand of :mod:`kvroute.analysis.serving`). Rows: the share of 95%
intervals covering it, the share of sets deciding a cost (power, where ``c > 0``) and, for the zero-cost
control, the share deciding any difference (a false detection, which must stay near 5%).

**GER** is the cell's hallucination flag unless ``ger_shifts`` is given; then it is planted apart from H:
``GER_i(α) = clip(α / 2 + o_i + s_v·[α > 0] + ε, 0, 1)`` with an instance offset ``o_i ~ U(0, ger_spread)``
(instances differ far more than the variants do), the variant's shift ``s_v`` and cell noise
``ε ~ N(0, 0.03)``: a constraint that evicts the evidence more without changing the answers.
:func:`true_ger_difference` is its estimand.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from kvroute.analysis.serving import serving_cost

RATIOS: tuple[float, ...] = (0.0, 0.5, 0.7, 0.8, 0.85, 0.9, 0.95)
N_BOOT = 400  # bootstrap replicates per simulated set (the report uses 2000)
#: planted costs (a shift of the cliff) of the variants: none (the control), a small and a large one
COSTS: dict[str, float] = {"paged[block=16]": 0.0, "paged[block=64]": 0.05, "paged[block=16]+uniform": 0.15}


def curve(a: np.ndarray) -> np.ndarray:
    """The press's planted H(α): baseline 0.1, a cliff rising from 0.7 to 0.95."""
    return np.clip(0.1 + 0.85 * np.clip((np.asarray(a, float) - 0.7) / 0.25, 0, 1), 0.0, 1.0)


def _curve(a: np.ndarray, cost: float) -> np.ndarray:
    """A variant's H(α): the press's shifted ``cost`` earlier, its uncompressed cell (α = 0) the press's own."""
    a = np.asarray(a, float)
    return np.where(a > 0, curve(a + cost), curve(a))


def true_difference(cost: float) -> float:
    """True area under the variant's H minus the press's, over :data:`RATIOS` (trapezoid, divided by the width)."""
    x = np.asarray(RATIOS)

    def area(y: np.ndarray) -> float:
        return float(((y[1:] + y[:-1]) / 2 * np.diff(x)).sum() / (x[-1] - x[0]))

    return area(_curve(x, cost)) - area(curve(x))


def true_ger_difference(shift: float) -> float:
    """True area under a variant's GER minus the press's for a planted ``shift`` (no clipping: the planted
    values stay inside [0, 1] up to the noise): the shift over the part of the grid above α = 0."""
    x = np.asarray(RATIOS)
    step = (x > 0).astype(float)
    return shift * float(((step[1:] + step[:-1]) / 2 * np.diff(x)).sum() / (x[-1] - x[0]))


def simulate(n: int, churn: float, rng: np.random.Generator, costs: dict[str, float] | None = None, *,
             ger_shifts: dict[str, float] | None = None, ger_spread: float = 0.4) -> pd.DataFrame:
    """One record set: ``knorm`` and ``knorm+<variant>`` for each planted variant on ``n`` instances."""
    x = np.asarray(RATIOS)
    u = rng.random((n, 1))
    offset = rng.random((n, 1)) * ger_spread if ger_shifts is not None else None
    rows = []
    for variant, cost in {"": 0.0, **(costs or COSTS)}.items():
        h = _curve(x, cost)[None, :]  # [1, C]
        flags = u < h
        redraw = rng.random(flags.shape) < churn
        flags = np.where(redraw, rng.random(flags.shape) < h, flags)  # [n, C]
        flags[:, 0] = u[:, 0] < h[0, 0]  # α = 0 is the one shared uncompressed run
        ger = flags.astype(float)
        if ger_shifts is not None and offset is not None:
            shift = ger_shifts.get(variant, 0.0) * (x > 0)[None, :]
            ger = np.clip(x[None, :] / 2 + offset + shift + rng.normal(0.0, 0.03, flags.shape), 0.0, 1.0)
            ger[:, 0] = np.clip(offset[:, 0], 0.0, 1.0)  # the shared uncompressed run
        press = "knorm" + (f"+{variant}" if variant else "")
        for i in range(n):
            for j, r in enumerate(x):
                rows.append({"model": "planted", "regime": "agnostic", "family": "base", "press": press,
                             "instance_id": f"i{i}", "ratio": float(r), "hallucinated": bool(flags[i, j]),
                             "ger": float(ger[i, j])})
    return pd.DataFrame(rows)


def coverage(n_sets: int = 200, seed: int = 0, n: int = 48, churn: float = 0.2) -> list[dict]:
    """Rows per planted variant: interval coverage of the true Δ area, decided-cost share, false detections."""
    rng = np.random.default_rng(seed)
    est: dict[str, list[tuple[float, float, float, bool]]] = {v: [] for v in COSTS}
    for k in range(n_sets):
        pairs = serving_cost(simulate(n, churn, rng), n_boot=N_BOOT, seed=seed + k, per_ratio=False)[0]
        pairs = pairs.set_index("variant")
        for v in COSTS:
            r = pairs.loc[v]
            est[v].append((float(r["difference"]), float(r["difference_low"]), float(r["difference_high"]),
                           bool(r["decided"])))
    rows = []
    for v, cost in COSTS.items():
        truth = true_difference(cost)
        a = np.asarray(est[v])
        covered = float(np.mean((a[:, 1] <= truth) & (truth <= a[:, 2])))
        decided = float(np.mean(a[:, 3]))
        rows.append({"estimator": "serving Δ area", "parameter": f"{v} (cliff {cost:g} earlier)", "truth": truth,
                     "n_sets": n_sets, "mean_estimate": float(a[:, 0].mean()), "coverage": covered,
                     "decided": decided,
                     "note": ("zero-cost control: decided = false detections" if cost == 0 else
                              f"planted cost: decided = power at n={n}, churn {churn:g}")})
    return rows
