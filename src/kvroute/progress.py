"""Progress reporting without printing.

Library code reports progress through a :class:`Progress` object it is handed; the CLI hands it
a rich progress bar on a terminal and a :class:`PlainProgress` off one (a log file, nohup, a batch
scheduler, CI — where rich draws nothing), and Python callers get :data:`SILENT` unless they pass
their own. This keeps the rule that only the CLI prints, while long operations (pulls, sweeps,
ticket searches, reports) still show how far they are.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import IO, Protocol

from kvroute.errors import ConfigError

log = logging.getLogger(__name__)

#: seconds between plain progress lines (besides one per 5% of the total); overridable per process
INTERVAL_ENV = "KVROUTE_PROGRESS_INTERVAL"
DEFAULT_INTERVAL = 30.0
DEFAULT_STEP = 0.05


class Task(Protocol):
    def advance(self, n: float = 1) -> None: ...
    def update(self, *, completed: float | None = None, total: float | None = None,
               description: str | None = None) -> None: ...


class Progress(Protocol):
    """Something that can show a stage of work; ``total=None`` means indeterminate."""

    def task(self, description: str, total: float | None = None) -> AbstractContextManager[Task]: ...


class _NullTask:
    def advance(self, n: float = 1) -> None:
        pass

    def update(self, *, completed: float | None = None, total: float | None = None,
               description: str | None = None) -> None:
        pass


class _Silent:
    """Logs each stage at INFO level and shows nothing."""

    @contextmanager
    def task(self, description: str, total: float | None = None) -> Iterator[Task]:
        log.info(description)
        yield _NullTask()


SILENT: Progress = _Silent()


def interval_from_env(default: float = DEFAULT_INTERVAL) -> float:
    """Seconds between plain progress lines: ``$KVROUTE_PROGRESS_INTERVAL`` if set, else ``default``."""
    raw = os.environ.get(INTERVAL_ENV, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value >= 0 or value == float("inf"):
        raise ConfigError(f"{INTERVAL_ENV}={raw!r}: expected a number of seconds >= 0 (e.g. 30); "
                          "0 prints a line at every step")
    return value


def _clock(seconds: float) -> str:
    """``m:ss`` or ``h:mm:ss``."""
    s = int(round(seconds))
    h, rest = divmod(s, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def _count(n: float) -> str:
    if float(n).is_integer() and abs(n) < 1e5:
        return f"{int(n)}"
    for unit in ("", "k", "M", "G", "T"):
        if abs(n) < 1000:
            return f"{n:.1f}{unit}"
        n /= 1000
    return f"{n:.1f}P"


class PlainTask:
    """One stage as plain lines: a line when it starts, one per ``step`` of the total and at least one
    every ``interval`` seconds while it runs (from a ticker thread, so a stage whose steps are slow
    or that has no total still shows it is alive), and one when it ends.

    A line reads ``description: 120/400 (30%), 2.10 cells/s, elapsed 0:57, ETA 2:13``. The rate counts
    only work advanced here: ``update(completed=...)`` (e.g. cells a resumed sweep found in its store)
    moves the count without counting as speed.
    """

    def __init__(self, write: Callable[[str], None], description: str, total: float | None, *,
                 interval: float, step: float = DEFAULT_STEP, unit: str = "",
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._write, self.description, self.total = write, description, total
        self.interval, self.step, self.unit, self._now = interval, step, unit, clock
        self.completed = 0.0
        self._lock = threading.Lock()
        self.t0 = self._now()
        self._rate_from = (self.t0, 0.0)  # (time, completed) after the last jump
        self._last_line = self.t0
        self._last_step = 0

    # -- the Task protocol
    def advance(self, n: float = 1) -> None:
        with self._lock:
            self.completed += n
            self._maybe_line()

    def update(self, *, completed: float | None = None, total: float | None = None,
               description: str | None = None) -> None:
        with self._lock:
            if total is not None:
                self.total = total
            if description is not None:
                self.description = description
            if completed is not None:  # a jump: not work done at this speed
                jumped = float(completed) != self.completed
                self.completed = float(completed)
                self._rate_from = (self._now(), self.completed)
                self._last_step = self._step_index()
                if jumped and self.completed and self.total:  # (the start line counted the whole total)
                    self._write(f"{self.description}: {_count(self.completed)}/{_count(self.total)} already done, "
                                f"{_count(self.total - self.completed)} to do")

    # -- lines
    def _step_index(self) -> int:
        if not self.total or self.step <= 0:
            return 0
        return int(self.completed / self.total / self.step + 1e-9)

    def _maybe_line(self) -> None:
        now = self._now()
        k = self._step_index()
        if k > self._last_step or now - self._last_line >= self.interval:
            self._last_step = max(k, self._last_step)
            self._emit(now)

    def tick(self) -> float:
        """Print a line if none came for ``interval`` seconds; returns the seconds until the next is due."""
        with self._lock:
            now = self._now()
            if now - self._last_line >= self.interval:
                self._emit(now)
            return max(0.0, self._last_line + self.interval - now)

    def line(self, now: float | None = None) -> str:
        now = self._now() if now is None else now
        elapsed = now - self.t0
        parts = []
        if self.total:
            parts.append(f"{_count(self.completed)}/{_count(self.total)} ({100 * self.completed / self.total:.0f}%)")
        elif self.completed:
            parts.append(_count(self.completed))
        t_rate, c_rate = self._rate_from
        done_here = self.completed - c_rate
        rate = done_here / (now - t_rate) if now > t_rate and done_here > 0 else None
        if rate is not None:
            unit = f" {self.unit}" if self.unit else ""
            parts.append(f"{_count(rate) if rate >= 1000 else f'{rate:.2f}'}{unit}/s" if rate >= 0.1
                         else f"{rate * 60:.2f}{unit}/min")
        parts.append(f"elapsed {_clock(elapsed)}")
        if rate and self.total and self.completed < self.total:
            parts.append(f"ETA {_clock((self.total - self.completed) / rate)}")
        return f"{self.description}: " + ", ".join(parts)

    def _emit(self, now: float) -> None:
        self._last_line = now
        self._write(self.line(now))

    def start(self) -> None:
        with self._lock:
            self._write(f"{self.description}: started" + (f", {_count(self.total)} to do" if self.total else ""))

    def finish(self, ok: bool) -> None:
        with self._lock:
            if not ok:
                self._write(self.line() + " (stopped)")
                return
            self._write(f"{self.description}: done in {_clock(self._now() - self.t0)}"
                        + (f", {_count(self.completed)}/{_count(self.total)}" if self.total else ""))


class PlainProgress:
    """kvroute's Progress protocol as plain text lines on a stream (a log file, CI output).

    ``interval`` is the most seconds between two lines of a running stage (default: ``$KVROUTE_PROGRESS_INTERVAL``
    or 30 s); besides, a line comes at every ``step`` (5%) of the total. ``unit`` names what the rate counts.
    """

    def __init__(self, stream: IO[str], *, interval: float | None = None, step: float = DEFAULT_STEP, unit: str = "",
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.stream, self.step, self.unit, self.clock = stream, step, unit, clock
        self.interval = interval_from_env() if interval is None else interval

    def _write(self, text: str) -> None:
        self.stream.write(text + "\n")
        self.stream.flush()

    @contextmanager
    def task(self, description: str, total: float | None = None) -> Iterator[PlainTask]:
        t = PlainTask(self._write, description, total, interval=self.interval, step=self.step, unit=self.unit,
                      clock=self.clock)
        t.start()
        stop = threading.Event()
        ticker = None
        if self.interval > 0:
            def run() -> None:
                delay = self.interval
                while not stop.wait(delay):
                    delay = max(t.tick(), 0.05)

            ticker = threading.Thread(target=run, name="kvroute-progress", daemon=True)
            ticker.start()
        ok = False
        try:
            yield t
            ok = True
        finally:
            stop.set()
            if ticker is not None:
                ticker.join()
            t.finish(ok)
