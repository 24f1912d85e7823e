"""The kept-entries kernel's build cannot hurt a run (issue 46; kvroute.engine.kept_build).

Most cases build a stand-in: a tiny C extension module compiled once per module (``cc``, under a second) and copied
into place by a fake build process through the builder seam (``kept_build._builder_command``), so that what they
check (the lock, the timeout, the checksum, the folder's owner and mode, kills at each step) costs no compile. The
stand-in records where it came from (``origin``), and the planted one runs a constructor that leaves a mark: a loaded
foreign library cannot go unnoticed. Cases that run the build in a process of its own (kills, a read-only mount,
a failing compiler) run a small wrapper (``WRAPPER``) that sets the seam there.

The real compile (about 35 s of CPU, a minute or more on two busy cores) is in the one ``slow`` case: a real build
killed with -9 at several points, then ``kvroute run`` on a head-size-64 tiny model, whose records equal those of a
run with the kernel off.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import pytest

from kvroute.engine import kept_build
from kvroute.engine.attention import kept
from kvroute.engine.kept_build import KernelSpec, KernelUnavailable, obtain
from kvroute.filelock import FileLock

NAME = kept._build_name(kept._cpu_flags())  # the real module name: the wrapper runs the real build command
STAND_IN = r"""
#include <Python.h>
#include <stdio.h>
#include <stdlib.h>
#ifdef PLANTED
__attribute__((constructor)) static void planted(void) {
    const char *mark = getenv("KVROUTE_TEST_PLANTED_MARK");
    if (mark) { FILE *f = fopen(mark, "a"); if (f) { fputs("constructor ran\n", f); fclose(f); } }
}
#endif
static struct PyModuleDef def = {PyModuleDef_HEAD_INIT, "NAME", NULL, -1, NULL};
PyMODINIT_FUNC PyInit_NAME(void) {
    PyObject *m = PyModule_Create(&def);
    if (m) PyModule_AddStringConstant(m, "origin", ORIGIN);
    return m;
}
"""
#: the fake build process: write its pid, wait, copy the stand-in where the build's library goes
FAKE_BUILDER = """
import os, shutil, sys, time
template, target, delay, pids = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
if pids:
    with open(pids, "a") as f:
        f.write(f"{os.getpid()}\\n")
time.sleep(delay)
shutil.copy(template, target)
"""
#: `kvroute kernel build` in a process of its own, then what a run loads (kept.kernel()), with the fake build
#: (``fake``: the stand-in's path) and a pause at a stage
WRAPPER = """
import json, logging, sys, time
logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
a = json.loads(sys.argv[1])
from kvroute.engine import kept_build
from kvroute.engine.attention import kept
kept.ENABLED = True
kept._avx512 = lambda: True
if a.get("fake"):
    kept._can_build = lambda have_ninja: None
    kept_build._builder_command = lambda spec, attempt: [sys.executable, "-c", a["builder"], a["fake"],
                                                         str(attempt / (spec.name + ".so")), str(a.get("delay", 0)),
                                                         a.get("pids", "")]
def stage(name):
    print("stage", name, flush=True)
    if name == a.get("pause"):
        time.sleep(600)
kept_build._stage = stage
from kvroute.cli import main
try:
    main(["kernel", "build"])
except SystemExit as e:
    print("exit", e.code, flush=True)
