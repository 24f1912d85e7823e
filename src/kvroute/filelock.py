"""An exclusive lock on a file: ``flock`` held on an open descriptor, with the holder's pid, host and start time.

The kernel drops the lock when the holding process ends in any way (a SIGKILL included), so a killed holder never
leaves a stale lock: the file stays, the lock does not. The file's text (pid, host, start time) serves the message a
waiting process gives, and one more case: a lock still held although the process named in it is gone from this host
(a child it forked kept the descriptor) is broken with ``break_dead=True``: the file is removed, and the next holder
locks a new one. The run lock (:mod:`kvroute.sweep.lock`) and the kernel build (:mod:`kvroute.engine.kept_build`)
hold one each.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any


class FileLock:
    """``FileLock(path).acquire()`` (at once or not at all) or ``.acquire(timeout=s)`` (waits up to ``s`` seconds);
    True when held. :meth:`release` drops it."""

    def __init__(self, path: str | Path, *, mode: int = 0o600) -> None:
        self.path = Path(path)
        self.mode = mode  # of the file, where this lock creates it
        self._fd: int | None = None

    def acquire(self, timeout: float = 0.0, *, break_dead: bool = False, poll: float = 0.1) -> bool:
        """Take the lock, waiting up to ``timeout`` seconds for its holder; ``break_dead``: break a lock whose
        recorded holder is a process of this host that no longer exists. OSError where the file cannot be opened."""
        deadline = time.monotonic() + timeout
        while True:
            if self._try():
                return True
            if break_dead and _dead(self.holder()):
                _remove_if_same(self.path)
                continue
            if time.monotonic() >= deadline:
                return False
            time.sleep(min(poll, max(deadline - time.monotonic(), 0.0)))

    def _try(self) -> bool:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, self.mode)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return False
        try:  # a lock broken (its file removed) between our open and our flock is not the lock: take the new file
            same = os.stat(self.path).st_ino == os.fstat(fd).st_ino
        except OSError:
            same = False
        if not same:
            os.close(fd)
            return self._try()
        info = {"pid": os.getpid(), "host": socket.gethostname(),
                "started": datetime.now(UTC).isoformat(timespec="seconds")}
        try:  # the text serves others' messages: a full disk must not stop the holder here
            os.ftruncate(fd, 0)
            os.write(fd, json.dumps(info).encode())
        except OSError:
            pass
        self._fd = fd
        return True

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor drops the flock
            self._fd = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def holder(self) -> dict[str, Any] | None:
        """The holder's record (pid, host, started), None where the file holds none."""
        try:
            info = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return None
        return info if isinstance(info, dict) else None

    def describe(self) -> str:
        """The holder in words: ``pid 123 on HOST, started ISO``."""
        info = self.holder()
        try:
            return f"pid {info['pid']} on {info['host']}, started {info['started']}"  # type: ignore[index]
        except (KeyError, TypeError):
            return "a process that has not yet written its details"


def _dead(info: dict[str, Any] | None) -> bool:
    """Whether ``info`` names a process of this host that no longer exists."""
    if not info or info.get("host") != socket.gethostname():
        return False
    pid = info.get("pid")
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # another user's process: alive
        return False
    return False


def _remove_if_same(path: Path) -> None:
    """Remove the lock file just read, not one another process put in its place since."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        if _dead(_read(fd)) and os.stat(path).st_ino == os.fstat(fd).st_ino:
            os.unlink(path)
    except OSError:
        pass
    finally:
        os.close(fd)


def _read(fd: int) -> dict[str, Any] | None:
    try:
        info = json.loads(os.pread(fd, 4096, 0))
    except (OSError, ValueError):
        return None
    return info if isinstance(info, dict) else None
