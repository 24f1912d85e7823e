"""Progress reporting without printing.

Library code reports progress through a :class:`Progress` object it is handed; the CLI hands it
a rich progress bar, Python callers get :data:`SILENT` unless they pass their own. This keeps the
rule that only the CLI prints, while long operations (pulls, sweeps) still show bars.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Protocol

log = logging.getLogger(__name__)


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