module = kept.kernel()  # what a run then loads (never builds)
print("module", None if module is None else getattr(module, "origin", "real"), flush=True)
"""


def _compile(c: str, name: str, out: Path, origin: str, *defines: str) -> Path:
    src = out.with_suffix(".c")
    src.write_text(c.replace("NAME", name))
    subprocess.run(["cc", "-shared", "-fPIC", "-O0", f"-I{sysconfig.get_paths()['include']}",
                    f'-DORIGIN="{origin}"', *defines, str(src), "-o", str(out)], check=True)
    return out


@pytest.fixture(scope="module")
def stand_ins(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The stand-in library as the build makes it and as planted (a constructor that leaves a mark), both under the
    kernel's real name."""
    if shutil.which("cc") is None:
        pytest.skip("no C compiler for the stand-in library")
    d = tmp_path_factory.mktemp("stand-ins")
    return {"build": _compile(STAND_IN, NAME, d / "build.so", "build"),
            "planted": _compile(STAND_IN, NAME, d / "planted.so", "planted", "-DPLANTED")}


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh $KVROUTE_HOME; its kernels folder is ``home / "kernels"``."""
    monkeypatch.setenv("KVROUTE_HOME", str(tmp_path / "home"))
    monkeypatch.delenv(kept_build.TIMEOUT_ENV, raising=False)
    return tmp_path / "home"


@pytest.fixture
def fake_build(stand_ins, monkeypatch):
    """In this process: builds copy the stand-in (after ``delay`` seconds); the pids of the build processes."""
    state = {"delay": 0.0, "pids": None, "calls": 0}

    def command(spec, attempt):
        state["calls"] += 1
        return [sys.executable, "-c", FAKE_BUILDER, str(stand_ins["build"]), str(attempt / f"{spec.name}.so"),
                str(state["delay"]), str(state["pids"] or "")]

    monkeypatch.setattr(kept_build, "_builder_command", command)
    return state


def _obtain(folder: Path, *, timeout: float = 60.0, announced: list | None = None):
    spec = KernelSpec(NAME, (str(kept.SOURCE),))
    return obtain(spec, folder, timeout=timeout, can_build=lambda: None,
                  announce=lambda: announced.append(1) if announced is not None else None)


def _wrapper(args: dict, env: dict | None = None, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", WRAPPER, json.dumps({"builder": FAKE_BUILDER, **args})],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **(env or {})}, **kw)


def _finish(proc: subprocess.Popen, timeout: float = 60) -> tuple[str, str]:
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err
    return out, err


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (our own unreaped child) is not alive
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def _gone(pid: int, within: float = 10.0) -> bool:
    end = time.monotonic() + within
    while time.monotonic() < end:
        if not _alive(pid):
            return True
        time.sleep(0.05)
    return False


#: how `kvroute kernel build`'s one error line ends
FALLBACK = "PyTorch's kernels run instead"


def _building_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("kvroute: building the kept-entries")]


def _verified(folder: Path) -> bool:
    so = folder / f"{NAME}.so"
    record = folder / f"{NAME}.so.sha256"
    return so.is_file() and record.is_file() and record.read_text().split()[0] == kept_build._digest(so)


# the lock -------------------------------------------------------------------------------------------------------
def test_a_lock_left_by_a_dead_process_is_no_obstacle(home, fake_build):
    """A lock file naming a pid that no longer exists (the file stays when its holder is killed): the build goes on
    at once."""
    folder = home / "kernels"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    folder.mkdir(parents=True, mode=0o700)
    (folder / f"{NAME}.lock").write_text(json.dumps({"pid": int(dead.stdout), "host": socket.gethostname(),
                                                     "started": "2026-01-01T00:00:00+00:00"}))
    announced: list = []
    start = time.monotonic()
    module = _obtain(folder, timeout=5, announced=announced)
    assert module.origin == "build" and announced == [1] and fake_build["calls"] == 1
    assert time.monotonic() - start < 5 and _verified(folder)


def test_a_lock_still_held_after_its_holder_died_is_broken(home, fake_build):
    """The recorded holder died but a child it forked kept the descriptor (the flock is still held): the lock is
    broken and the build proceeds; with the holder alive the same wait times out (the mutation)."""
    folder = home / "kernels"
    folder.mkdir(parents=True, mode=0o700)
    code = ("import os, sys, time; from kvroute.filelock import FileLock; lock = FileLock(sys.argv[1]); "
            "assert lock.acquire(); pid = os.fork()\n"
            "if pid == 0:\n"
            "    null = os.open(os.devnull, os.O_RDWR); os.dup2(null, 1); os.dup2(null, 2); time.sleep(120)\n"
            "print(pid, flush=True); os._exit(0)")
    orphan = int(subprocess.run([sys.executable, "-c", code, str(folder / f"{NAME}.lock")], capture_output=True,
                                text=True, check=True).stdout)
    try:
        assert not FileLock(folder / f"{NAME}.lock").acquire()  # still held, by the orphan
        module = _obtain(folder, timeout=10)
        assert module.origin == "build" and _verified(folder)
    finally:
        os.kill(orphan, signal.SIGKILL)


def test_a_live_holder_past_the_timeout_stops_the_build_in_one_line(home, fake_build, monkeypatch):
    folder = home / "kernels"
    folder.mkdir(parents=True, mode=0o700)
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from kvroute.filelock import FileLock; "
                               "assert FileLock(sys.argv[1]).acquire(); print('held', flush=True); time.sleep(120)",
                               str(folder / f"{NAME}.lock")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        monkeypatch.setenv(kept_build.TIMEOUT_ENV, "1.5")
        monkeypatch.setattr(kept, "ENABLED", True)
        monkeypatch.setattr(kept, "_avx512", lambda: True)
        monkeypatch.setattr(kept, "_can_build", lambda have_ninja: None)
        start = time.monotonic()
        with pytest.raises(KernelUnavailable) as failed:
            kept.build_kernel()
        assert 1.5 <= time.monotonic() - start < 10
    finally:
        holder.kill()
        holder.wait()
    line = str(failed.value)
    assert "\n" not in line and f"another process (pid {holder.pid} on " in line and "within 1.5 s" in line
    assert kept_build.TIMEOUT_ENV in line and fake_build["calls"] == 0


def test_a_build_past_the_timeout_is_stopped_with_its_processes(home, fake_build, tmp_path):
    fake_build.update(delay=60, pids=tmp_path / "pids")
    start = time.monotonic()
    with pytest.raises(KernelUnavailable, match=r"^the build took longer than 2 s and was stopped \(KVROUTE_KERNEL"):
        _obtain(home / "kernels", timeout=2)
    assert time.monotonic() - start < 10
    (pid,) = map(int, (tmp_path / "pids").read_text().split())
    assert _gone(pid, within=2)
    assert not (home / "kernels" / f"{NAME}.so").exists()
    assert FileLock(home / "kernels" / f"{NAME}.lock").acquire()  # released


@pytest.mark.parametrize("raw", ["", "0", "-3", "soon", "nan", "inf"])
def test_the_timeout_setting_falls_back_to_the_default(raw, monkeypatch, caplog):
    monkeypatch.setenv(kept_build.TIMEOUT_ENV, raw)
    assert kept_build.build_timeout() == kept_build.DEFAULT_TIMEOUT
    assert bool(caplog.records) == bool(raw)
    monkeypatch.setenv(kept_build.TIMEOUT_ENV, "12.5")
    assert kept_build.build_timeout() == 12.5


# the checksum, the folder ---------------------------------------------------------------------------------------
def _plant(folder: Path, library: Path, record: str | None) -> None:
    folder.mkdir(parents=True, mode=0o700, exist_ok=True)
    shutil.copy(library, folder / f"{NAME}.so")
    if record is not None:
        (folder / f"{NAME}.so.sha256").write_text(record)


@pytest.mark.parametrize("case", ["no record", "another digest", "open folder", "writable by others"])
def test_a_planted_library_is_never_loaded(case, home, fake_build, stand_ins, tmp_path, monkeypatch):
    """A foreign library in the kernels folder, whose constructor would leave a mark: without a record of ours, with
    another digest, or with its own digest but in a folder (or a file) others could write to. It is rebuilt; its
    constructor never runs."""
    folder = home / "kernels"
    mark = tmp_path / "mark"
    monkeypatch.setenv("KVROUTE_TEST_PLANTED_MARK", str(mark))
    own = f"{kept_build._digest(stand_ins['planted'])}  {NAME}.so\n"
    record = {"no record": None, "another digest": f"{'0' * 64}  {NAME}.so\n"}.get(case, own)
    _plant(folder, stand_ins["planted"], record)
    if case == "open folder":
        os.chmod(folder, 0o777)
    if case == "writable by others":
        os.chmod(folder / f"{NAME}.so", 0o666)
    announced: list = []
    module = _obtain(folder, announced=announced)
    assert module.origin == "build" and announced == [1] and not mark.exists()
    assert _verified(folder) and (folder.stat().st_mode & 0o777) == 0o700


def test_the_planted_library_would_run_its_constructor(stand_ins, tmp_path, monkeypatch):
    """The mutation for the case above: loaded, the planted library leaves its mark."""
    mark = tmp_path / "mark"
    code = ("import importlib.util, sys; s = importlib.util.spec_from_file_location(sys.argv[1], sys.argv[2]); "
            "m = importlib.util.module_from_spec(s); s.loader.exec_module(m); print(m.origin)")
    out = subprocess.run([sys.executable, "-c", code, NAME, str(stand_ins["planted"])], capture_output=True, text=True,
                         env={**os.environ, "KVROUTE_TEST_PLANTED_MARK": str(mark)}, check=True).stdout
    assert out.strip() == "planted" and mark.read_text() == "constructor ran\n"


def test_a_folder_of_another_user_is_refused(home, fake_build, stand_ins):
    folder = home / "kernels"
    _plant(folder, stand_ins["build"], f"{kept_build._digest(stand_ins['build'])}  {NAME}.so\n")
    if os.geteuid() != 0:
        pytest.skip("giving the folder to another user needs root")
    os.chown(folder, 65534, 65534)
    with pytest.raises(KernelUnavailable, match="belongs to another user"):
        _obtain(folder)
    assert fake_build["calls"] == 0


def test_a_truncated_library_is_rebuilt_not_loaded(home, fake_build, stand_ins, tmp_path):
    """A library cut short after its build (a full disk, a copy interrupted): in a process of its own, which must not
    crash (PyTorch's cache gave a bus error here), the library is rebuilt and the rebuilt one loaded."""
    folder = home / "kernels"
    _plant(folder, stand_ins["build"], f"{kept_build._digest(stand_ins['build'])}  {NAME}.so\n")
    so = folder / f"{NAME}.so"
    os.truncate(so, so.stat().st_size // 2)
    out, err = _finish(_wrapper({"fake": str(stand_ins["build"])}, env={"KVROUTE_HOME": str(home)}))
    assert "module build" in out and len(_building_lines(err)) == 1, err
    assert _verified(folder)


def test_the_building_line_only_when_a_build_starts(home, stand_ins, tmp_path):
    """With PyTorch's cache settings set (they once made the line print on every run): the first run builds and says
    so once, the next loads and says nothing."""
    env = {"KVROUTE_HOME": str(home), "TORCH_EXTENSIONS_DIR": str(tmp_path / "torch-ext"),
           "XDG_CACHE_HOME": str(tmp_path / "xdg")}
    runs = [_finish(_wrapper({"fake": str(stand_ins["build"])}, env=env)) for _ in range(2)]
    assert [len(_building_lines(err)) for _, err in runs] == [1, 0]
    assert all("module build" in out for out, _ in runs)
    assert [err for _, err in runs][1] == ""
    assert "stage compiling" in runs[0][0] and "stage" not in runs[1][0]


READ_ONLY = r"""
mount --bind "$DIR" "$DIR" && mount -o remount,bind,ro "$DIR" || exit 99
exec "$PY" -c "$WRAPPER" "$ARGS"
"""


def _read_only_run(folder: Path, args: dict, env: dict) -> tuple[int, str, str]:
    """The wrapper with ``folder`` read-only: a read-only bind mount in a mount namespace (as root, whom modes do not
    stop), else mode 0500."""
    full = {**os.environ, **env}
    payload = json.dumps({"builder": FAKE_BUILDER, **args})
    if os.geteuid() == 0:
        proc = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", READ_ONLY], capture_output=True,
                              text=True, timeout=60, env={**full, "DIR": str(folder), "PY": sys.executable,
                                                          "WRAPPER": WRAPPER, "ARGS": payload})
        if proc.returncode == 99 or proc.stderr.startswith("unshare:"):
            pytest.skip("no read-only bind mount here (a mount namespace needs CAP_SYS_ADMIN)")
    else:
        os.chmod(folder, 0o500)
        try:
            proc = subprocess.run([sys.executable, "-c", WRAPPER, payload], capture_output=True, text=True,
                                  timeout=60, env=full)
        finally:
            os.chmod(folder, 0o700)
    return proc.returncode, proc.stdout, proc.stderr


def test_a_complete_build_in_a_read_only_folder_is_used(home, fake_build, stand_ins):
    folder = home / "kernels"
    _obtain(folder)
    before = sorted(p.name for p in folder.iterdir())
    code, out, err = _read_only_run(folder, {"fake": "/no/build/may/run"}, {"KVROUTE_HOME": str(home)})
    assert code == 0 and "module build" in out and err == "", err
    assert sorted(p.name for p in folder.iterdir()) == before


def test_a_read_only_folder_without_a_build_falls_back_in_one_line(home, stand_ins):
    folder = home / "kernels"
    folder.mkdir(parents=True, mode=0o700)
    code, out, err = _read_only_run(folder, {"fake": str(stand_ins["build"])}, {"KVROUTE_HOME": str(home)})
    assert code == 0 and "exit 1" in out and "module None" in out, err
    (line,) = err.splitlines()
    assert f"cannot build in {folder}" in line and line.endswith(FALLBACK)


# no compiler: one line, no banner -------------------------------------------------------------------------------
@pytest.mark.parametrize("compiler", ["kvroute-no-such-compiler", "false"])
def test_without_a_working_compiler_one_line_and_no_banner(compiler, home, tmp_path):
    """No compiler at all: one line naming it, no build started. A compiler that fails (``false``): PyTorch's build
    runs in its own process and its multi-line warning banner goes to the build's log; the run prints one line."""
    proc = subprocess.run([sys.executable, "-c", WRAPPER, json.dumps({})], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "KVROUTE_HOME": str(home), "CXX": compiler})
    assert proc.returncode == 0 and "exit 1" in proc.stdout and "module None" in proc.stdout, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert lines and lines[-1].startswith("error: the kept-entries attention kernel cannot be built here: ")
    assert lines[-1].endswith(FALLBACK)
    assert "!!" not in proc.stderr and "Traceback" not in proc.stderr
    if shutil.which("ninja") or _has_ninja():
        if compiler == "false":
            assert len(lines) == 2 and _building_lines(proc.stderr) == [lines[0]]
            assert "the build failed: CalledProcessError: " in lines[-1]
        else:
            assert lines == [lines[-1]] and f"no C++ compiler ({compiler}) was found" in lines[-1]


