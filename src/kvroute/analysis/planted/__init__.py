"""Planted truth: simulated data sets with known parameters, and the coverage of each estimator.

Each module here simulates many data sets whose truth is known, runs the same estimator the
report uses, and returns one row per (estimator, truth) with the share of 95% intervals that
cover the truth. ``benchmarks/planted_truth.py`` prints them all; the tests assert them loosely.

Every module exposes ``coverage(n_sets: int = 200, seed: int = 0) -> list[dict]``; each row has at
least ``estimator``, ``parameter``, ``truth``, ``n_sets``, ``mean_estimate``, ``coverage`` (share of
sets whose 95% interval covers the truth, or None where the estimator gives no interval) and
``note`` (a few words: what the row shows).
"""

from __future__ import annotations

MODULES: tuple[str, ...] = ("cliff", "cliff_shapes", "excess", "decomposition", "ger_link", "consensus", "league",
                            "probe", "serving")


def all_coverage(n_sets: int = 200, seed: int = 0, only: tuple[str, ...] | None = None) -> list[dict]:
    """Rows from every planted-truth module (or those in ``only``), in :data:`MODULES` order."""
    from importlib import import_module

    rows: list[dict] = []
    for name in only or MODULES:
        mod = import_module(f"{__name__}.{name}")
        for row in mod.coverage(n_sets=n_sets, seed=seed):
            rows.append({"module": name, **row})
    return rows
