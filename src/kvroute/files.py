"""Writing files safely: names built from data, atomic writes, and OS errors as one-line messages.

Three rules every kvroute writer follows:

* a file name built from data (a model name, a task instance id) goes through :func:`safe_name`,
  so no id can climb out of the output folder (``../../x``), name a sub-folder (``a/b``) or carry
  control characters;
* a file is written through :func:`atomic_write` (or :func:`write_text` / :func:`write_bytes`): the
  bytes go to a temporary file in the same directory, are flushed and fsync'ed, and only then
  renamed over the target. After a crash, a full disk or an exception, the target holds either its
  old bytes or the complete new ones, and the temporary file is gone;
* a folder of outputs (the report) is written whole by :func:`write_folder`: into a temporary folder
  next to it, then swapped in with one rename, so a killed report leaves the old folder or the new one;
* an :class:`OSError` that reaches the CLI becomes one line naming the path and the fix
  (:func:`os_error_message`), not a traceback.

Temporary names carry the writer's pid (``.NAME.PID.XXXX.tmp``): a writer killed with SIGKILL cannot
remove its own, so the next write of the same target removes those whose process is gone.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import hashlib
import os
import re
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import IO, Any

from kvroute.errors import KvrouteError

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
MAX_NAME = 120


def safe_name(text: str, *, max_len: int = MAX_NAME) -> str:
    """``text`` as one safe path component: letters, digits, ``.``, ``_`` and ``-`` only.

    Anything else (``/``, ``\\``, spaces, control characters, non-ASCII) becomes ``_``, leading dots
    are dropped (no ``..``, no hidden files), and a name that had to change (or be cut to
    ``max_len``) gets 8 hex digits of its SHA-256, so two different ids never share a file. Ordinary
    ids (content hashes, zoo names) come back unchanged.
    """
    text = str(text)
    clean = _UNSAFE.sub("_", text).lstrip(".")
    if clean == text and clean and len(clean) <= max_len:
        return clean
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:8]
    clean = clean[: max_len - 9].rstrip(".") or "x"
    return f"{clean}-{digest}"


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # some file systems (and Windows) cannot open a directory; the rename still happened
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _temp_prefix(path: Path) -> str:
    return f".{path.name[:60]}.{os.getpid()}."


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: alive, another user's
        return True
    return True


def remove_stale_temps(path: str | os.PathLike[str]) -> list[Path]:
    """Remove the temporary files/folders left next to ``path`` by writers that were killed.

    Only names of this module's pattern (``.NAME.PID.XXXX.tmp``) whose ``PID`` is not a live process
    are removed; a concurrent writer's temp (its process alive) is left alone. Returns what was removed.
    """
    path = Path(path)
    prefix = f".{path.name[:60]}."
    removed: list[Path] = []
    try:
        entries = list(os.scandir(path.parent))
    except OSError:
        return removed
    for entry in entries:
        name = entry.name
        if not (name.startswith(prefix) and name.endswith(".tmp")):
            continue
        pid_text = name[len(prefix):].split(".", 1)[0]
        if not pid_text.isdigit() or int(pid_text) == os.getpid() or _pid_alive(int(pid_text)):
            continue
        with contextlib.suppress(OSError):
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path)
            else:
                os.unlink(entry.path)
            removed.append(Path(entry.path))
    return removed


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike[str], mode: str = "w", *, encoding: str | None = "utf-8",
                 newline: str | None = "\n") -> Iterator[IO[Any]]:
    """Open a temporary file next to ``path``; on success fsync it and rename it over ``path``.

    ``mode`` is ``"w"`` (text) or ``"wb"``. Nothing is visible at ``path`` until the block ends
    without an exception; on any exception (or ``KeyboardInterrupt``) the temporary file is
    removed and ``path`` keeps its old bytes. ``path`` naming a directory fails before the block
    runs (:class:`IsADirectoryError`). Parent folders must exist.
    """
    if mode not in ("w", "wb"):
        raise ValueError(f"atomic_write mode must be 'w' or 'wb', got {mode!r}")
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
    remove_stale_temps(path)
    fd, tmp_name = tempfile.mkstemp(prefix=_temp_prefix(path), suffix=".tmp", dir=path.parent)
    tmp = Path(tmp_name)
    try:
        if mode == "wb":
            f: IO[Any] = os.fdopen(fd, "wb")
        else:
            f = os.fdopen(fd, "w", encoding=encoding, newline=newline)
        with f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        with contextlib.suppress(OSError):  # mkstemp makes the file 0600; give it the usual mode
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except OSError as e:
        with contextlib.suppress(OSError):
            tmp.unlink()
        if e.filename is None:  # fsync and write errors carry no path; the message must name one
            raise type(e)(e.errno, e.strerror, str(path)) from e
        raise
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    _fsync_dir(path.parent)


def write_text(path: str | os.PathLike[str], text: str, *, encoding: str = "utf-8") -> Path:
    """Atomically replace ``path`` with ``text`` (``\\n`` line endings kept as given)."""
    with atomic_write(path, "w", encoding=encoding) as f:
        f.write(text)
    return Path(path)


def write_bytes(path: str | os.PathLike[str], data: bytes) -> Path:
    """Atomically replace ``path`` with ``data``."""
    with atomic_write(path, "wb") as f:
        f.write(data)
    return Path(path)


_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths in one step (Linux ``renameat2(RENAME_EXCHANGE)``); False where unsupported."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.renameat2
    except (OSError, AttributeError):
        return False
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    if fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EOPNOTSUPP):
        return False  # the file system cannot exchange: fall back to two renames
    raise OSError(err, os.strerror(err), str(b))


def _is_owned(folder: Path, owned: frozenset[str]) -> bool:
    """Whether every entry of ``folder`` is one ``write_folder`` would write (so the folder may be swapped whole)."""
    for p in folder.rglob("*"):
        rel = p.relative_to(folder).as_posix()
        if p.is_dir():
            if not any(o.startswith(rel + "/") for o in owned) and rel not in owned:
                return False
        elif rel not in owned and not any(rel.startswith(o.rstrip("*")) and o.endswith("*") for o in owned):
            return False
    return True


def _holds_cwd(folder: Path) -> bool:
    """Whether ``folder`` is the working directory or holds it: such a folder cannot be swapped (renaming
    ``.`` fails with EBUSY, and a swap would leave the process, and the user's shell, in a removed folder)."""
    try:
        here = Path.cwd().resolve()
        target = folder.resolve()
    except OSError:  # the working directory is gone: nothing to protect
        return False
    return target == here or target in here.parents


def write_folder(path: str | os.PathLike[str], files: dict[str, bytes], *,
                 owned: frozenset[str] = frozenset()) -> Path:
    """Write ``files`` (relative path → bytes) as the folder ``path``, all at once or not at all.

    The files go to a temporary folder next to ``path`` (fsync'ed), which then replaces ``path`` in one
    rename (an exchange of the two on Linux, so ``path`` never goes missing). A failure or a kill leaves
    ``path`` as it was. ``owned`` lists what else a folder made by this writer may hold (``"dir/*"``
    patterns allowed): a ``path`` holding anything beyond ``files`` and ``owned`` (the user pointed it
    at a folder with other files) is not swapped, nor is the working directory or a folder holding it; each
    file is then replaced atomically in turn, the last key of ``files`` last, and the other files are kept.
    """
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise NotADirectoryError(errno.ENOTDIR, "is a file, not a folder", str(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.is_dir() and (_holds_cwd(path) or not _is_owned(path, frozenset(files) | owned)):
        for rel, data in files.items():
            (path / rel).parent.mkdir(parents=True, exist_ok=True)
            write_bytes(path / rel, data)
        return path
    remove_stale_temps(path)
    tmp = Path(tempfile.mkdtemp(prefix=_temp_prefix(path), suffix=".tmp", dir=path.parent))
    try:
        for rel, data in files.items():
            f = tmp / rel
            f.parent.mkdir(parents=True, exist_ok=True)
            with open(f, "wb") as out:
                out.write(data)
                out.flush()
                os.fsync(out.fileno())
        for d in sorted({(tmp / rel).parent for rel in files}, key=lambda p: len(p.parts), reverse=True):
            _fsync_dir(d)
        with contextlib.suppress(OSError):  # mkdtemp makes the folder 0700; give it the usual mode
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(tmp, 0o777 & ~umask)
        if not path.exists():
            os.replace(tmp, path)
        elif _exchange(tmp, path):  # tmp now holds the old folder
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            old = Path(tempfile.mkdtemp(prefix=_temp_prefix(path), suffix=".tmp", dir=path.parent))
            os.replace(path, old / "old")
            os.replace(tmp, path)
            shutil.rmtree(old, ignore_errors=True)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if e.filename is None:
            raise type(e)(e.errno, e.strerror, str(path)) from e
        raise
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _fsync_dir(path.parent)
    return path


def check_output_file(path: str | os.PathLike[str], option: str = "--out") -> Path:
    """Fail early, before any work, when ``path`` cannot be an output file (a directory, or a parent that is a file)."""
    p = Path(path)
    if p.is_dir():
        raise KvrouteError(f"{option} {p} is a directory; give a file path such as {p / 'records.jsonl'}")
    for parent in p.parents:
        if parent.exists():
            if not parent.is_dir():
                raise KvrouteError(f"{option} {p}: {parent} is a file, not a folder; choose another {option}")
            break
    return p


_FIXES: dict[int, str] = {
    errno.EACCES: "permission denied; choose another --out or make the folder writable",
    errno.EPERM: "operation not permitted; choose another --out or make the folder writable",
    errno.EROFS: "the file system is read-only; choose another --out on a writable disk",
    errno.ENOSPC: "no space left on the device; free some space or choose another --out (finished work in a "
                  "run store is kept: --resume continues)",
    errno.EDQUOT: "disk quota exceeded; free some space or choose another --out",
    errno.EISDIR: "is a directory; give a file path (or another --out)",
    errno.ENOTDIR: "a part of the path is a file, not a folder; choose another path",
    errno.EEXIST: "already exists; remove it or choose another path",
    errno.ENOENT: "no such file or directory; check the path",
    errno.ENAMETOOLONG: "the file name is too long; choose a shorter path",
    errno.EMFILE: "too many open files; raise the limit (ulimit -n) or run fewer jobs at once",
}


def os_error_message(e: OSError) -> str:
    """One line for an OS error: the path(s), what happened, and what to do."""
    paths = [str(p) for p in (e.filename, e.filename2) if p is not None]
    where = " → ".join(paths) if paths else "a file"
    fix = _FIXES.get(e.errno) if e.errno is not None else None
    reason = e.strerror or type(e).__name__
    text = f"{where}: {fix}" if fix else f"{where}: {reason}; check the path and the disk, then run again"
    return " ".join(text.split())


def _same_path(a: Path, b: Path) -> bool:
    """Whether ``a`` and ``b`` name one file: the same resolved path, or (both existing) the same inode."""
    try:
        if a.exists() and b.exists():
            return os.path.samefile(a, b)
    except OSError:
        pass
    return a.resolve() == b.resolve()


def check_not_input(out: str | os.PathLike[str], inputs: Mapping[str, str | os.PathLike[str] | None],
                    option: str = "--out", *, what: str | None = None) -> Path:
    """Refuse, before any work, an output file that is one of the command's inputs.

    ``inputs`` maps what an input is (``"the task file --tasks"``, ``"the run's store"``) to its path
    (None: not given). Paths are compared resolved (symlinks, ``..``) and, where both exist, by inode
    (hard links), so ``--out`` can never replace a file the same command reads. ``what`` names the output
    in the message when it is a file the command writes under ``option`` (default: ``option`` itself).
    """
    p = Path(out)
    for kind, path in inputs.items():
        if path is not None and _same_path(p, Path(path)):
            raise KvrouteError(f"{what or option} {p} is {kind}; writing it would replace that input. Choose "
                               f"another {option}")
    return p
