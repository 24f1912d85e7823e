"""Presses: scorers (kvpress adapter + controls), selection strategies, and the KeepMask."""

from kvroute.presses.keepmask import KeepMask
from kvroute.presses.press import Press, build_press
from kvroute.presses.scorers import SCORERS, Scorer, build_scorer
from kvroute.presses.selection import SELECTIONS, Selection, build_selection, check_ratio, n_kept
from kvroute.presses.spec import ComponentSpec, PressSpec, parse_press

__all__ = ["SCORERS", "SELECTIONS", "ComponentSpec", "KeepMask", "Press", "PressSpec", "Scorer", "Selection",
           "build_press", "build_scorer", "build_selection", "check_ratio", "n_kept", "parse_press"]
