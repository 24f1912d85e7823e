"""One writer per run directory: an exclusive ``flock`` on ``RUN_DIR/.kvroute.lock``.

The lock is held on an open file descriptor for the whole sweep, so the kernel releases it when
the process ends in any way (a SIGKILL included): a killed sweep never leaves a stale lock
behind. The file's text (pid, host, start time) only serves the message a second sweep gets.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
from datetime import UTC, datetime
from pathlib import Path

from kvroute.errors import StoreLockedError

LOCK_NAME = ".kvroute.lock"


class RunLock:
    """``with RunLock(run_dir):`` — or :meth:`acquire` / :meth:`release`."""

    def __init__(self, run_dir: str | Path) -> None:
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / LOCK_NAME
        self._fd: int | None = None

    def acquire(self) -> RunLock:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = _describe(self.path)
            os.close(fd)
            raise StoreLockedError(f"{self.run_dir} is being written by another sweep ({holder}); wait for it to "
                                   "finish or use another --out") from None
        info = {"pid": os.getpid(), "host": socket.gethostname(),
                "started": datetime.now(UTC).isoformat(timespec="seconds")}
        try:  # the text only serves another sweep's message: a full disk must not stop this one here
            os.ftruncate(fd, 0)
            os.write(fd, json.dumps(info).encode())
        except OSError:
            pass
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor drops the flock
            self._fd = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def _describe(path: Path) -> str:
    try:
        info = json.loads(path.read_text())
        return f"pid {info['pid']} on {info['host']}, started {info['started']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "a process that has not yet written its details"
