"""A cell: one (press, ratio) perturbation of a prompt's cache, optionally with entries restored; ``press="none"``
is the full cache.

Its own module (free of torch and transformers), so that grids of cells are planned and keyed
(``kvroute sweep --dry-run``) without importing the engine.
"""

from __future__ import annotations

from dataclasses import dataclass

NO_PRESS = "none"


@dataclass(frozen=True)
class Cell:
    """One (press, ratio) perturbation of a prompt's cache. ``press="none"`` is the full cache.

    ``restore``: a restore condition (kvroute.presses.restore), entries put back into the press's mask after
    it is made; empty for none."""

    press: str
    ratio: float
    restore: str = ""
