"""The guard around a call into code kvroute did not write: a press plugin's, or kvpress's own presses'.

What such code raises (any ``Exception``, and ``SystemExit``) becomes a :class:`~kvroute.errors.PressPluginError`
naming the code and the call, a per-cell error (:data:`~kvroute.errors.CELL_ERRORS`); running out of memory and
Ctrl-C still stop the run, and kvroute's own errors pass as they are. :mod:`kvroute.presses.fence` puts it around
every call into a press plugin; :class:`~kvroute.presses.scorers.kvpress_adapter.KvpressScorer` around kvpress's
``score()``, so a kvpress press that cannot handle a model (a shape it does not expect) fails its cells, not the run.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from kvroute.errors import KvrouteError, PressPluginError

#: what a guarded call lets through: the user's Ctrl-C and running out of memory stop the run (torch's
#: out-of-memory error under its name since torch 2.5, torch.cuda's before; the same class)
FATAL: tuple[type[BaseException], ...] = (MemoryError, torch.cuda.OutOfMemoryError)


@contextlib.contextmanager
def guard(origin: str, call: str) -> Iterator[None]:
    """Turn any ``Exception`` or ``SystemExit`` raised inside into a :class:`PressPluginError` naming ``origin``
    (e.g. ``press plugin 'x' (mod:Cls, from dist)``) and ``call`` (e.g. ``score()``).

    :data:`FATAL` errors, ``KeyboardInterrupt`` and kvroute's own errors pass unchanged.
    """
    try:
        yield
    except FATAL:
        raise
    except KvrouteError:
        raise
    except (Exception, SystemExit) as e:
        raise PressPluginError(_raised(origin, call, e)) from None


def _raised(origin: str, call: str, e: BaseException) -> str:
    """``{origin} raised ZeroDivisionError in score(): division by zero``, on one line (a SystemExit says its code)."""
    if isinstance(e, SystemExit):
        return f"{origin} raised SystemExit in {call} (exit code {e.code!r}); a press must return, not exit"
    what = str(e).strip()
    return " ".join(f"{origin} raised {type(e).__name__} in {call}{': ' + what if what else ''}".split())
