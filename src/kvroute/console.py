"""The terminal: kvroute's consoles (stdout, stderr) and its progress bars, for every command.

One owner for how kvroute talks to a terminal: the commands of the :mod:`kvroute.cli` package print
through ``console`` / ``err_console`` and show long work through
:class:`RichProgress` (kvroute's :class:`~kvroute.progress.Progress` protocol on a rich bar, or plain
lines where stderr is not a terminal).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    SpinnerColumn,
    Task,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.text import Text

from kvroute.progress import PlainProgress, PlainTask

console = Console()
err_console = Console(stderr=True)


class _Handle:
    """One bar of a rich Progress, as kvroute's progress Task."""

    def __init__(self, progress: Progress, tid: TaskID, *, jump_on_completed: bool = False) -> None:
        self.p, self.tid, self.jump = progress, tid, jump_on_completed

    def advance(self, n: float = 1) -> None:
        self.p.advance(self.tid, n)

    def update(self, *, completed: float | None = None, total: float | None = None,
               description: str | None = None) -> None:
        if completed is not None and self.jump:  # work found done (a resumed store): a jump, not a rate
            self.p.reset(self.tid, completed=int(completed), total=total, description=description)
        else:
            self.p.update(self.tid, completed=completed, total=total, description=description)


class RichProgress:
    """kvroute's Progress protocol on a rich progress bar (stderr)."""

    def __init__(self, console: Console = err_console) -> None:
        self.console = console

    def columns(self, total: float | None) -> list[ProgressColumn]:
        columns: list[ProgressColumn] = [SpinnerColumn(), TextColumn("{task.description}"), BarColumn()]
        if total:
            columns.append(MofNCompleteColumn() if total < 1e5 else TextColumn("{task.percentage:>3.0f}%"))
        return columns + [TimeElapsedColumn(), TimeRemainingColumn()]

    jump_on_completed = False
    unit = ""

    @contextlib.contextmanager
    def task(self, description: str, total: float | None = None) -> Iterator[_Handle | PlainTask]:
        if not self.console.is_terminal:  # a log file, nohup, CI: rich draws no bar there, so plain lines
            with PlainProgress(self.console.file, unit=self.unit).task(description, total) as t:
                yield t
            return
        with Progress(*self.columns(total), console=self.console, transient=False) as p:
            tid = p.add_task(description, total=total)
            yield _Handle(p, tid, jump_on_completed=self.jump_on_completed)
            if total is None:
                p.update(tid, total=1, completed=1)


class RateColumn(ProgressColumn):
    """Cells per second (or per minute when slow), for the sweep bar."""

    def render(self, task: Task) -> Text:
        speed = task.speed
        if not speed:
            return Text("-- cells/s", style="progress.data.speed")
        text = f"{speed:.2f} cells/s" if speed >= 0.1 else f"{speed * 60:.2f} cells/min"
        return Text(text, style="progress.data.speed")


class SweepProgress(RichProgress):
    """The sweep's bar: cells done of total, rate, elapsed and ETA; cells found in the store are a jump."""

    jump_on_completed = True
    unit = "cells"

    def columns(self, total: float | None) -> list[ProgressColumn]:
        return [SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                RateColumn(), TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn()]
