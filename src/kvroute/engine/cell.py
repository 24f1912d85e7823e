"""A cell: one (press, ratio) perturbation of a prompt's cache; ``press="none"`` is the full cache.

Its own module (free of torch and transformers), so that grids of cells are planned and keyed
(``kvroute sweep --dry-run``) without importing the engine.
"""

from __future__ import annotations

from dataclasses import dataclass

NO_PRESS = "none"


@dataclass(frozen=True)
class Cell:
    """One (press, ratio) perturbation of a prompt's cache. ``press="none"`` is the full cache."""

    press: str
    ratio: float
