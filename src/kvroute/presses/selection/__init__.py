"""Registered selection strategies: one file each. ``SELECTIONS`` maps names to classes."""

from kvroute.presses.selection import (  # noqa: F401  (registration side effects)
    adakv,
    block,
    chunk,
    chunkkv,
    criticalkv,
    entropy_chunkkv,
    global_,
    per_head,
    pyramid,
    routes,
    shared,
)
from kvroute.presses.selection.base import SELECTIONS, Selection, build_selection, check_ratio, n_kept, topk_mask

__all__ = ["SELECTIONS", "Selection", "build_selection", "check_ratio", "n_kept", "topk_mask"]
