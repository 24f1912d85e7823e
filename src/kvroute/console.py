"""The terminal: kvroute's consoles (stdout, stderr) and its progress bars, for every command.

One owner for how kvroute talks to a terminal: the commands of the :mod:`kvroute.cli` package print
through ``console`` / ``err_console`` and show long work through
:class:`RichProgress` (kvroute's :class:`~kvroute.progress.Progress` protocol on a rich bar, or plain
lines where stderr is not a terminal). Listings print their tables through :func:`print_table`, which never cuts a
word (a name, a value) to fit a width, and their ``--json`` form through :func:`print_json`.
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Iterator, Sequence
from typing import Any

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
from rich.segment import Segments
from rich.table import Table
from rich.text import Text

from kvroute.progress import PlainProgress, PlainTask

console = Console()
err_console = Console(stderr=True)

#: the width tables are measured at (their natural width: each cell on one line)
_MEASURE_WIDTH = 10_000


def fit_widths(minimums: Sequence[int], maximums: Sequence[int], room: int) -> list[int] | None:
    """Column widths that sum to at most ``room``, each between its column's minimum (its longest word) and maximum
    (its longest line): the widest columns are narrowed first, to a common cap, and the columns held at the cap share
    what is left over. None where even the minimums do not fit."""
    if sum(maximums) <= room:
        return list(maximums)
    if sum(minimums) > room:
        return None

    def capped(cap: int) -> list[int]:
        return [min(hi, max(lo, cap)) for lo, hi in zip(minimums, maximums, strict=True)]

    low, high = 0, max(maximums)  # sum(capped(low)) = sum(minimums) <= room < sum(maximums) = sum(capped(high))
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if sum(capped(mid)) <= room else (low, mid)
    widths = capped(low)
    spare = room - sum(widths)  # fewer than the columns held at the cap (one more each would overflow)
    for i, (lo, hi) in enumerate(zip(minimums, maximums, strict=True)):
        if spare and lo <= low < hi:
            widths[i] += 1
            spare -= 1
    return widths


def print_table(table: Table, out: Console) -> None:
    """Print ``table`` on ``out`` without cutting a word (a name, a value) to fit the width: columns are narrowed by
    wrapping their text between words, the widest first. Where even that does not fit, a terminal keeps the first
    column (the names) whole and folds long words in the others (every character still shown, nothing "…"), and
    anything else (a pipe, a file) gets the table wider than ``out``'s width, each word whole. Sets the table's
    column widths: print it once.
    """
    options = out.options.update_width(_MEASURE_WIDTH)
    # rich's own measures (private, but in every rich this project supports): each column's (longest word, longest
    # line) with its padding, and the width the borders take
    ranges = [table._measure_column(out, options, column) for column in table.columns]
    pads = [table._get_padding_width(column._index) for column in table.columns]
    room = out.width - table._extra_width
    widths = fit_widths([r.minimum for r in ranges], [r.maximum for r in ranges], room)
    if widths is None and out.is_terminal:  # the other columns down to one character of text, folded
        floor = [ranges[0].minimum, *(pad + 1 for pad in pads[1:])]
        widths = fit_widths(floor, [r.maximum for r in ranges], room)
        if widths is None:  # not even that: rich's own layout (its columns fold)
            out.print(table)
            return
    if widths is None:
        widths = [r.minimum for r in ranges]
    for column, width, pad in zip(table.columns, widths, pads, strict=True):
        column.width = max(1, width - pad)
    if sum(widths) <= room:
        out.print(table)
    else:  # wider than the console: rendered at its own width, not cropped to the console's
        total = sum(widths) + table._extra_width
        out.print(Segments(out.render(table, out.options.update_width(total))), crop=False, soft_wrap=True)


def print_json(data: Any) -> None:
    """Print ``data`` as JSON on stdout (a listing's ``--json``): indented, non-ASCII as is, other types as strings."""
    sys.stdout.write(json.dumps(data, indent=2, ensure_ascii=False, default=str) + "\n")


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
