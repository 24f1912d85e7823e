"""``RUN_DIR/manifest.json``: what a run was (resolved config, versions, git hash, device) and when.

The manifest is rewritten atomically (temp file + fsync + rename, :func:`kvroute.files.atomic_write`) at the start
and the end of every session, so it is always valid JSON. A resumed run keeps its first ``started`` time and appends
one entry per session to ``sessions`` (backend, times, cells computed, how it ended, and ``arithmetic``: the CPU
model, PyTorch's thread count and the GPUs, on which the last bits of the records depend; a session whose arithmetic
differs from an earlier one's that computed cells logs a warning), and, for a local session, ``attention_backends``
(the layer forwards each masked-attention backend computed, :mod:`kvroute.engine.attention`) and ``heap`` (whether
the forwards reused freed memory in place, :mod:`kvroute.heap`).

A session killed with SIGKILL cannot record how it ended and stays ``"running"``; since one sweep at
a time holds the run's lock, :func:`mark_stale` shows such a session as ``"interrupted"`` (with
``"stale": true``) when nothing holds the lock: at the next resume (written) and in reports (in memory).
"""

from __future__ import annotations

import json
import logging
import os
import platform
import subprocess
import sys
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

from kvroute import __version__
from kvroute.cpuinfo import cpu_field
from kvroute.files import write_text

log = logging.getLogger(__name__)

MANIFEST_NAME = "manifest.json"
MANIFEST_VERSION = 1
PACKAGES = ("torch", "transformers", "kvpress", "numpy", "tokenizers", "accelerate", "safetensors", "ray")


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def package_versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {"python": platform.python_version(), "kvroute": __version__}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def git_info(path: Path | None = None) -> dict[str, Any] | None:
    """Commit and dirty flag of the checkout kvroute runs from (None when it is not a git checkout)."""
    where = path or Path(__file__).resolve().parent
    try:
        commit = subprocess.run(["git", "-C", str(where), "rev-parse", "HEAD"], capture_output=True, text=True,
                                timeout=5, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(where), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10, check=True).stdout.strip() != ""
    except (OSError, subprocess.SubprocessError):
        return None
    return {"commit": commit, "dirty": dirty}


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo on Linux), else what ``platform`` says."""
    return cpu_field("model name") or platform.processor() or platform.machine()


def device_info() -> dict[str, Any]:
    import torch

    cuda = torch.cuda.is_available()
    return {
        "platform": platform.platform(), "machine": platform.machine(), "cpu": cpu_model(),
        "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(), "cuda": cuda,
        "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if cuda else [],
    }


#: what a session's arithmetic depends on besides the code and the versions: PyTorch's CPU matrix products sum in an
#: order set by the CPU and the number of threads, so records computed under another one can differ in the last bits,
#: and a keep mask's selection at a near-tie can keep another entry (the demo at 1 and 2 threads: 3 of 3,648 cells)
ARITHMETIC_KEYS = ("cpu", "torch_threads", "gpus")


def _arithmetic(device: dict[str, Any]) -> dict[str, Any]:
    return {k: device.get(k) for k in ARITHMETIC_KEYS}


def read_manifest(run_dir: str | Path) -> dict[str, Any] | None:
    f = Path(run_dir) / MANIFEST_NAME
    if not f.is_file():
        return None
    try:
        data = json.loads(f.read_text(encoding="utf-8-sig"))
    except (json.JSONDecodeError, RecursionError):
        return None  # a torn file cannot happen with atomic writes; a hand-edited one is replaced
    return data if isinstance(data, dict) else None


def write_manifest(run_dir: str | Path, data: dict[str, Any]) -> Path:
    f = Path(run_dir) / MANIFEST_NAME
    write_text(f, json.dumps(data, indent=2, ensure_ascii=False, default=str) + "\n")  # temp + fsync + rename
    return f


STALE_NOTE = "the process ended without recording how (killed?); the finished cells are in the store"


def lock_is_free(run_dir: str | Path) -> bool:
    """Whether no sweep holds ``run_dir``'s lock now (no lock file: none ever did)."""
    import fcntl

    from kvroute.sweep.lock import LOCK_NAME

    path = Path(run_dir) / LOCK_NAME
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return False
    finally:
        os.close(fd)  # drops the shared lock at once
    return True


