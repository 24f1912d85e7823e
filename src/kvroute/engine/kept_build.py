"""Building and loading the kept-entries attention kernel (:mod:`kvroute.engine.attention.kept`): no build can hurt
a run.

PyTorch's own path (``torch.utils.cpp_extension.load`` into its extension cache) hangs every later run after a build
was killed (its lock file is never cleared), crashes every process on a truncated library (a bus error), loads any
library placed under the predictable name, cannot use a read-only cache and compiles in the run's own process.
Here instead:

* the library lives in ``$KVROUTE_HOME/kernels`` (:func:`kernels_folder`), a folder of mode 0700 whose owner and
  mode are checked before anything in it is loaded (one open to others is closed and its builds rebuilt);
* a library is loaded only when the sha256 recorded beside it (``NAME.so.sha256``, written after its build) matches
  its bytes: a damaged, half-written or foreign library (no record, another digest) is rebuilt, never loaded. A
  complete, verified build in a read-only folder is loaded without writing anything;
* a build runs under kvroute's lock (:class:`kvroute.filelock.FileLock`, ``NAME.lock``; a killed holder's lock is
  dropped by the kernel, one whose recorded holder has died is broken), in a child process (in a session of its own,
  killed with its compilers at the timeout, and by the kernel when the run dies) and in a fresh folder of its own,
  the library moved in place only when complete; waiting and building together take at most
  ``KVROUTE_KERNEL_BUILD_TIMEOUT`` seconds (:data:`DEFAULT_TIMEOUT`), after which the run goes on with PyTorch's
  kernels and :class:`KernelUnavailable` says why in one line;
* the "building" line is printed only when a build really starts, and the compiler's and PyTorch's output (its
  multi-line warnings included) goes to the build's log, not to the terminal.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import math
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from kvroute.filelock import FileLock

log = logging.getLogger(__name__)

TIMEOUT_ENV = "KVROUTE_KERNEL_BUILD_TIMEOUT"
#: seconds a run waits for another's build and builds itself, together (a build takes about 30 s on two cores)
DEFAULT_TIMEOUT = 300.0
RECORD_SUFFIX = ".sha256"
#: the build process's last line where it fails: this, then why in one line
FAILURE = "kvroute-build-failure:"
#: the prefix of a build's own folder (``.build-NAME-XXXX``) inside the kernels folder
ATTEMPT_PREFIX = ".build-"


class KernelUnavailable(Exception):
    """Why the kernel is not loaded, in one line."""


@dataclass(frozen=True)
class KernelSpec:
    """What to build: the module ``name`` (a hash of everything that changes the library) from ``sources``."""

    name: str
    sources: tuple[str, ...]
    cflags: tuple[str, ...] = ()
    ldflags: tuple[str, ...] = ()


def kernels_folder() -> Path:
    """``$KVROUTE_HOME/kernels``."""
    from kvroute.models.zoo import kvroute_home

    return kvroute_home() / "kernels"


def build_timeout() -> float:
    """``KVROUTE_KERNEL_BUILD_TIMEOUT`` in seconds, :data:`DEFAULT_TIMEOUT` where unset or not a positive number."""
    raw = os.environ.get(TIMEOUT_ENV, "").strip()
    if not raw:
        return DEFAULT_TIMEOUT
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (value > 0 and math.isfinite(value)):
        log.warning("%s=%r is not a positive number of seconds; %g s is used", TIMEOUT_ENV, raw, DEFAULT_TIMEOUT)
        return DEFAULT_TIMEOUT
    return value


def _stage(name: str) -> None:
    """Called at each step of a build (``locked``, ``compiling``, ``compiled``, ``moved``, ``placed``); does
    nothing. The fault tests pause a build here to kill it at that point."""


class NotBuilt(KernelUnavailable):
    """No verified build of the kernel is in the folder, and the caller may not build one."""


def obtain(spec: KernelSpec, folder: Path, *, timeout: float, can_build: Callable[[], None],
           announce: Callable[[], None], build: bool = True) -> ModuleType:
    """The kernel module: a verified build in ``folder`` loaded, or (``build``) built first. ``can_build`` raises
    :class:`KernelUnavailable` where no build can run here (checked only when one is needed); ``announce`` is called
    when a build starts. :class:`KernelUnavailable` where it is not loaded within ``timeout`` seconds;
    :class:`NotBuilt` without ``build`` where no verified build is there (nothing is written then)."""
    deadline = time.monotonic() + timeout
    library = folder / f"{spec.name}.so"
    if folder.is_dir():
        _check_private(folder)
        module = _load_verified(spec.name, library)
        if module is not None:
            return module
    if not build:
        raise NotBuilt(f"not built in {folder}")
    can_build()
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as e:
        raise KernelUnavailable(f"cannot create {folder} ({e.strerror})") from None
    _check_private(folder)
    lock = FileLock(folder / f"{spec.name}.lock")
    try:
        held = lock.acquire(timeout=max(deadline - time.monotonic(), 0.0), break_dead=True)
    except OSError as e:
        raise KernelUnavailable(f"cannot build in {folder} ({e.strerror})") from None
    if not held:
        raise KernelUnavailable(f"another process ({lock.describe()}) is building it and did not finish within "
                                f"{timeout:g} s ({TIMEOUT_ENV} sets the wait)")
    try:
        _stage("locked")
        module = _load_verified(spec.name, library)  # built by the holder we waited for
        if module is not None:
            return module
        _discard(folder, spec.name)
        announce()
        built = _compile(spec, folder, deadline, timeout)
        _stage("compiled")
        _place(built, library)
        _stage("placed")
        module = _load_verified(spec.name, library)
        if module is None:  # pragma: no cover - only another user with our uid could get here
            raise KernelUnavailable(f"the library built in {folder} does not match its checksum")
        return module
    finally:
        lock.release()


def _check_private(folder: Path) -> None:
    """The folder is ours and closed to others: one open to others is closed and its builds are no longer trusted
    (their records removed: rebuilt); one of another user is refused."""
    try:
        st = os.stat(folder)
    except OSError as e:
        raise KernelUnavailable(f"cannot read {folder} ({e.strerror})") from None
    if not stat.S_ISDIR(st.st_mode):
        raise KernelUnavailable(f"{folder} is not a folder")
    if st.st_uid != os.geteuid():
        raise KernelUnavailable(f"{folder} belongs to another user (uid {st.st_uid})")
    if st.st_mode & 0o077:
        try:
            os.chmod(folder, 0o700)
            for record in folder.glob(f"*{RECORD_SUFFIX}"):
                record.unlink()
        except OSError as e:
            raise KernelUnavailable(f"{folder} is open to other users (mode {stat.S_IMODE(st.st_mode):o}) and "
                                    f"cannot be closed ({e.strerror})") from None
        log.info("%s was open to other users: closed (mode 700), its kernels are rebuilt", folder)


def _trusted_file(path: Path) -> bool:
    """A regular file (not a link) of ours that no one else may write."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & 0o022


