"""One writer per run directory: an exclusive ``flock`` on ``RUN_DIR/.kvroute.lock`` (a
:class:`kvroute.filelock.FileLock`).

The lock is held on an open file descriptor for the whole sweep, so the kernel releases it when
the process ends in any way (a SIGKILL included): a killed sweep never leaves a stale lock
behind. The file's text (pid, host, start time) only serves the message a second sweep gets.
"""

from __future__ import annotations

from pathlib import Path

from kvroute.errors import StoreLockedError
from kvroute.filelock import FileLock

LOCK_NAME = ".kvroute.lock"


class RunLock:
    """``with RunLock(run_dir):`` — or :meth:`acquire` / :meth:`release`."""

    def __init__(self, run_dir: str | Path) -> None:
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / LOCK_NAME
        self._lock = FileLock(self.path, mode=0o644)

    def acquire(self) -> RunLock:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if not self._lock.acquire():
            raise StoreLockedError(f"{self.run_dir} is being written by another sweep ({self._lock.describe()}); "
                                   "wait for it to finish or use another --out")
        return self

    def release(self) -> None:
        self._lock.release()

    @property
    def held(self) -> bool:
        return self._lock.held

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()