def mark_stale(manifest: dict[str, Any], run_dir: str | Path | None = None, *, dead: bool = False) -> int:
    """Mark sessions left ``"running"`` by a killed sweep as ``"interrupted"`` (``stale``); returns how many.

    ``dead=True`` (the caller holds the run's lock, so no other sweep runs) marks every running
    session; otherwise only when :func:`lock_is_free` says no sweep holds ``run_dir``.
    """
    sessions = manifest.get("sessions")
    running = [s for s in sessions if isinstance(s, dict) and s.get("status") == "running"] \
        if isinstance(sessions, list) else []
    top = manifest.get("status") == "running"
    if not (running or top) or not (dead or (run_dir is not None and lock_is_free(run_dir))):
        return 0
    for s in running:
        s.update(status="interrupted", stale=True, note=STALE_NOTE)
    if top:
        manifest["status"] = "interrupted"
    return len(running) or int(top)


def start_session(run_dir: str | Path, *, config: dict[str, Any], backend: str, grid: dict[str, Any],
                  task_files: list[str], extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """Write the manifest for a session that is starting; returns it (pass it to :func:`finish_session`)."""
    old = read_manifest(run_dir) or {}
    mark_stale(old, dead=True)  # the caller holds the lock: an earlier "running" session was killed
    sessions = list(old.get("sessions", []))
    device = device_info()
    here = _arithmetic(device)
    earlier = [s.get("arithmetic") for s in sessions  # the sessions that computed cells (or may have: killed ones)
               if isinstance(s, dict) and (s.get("cells_computed") or s.get("status") != "complete")]
    if any(e and e != here for e in earlier):
        changed = sorted({k for e in earlier if e for k in ARITHMETIC_KEYS if e.get(k) != here[k]})
        log.warning("%s: this session runs with %s, earlier sessions computed cells with %s; records of the two can "
                    "differ in the last float bits, and a keep mask at a near-tie can select another entry",
                    run_dir, ", ".join(f"{k}={here[k]}" for k in changed),
                    "; ".join(sorted({", ".join(f"{k}={e.get(k)}" for k in changed) for e in earlier if e})))
    sessions.append({"started": now(), "finished": None, "backend": backend, "status": "running",
                     "settings_hash": config.get("settings_hash"), "cells_computed": 0, "pid": os.getpid(),
                     "argv": sys.argv[1:], "arithmetic": here, **(extra or {})})
    data = {
        "kvroute_manifest": MANIFEST_VERSION, "name": config.get("name"), "status": "running",
        "started": old.get("started", sessions[-1]["started"]), "finished": None, "backend": backend,
        "grid": grid, "task_files": task_files, "versions": package_versions(), "git": git_info(),
        "device": device, "config": config, "sessions": sessions,
    }
    write_manifest(run_dir, data)
    return data


def finish_session(run_dir: str | Path, manifest: dict[str, Any], *, status: str, cells_computed: int,
                   seconds: float, error: str | None = None, cells_errored: int = 0,
                   extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """Record how the current session ended (complete | interrupted | failed).

    ``cells_errored``: how many of the cells computed this session were stored with status "error"; ``extra``: more
    of the session's entries (the driver's ``attention_backends``: layer forwards per attention backend, and
    ``heap``).
    """
    t = now()
    manifest["status"] = status
    manifest["finished"] = t
    s = manifest["sessions"][-1]
    s.update(finished=t, status=status, cells_computed=cells_computed, cells_errored=cells_errored,
             seconds=round(seconds, 3), **(extra or {}))
    if error:
        s["error"] = error[:500]
    write_manifest(run_dir, manifest)
    return manifest