def _digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _load_verified(name: str, library: Path) -> ModuleType | None:
    """The module of ``library`` where its recorded sha256 matches its bytes; None (nothing loaded) otherwise."""
    record = library.with_name(library.name + RECORD_SUFFIX)
    if not library.exists():
        return None
    if not (_trusted_file(library) and _trusted_file(record)):
        log.info("%s has no checksum record of ours: rebuilt, not loaded", library)
        return None
    try:
        expected = record.read_text().split()[0]
        actual = _digest(library)
    except (OSError, IndexError):
        return None
    if actual != expected:
        log.info("%s does not match its checksum (damaged or replaced): rebuilt, not loaded", library)
        return None
    spec = importlib.util.spec_from_file_location(name, library)
    if spec is None or spec.loader is None:  # pragma: no cover - a path ending in .so always has a loader
        raise KernelUnavailable(f"cannot load {library}")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except ImportError as e:
        raise KernelUnavailable(f"the verified build {library} did not load ({e})") from None
    return module


def _discard(folder: Path, name: str) -> None:
    """With the lock held: the folders of builds whose holder died, and a library of ``name`` that did not verify."""
    for attempt in folder.glob(f"{ATTEMPT_PREFIX}{name}-*"):
        shutil.rmtree(attempt, ignore_errors=True)
    for path in (folder / f"{name}.so", folder / f"{name}.so{RECORD_SUFFIX}"):
        path.unlink(missing_ok=True)