def _has_ninja() -> bool:
    try:
        import ninja  # noqa: F401
    except ImportError:
        return False
    return True


# kills ----------------------------------------------------------------------------------------------------------
def _wait_for(proc: subprocess.Popen, line: str, timeout: int = 60) -> None:
    """Read ``proc``'s output up to ``line``; an AssertionError after ``timeout`` seconds (a read that blocks too)."""
    def expire(*_: object) -> None:
        raise AssertionError(f"no {line!r} within {timeout} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(timeout)
    try:
        for got in proc.stdout:
            if got.strip() == line:
                return
        raise AssertionError(f"ended before {line!r}: {proc.stderr.read()}")
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def _pid_from(path: Path, timeout: float = 30) -> int:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if path.exists() and path.read_text().strip():
            return int(path.read_text().split()[0])
        time.sleep(0.05)
    raise AssertionError(f"no pid in {path}")


def test_a_build_killed_at_each_point_leaves_nothing_that_hurts_the_next_run(home, stand_ins, tmp_path):
    """kill -9 of the run at each step of a build, one after another on one kernels folder (or of the build process
    itself): each next run gets past the lock at once, never loads a half-made library and builds anew, saying so
    once; after a kill once the library is recorded (``placed``), the next run loads it without building."""
    env = {"KVROUTE_HOME": str(home)}
    folder = home / "kernels"
    for point in ("locked", "run killed while compiling", "build killed", "compiled", "moved", "placed"):
        pids = tmp_path / f"pids-{len(list(tmp_path.iterdir()))}"
        args = {"fake": str(stand_ins["build"]), "pids": str(pids)}
        if point in ("run killed while compiling", "build killed"):
            args["delay"] = 60
        else:
            args["pause"] = point
        start = time.monotonic()
        proc = _wrapper(args, env=env)
        try:
            if point in ("run killed while compiling", "build killed"):
                builder = _pid_from(pids)
                os.kill(proc.pid if point.startswith("run") else builder, signal.SIGKILL)
                assert _gone(builder), point  # the build dies with its run (PR_SET_PDEATHSIG)
            else:
                _wait_for(proc, f"stage {point}")
                proc.kill()
            out, err = proc.communicate(timeout=30)
        finally:
            proc.kill()
            proc.wait()
        assert time.monotonic() - start < 30, point
        assert len(_building_lines(err)) == (point != "locked"), (point, err)
        if point == "build killed":  # the run itself goes on with PyTorch's kernels, and says why
            assert "module None" in out and "stopped by signal 9 (SIGKILL)" in err, err
        if point == "moved":  # the library in place, its record not yet written: the next run must not load it
            assert (folder / f"{NAME}.so").exists() and not (folder / f"{NAME}.so.sha256").exists()
    out, err = _finish(_wrapper({"fake": str(stand_ins["build"])}, env=env))
    assert "module build" in out and _building_lines(err) == [] and "stage" not in out
    assert _verified(folder) and not list(folder.glob(f"{kept_build.ATTEMPT_PREFIX}*"))


# the real build ---------------------------------------------------------------------------------------------------
def _comparable(path: Path) -> list[dict]:
    """The records without their timings."""
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith("seconds_")} for r in rows]


