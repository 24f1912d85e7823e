"""Parameter schemas of scorers and selection strategies, checked when a press is built.

Every scorer and selection declares ``schema``: one :class:`Param` per numeric parameter (the type
comes from the parameter's default). :func:`kvroute.presses.scorers.base.check_params` applies
it when the press spec is parsed into a press, which happens at config time (``kvroute sweep
--dry-run``, ``kvroute run`` before the model loads), so a value the run would choke on
(``snapkv[window_size=-5]``, ``kernel_size=4``, ``epsilon=nan``) is refused there with the
parameter, the value and the allowed range, never by a dependency's assertion mid-run.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from kvroute.errors import ConfigError


@dataclass(frozen=True)
class Param:
    """Allowed values of one numeric parameter: ``lo <= v <= hi`` (bounds optional), odd when ``odd``.

    Floats must also be finite (no nan, no inf). ``why`` says, in the error, why the bound exists.
    ``kind`` types a parameter whose default is None (None stays allowed); ``choices`` lists a string
    parameter's allowed values.
    """

    lo: float | None = None
    hi: float | None = None
    odd: bool = False
    why: str = ""
    kind: type | None = None  # the value's type where the default is None (e.g. CompactorPress.blending)
    choices: tuple[str, ...] | None = None  # the allowed values of a string parameter (e.g. CURPress.leverage_type)

    def describe(self, integer: bool) -> str:
        what = ("an odd integer" if self.odd else "an integer") if integer else "a finite number"
        if self.lo is not None and self.hi is not None:
            return f"{what} in [{self.lo:g}, {self.hi:g}]"
        if self.lo is not None:
            return f"{what} >= {self.lo:g}"
        if self.hi is not None:
            return f"{what} <= {self.hi:g}"
        return what

    def check(self, kind: str, name: str, key: str, value: Any) -> None:
        integer = isinstance(value, int) and not isinstance(value, bool)
        ok = integer or math.isfinite(value)
        ok = ok and (self.lo is None or value >= self.lo) and (self.hi is None or value <= self.hi)
        ok = ok and (not self.odd or (integer and value % 2 == 1))
        if not ok:
            why = f" ({self.why})" if self.why else ""
            raise ConfigError(f"{kind} {name!r}: parameter {key} must be {self.describe(integer)}{why}, got {value!r}")

    def check_choice(self, kind: str, name: str, key: str, value: Any) -> None:
        """A string parameter: one of ``choices`` (when given)."""
        if not isinstance(value, str) or (self.choices is not None and value not in self.choices):
            allowed = f"one of {', '.join(self.choices)}" if self.choices else "a string"
            why = f" ({self.why})" if self.why else ""
            raise ConfigError(f"{kind} {name!r}: parameter {key} must be {allowed}{why}, got {value!r}")