#: the build process: PyTorch's extension build into the given folder, then an import of the library (a library that
#: cannot be imported fails here, not in the run)
_BUILDER = """
import json, sys, traceback
a = json.loads(sys.argv[1])
try:
    from torch.utils.cpp_extension import load
    load(name=a["name"], sources=a["sources"], extra_cflags=a["cflags"], extra_ldflags=a["ldflags"],
         build_directory=a["folder"], verbose=True)
except BaseException as e:
    traceback.print_exc()
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    why = ([line for line in lines if "error:" in line] or [f"{type(e).__name__}: {line}" for line in lines[-1:]]
           or [type(e).__name__])[0]
    print("\\n" + FAILURE, why, flush=True)
    sys.exit(1)
""".replace("FAILURE", repr(FAILURE))
#: runs the build process (``argv[2:]``) so that it dies with the run (PR_SET_PDEATHSIG, kept across exec), after
#: checking that the run (``argv[1]``) has not already ended
_GUARD = """
import ctypes, os, signal, sys
try:
    ctypes.CDLL(None).prctl(1, signal.SIGKILL)
except Exception:
    pass
if os.getppid() != int(sys.argv[1]):
    sys.exit("the run that started this build has ended")
os.execv(sys.argv[2], sys.argv[2:])
"""


def _builder_command(spec: KernelSpec, attempt: Path) -> list[str]:
    """The command line of the build process, which writes ``attempt/NAME.so`` (an absolute path first)."""
    args = {"name": spec.name, "sources": list(spec.sources), "cflags": list(spec.cflags),
            "ldflags": list(spec.ldflags), "folder": str(attempt)}
    return [sys.executable, "-c", _BUILDER, json.dumps(args)]


def _compile(spec: KernelSpec, folder: Path, deadline: float, timeout: float) -> Path:
    """Build ``spec`` in a fresh folder of ``folder`` in a child process; the library's path."""
    attempt = Path(tempfile.mkdtemp(prefix=f"{ATTEMPT_PREFIX}{spec.name}-", dir=folder))
    output = attempt / "build.log"
    with open(output, "wb") as out:
        command = [sys.executable, "-c", _GUARD, str(os.getpid()), *_builder_command(spec, attempt)]
        proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True, cwd=attempt)
        try:
            _stage("compiling")
            code = proc.wait(timeout=max(deadline - time.monotonic(), 0.0))
        except subprocess.TimeoutExpired:
            _kill(proc)
            raise KernelUnavailable(f"the build took longer than {timeout:g} s and was stopped ({TIMEOUT_ENV} sets "
                                    "the limit)") from None
        except BaseException:  # Ctrl-C: the build and its compilers end with the run
            _kill(proc)
            raise
        _kill(proc)  # compilers left behind by a build process that was killed
    library = attempt / f"{spec.name}.so"
    if code != 0 or not library.is_file():
        raise KernelUnavailable(_failure(code, output))
    return library


def _kill(proc: subprocess.Popen[bytes]) -> None:
    """End the build process and every process of its session."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # the build process and the compilers it started
    except OSError:
        pass
    proc.wait()


def _failure(code: int, output: Path) -> str:
    """The build's failure in one line: the signal that ended it, or the first error line of its output."""
    if code < 0:
        return f"the build was stopped by signal {-code} ({signal.Signals(-code).name})"
    try:
        lines = [line.strip() for line in output.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        lines = []
    told = [line.removeprefix(FAILURE).strip() for line in lines if line.startswith(FAILURE)]
    errors = [line for line in lines if "error" in line.lower()]
    why = (told or errors or lines or [f"exit status {code}"])[0]
    return f"the build failed: {why[:300]}; its output is in {output}"


def _place(built: Path, library: Path) -> None:
    """Move the complete library into place, then record its checksum; its build folder goes."""
    digest = _digest(built)
    os.replace(built, library)  # a new file: a process that has the old one mapped keeps it intact
    _stage("moved")
    record = library.with_name(library.name + RECORD_SUFFIX)
    fd, tmp = tempfile.mkstemp(prefix=f".{record.name}.", dir=library.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(f"{digest}  {library.name}\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, record)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    shutil.rmtree(built.parent, ignore_errors=True)