#: fields stored in half precision, where float32 rounding can flip the last of their 11 bits
HALF = {"probe_features"}


def _close(a, b, tol: float = 1e-4) -> bool:
    """Equal, floats to float32 rounding (the kernel sums in its own order: tests/unit/test_kept.py)."""
    if isinstance(a, float) and isinstance(b, float):
        return a == b or abs(a - b) <= tol * max(1.0, abs(a), abs(b))
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_close(x, y, tol) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_close(a[k], b[k], 2e-3 if k in HALF else tol) for k in a)
    return a == b


@pytest.mark.slow
def test_a_real_build_killed_at_several_points_then_runs_match_without_the_kernel(tmp_path):
    """The real compile killed with -9 at three points (the build paused holding the lock; the build command 3 s into
    the compile; the compiling process itself 3 s in). Then ``kvroute run`` on a head-size-64 tiny model never builds
    (the kernel is opt-in): its records equal, bit for bit, those of a run with the kernel off
    (KVROUTE_KEPT_KERNEL=0). ``kvroute kernel build`` then builds it, once, saying so, and a run with it gives records
    equal, bit for bit, to a run on a fresh home built without kills, and to the kernel-off run, answers exactly and
    floats to float32 rounding."""
    import torch

    from kvroute.models import save_tiny_model
    from kvroute.tasks import TaskSpec, generate_tasks

    if not kept.kept_applies(torch.device("cpu"), torch.float32, 64):
        pytest.skip("the kernel does not apply here (no AVX-512 or KVROUTE_KEPT_KERNEL=0)")
    if shutil.which(os.environ.get("CXX") or "c++") is None or not _has_ninja():
        pytest.skip("no C++ compiler or ninja: no real build here")
    home = tmp_path / "home"
    env = {"KVROUTE_HOME": str(home)}
    proc = _wrapper({"pause": "locked"}, env=env)
    _wait_for(proc, "stage locked")
    proc.kill()
    proc.wait()
    for victim in ("run", "build"):
        proc = _wrapper({}, env=env)
        _wait_for(proc, "stage compiling", timeout=120)
        time.sleep(3)
        builders = [p for p in Path("/proc").iterdir() if p.name.isdigit() and _ppid(p) == proc.pid]
        assert builders, "no build process"
        os.kill(proc.pid if victim == "run" else int(builders[0].name), signal.SIGKILL)
        out, err = proc.communicate(timeout=60)
        assert all(_gone(int(b.name)) for b in builders)
        if victim == "build":
            assert "module None" in out and "stopped by signal 9" in err, err
    model = save_tiny_model(tmp_path / "tiny64", "llama", seed=0, hidden=256, heads=4, kv_heads=2)  # head size 64
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps(t.to_dict()) + "\n" for t in generate_tasks(TaskSpec("base", n=2, seed=0))))

    def cli(*args: str, where: Path, kernel: str = "1") -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "KVROUTE_HOME": str(where), "KVROUTE_KEPT_KERNEL": kernel}
        done = subprocess.run([sys.executable, "-m", "kvroute.cli", *args], capture_output=True, text=True,
                              timeout=600, env=env)
        assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
        return done

    records = {}

    def run(name: str, where: Path, kernel: str = "1") -> None:
        out = tmp_path / f"records-{name}.jsonl"
        done = cli("run", "--model", str(model), "--tasks", str(tasks), "--press", "knorm", "--press", "snapkv",
                   "--ratio", "0", "--ratio", "0.5", "--ratio", "0.9", "--max-new-tokens", "4", "--out", str(out),
                   where=where, kernel=kernel)
        assert _building_lines(done.stderr) == [], done.stderr  # a run never builds
        records[name] = _comparable(out)

    run("unbuilt", home)  # after the kills: nothing usable built, and the run does not build
    assert not _verified(home / "kernels")
    run("0", home, kernel="0")
    for where in (home, tmp_path / "fresh-home"):
        assert len(_building_lines(cli("kernel", "build", where=where).stderr)) == 1
    run("1", home)
    run("fresh", tmp_path / "fresh-home")
    assert _verified(home / "kernels") and _verified(tmp_path / "fresh-home" / "kernels")
    assert len(records["1"]) == 12 and all(r["status"] == "ok" for r in records["1"])
    # the kernel built after the kills is the kernel a clean machine builds: the same records, bit for bit; an
    # unbuilt kernel is the kernel switched off
    assert records["1"] == records["fresh"] and records["unbuilt"] == records["0"]
    assert [r["answer"] for r in records["1"]] == [r["answer"] for r in records["0"]]
    differ = [(i, k) for i, (a, b) in enumerate(zip(records["1"], records["0"], strict=True))
              for k in a if not _close({k: a[k]}, {k: b.get(k)})]
    assert differ == [] and records["1"][0].keys() == records["0"][0].keys()


def _ppid(proc: Path) -> int:
    try:
        return int((proc / "stat").read_text().split(")")[-1].split()[1])
    except (OSError, IndexError, ValueError):
        return -1
