"""The sweep driver: plan the grid, lock and open the store, run the missing cells, record the run.

Order of events, so that bad input fails before anything expensive or lasting happens:

1. the config was validated when it was loaded (names, ratios, files, keys);
2. task instances are read/generated (a tokenizer is loaded only for ``target_tokens`` specs) and
   the grid is expanded — an empty grid fails here, before any model loads;
3. the run directory is locked (a second sweep on it fails with ``StoreLockedError``) and the
   store opened; a store that already holds records needs ``resume=True``;
4. the manifest is written, and only the cells whose keys are not in the store are run, by the
   chosen backend; the driver writes each unit's records in one transaction as it finishes. A
   cell that errored (``status="error"``: e.g. oracle on an item without evidence) is stored like
   a finished one, so a resume does not recompute it (``retry_errors=True`` deletes those first);
5. the manifest records how the session ended.
"""

from __future__ import annotations

import logging
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvroute.errors import ConfigError, StoreError, UnknownNameError
from kvroute.progress import SILENT, Progress
from kvroute.sweep.config import SweepConfig
from kvroute.sweep.grid import count_cells, expand, pending
from kvroute.sweep.manifest import finish_session, read_manifest, start_session
from kvroute.sweep.store import Store, check_integrity
from kvroute.sweep.tasks import check_resumed_instances, resolve_tasks, write_task_sets

log = logging.getLogger(__name__)

BACKENDS = ("local", "ray")


@dataclass
class Plan:
    """What a sweep would do: its units, sizes, and task sets (no model loaded, nothing written)."""

    config: SweepConfig
    units: list[Any]
    task_sets: list[Any]
    instances: dict[str, int]

    @property
    def cells(self) -> int:
        return count_cells(self.units)

    def describe(self) -> dict[str, Any]:
        c = self.config
        per_unit = len(self.units[0].cells) if self.units else 0
        asked = sum(len(u.instances) for u in self.units)
        return {"cells": self.cells, "units": len(self.units), "cells_per_unit": per_unit,
                "questions_per_unit": asked / len(self.units) if self.units else 1.0,
                "models": [m.name for m in c.models], "instances": self.instances, "presses": list(c.presses),
                "ratios": list(c.ratios), "restore": list(c.restore), "regimes": list(c.regimes),
                "seeds": list(c.seeds),
                "retrieval_heads": ({m.name: len(m.retrieval_heads or ()) for m in c.models}
                                    if c.retrieval_heads is not None else None)}


@dataclass
class SweepOutcome:
    run_dir: Path
    total_cells: int
    already_done: int
    computed: int
    seconds: float
    summary: list[dict[str, Any]] = field(default_factory=list)
    errored: int = 0  # cells computed this session that errored (status "error")
    errors: list[dict[str, Any]] = field(default_factory=list)  # the store's errored cells per (model, press, error)


def plan_sweep(config: SweepConfig) -> Plan:
    """Read/generate the task instances and expand the grid (raises ``ConfigError`` on an empty grid)."""
    tasks, sets = resolve_tasks(config)
    units = expand(config, tasks)
    if not units or not count_cells(units):
        raise ConfigError(f"{config.source}: the grid is empty (models × tasks × presses/ratios × regimes × seeds "
                          "gives no cells)")
    return Plan(config, units, sets, {k: len(v) for k, v in tasks.items()})


def size_sweep(config: SweepConfig) -> dict[str, Any]:
    """What :meth:`Plan.describe` says, sized without generating a task (``kvroute sweep --dry-run``).

    A task file is read (its instances are checked); a generator spec counts ``n`` instances without
    running, so a dry run of a grid with long padded contexts writes and builds nothing. Raises
    :class:`ConfigError` on an empty grid, as :func:`plan_sweep` does.
    """
    from kvroute.errors import KvrouteError
    from kvroute.sweep.grid import grid_cells
    from kvroute.tasks import load_tasks
    from kvroute.tasks.conversation import conversations

    history = config.settings.history  # with one, a unit is a conversation: one prefill, its questions in turn
    per_source: list[tuple[int, int]] = []  # (instances, units)
    for i, src in enumerate(config.tasks):
        if src.file is not None:
            try:
                insts = load_tasks(src.file)[: src.limit]
            except KvrouteError as e:
                raise ConfigError(f"{config.source}: tasks[{i}].file: {e}") from None
            per_source.append((len(insts), len(conversations(insts)) if history else len(insts)))
        else:
            assert src.spec is not None  # a TaskSource holds a file or a spec
            n = src.spec.n * src.spec.questions
            per_source.append((n, src.spec.n if history else n))
    instances = {m.name: sum(n for n, _ in per_source) for m in config.models}
    per_unit = len(grid_cells(config))
    repeat = len(config.seeds) * len(config.regimes)
    units = sum(u for _, u in per_source) * len(config.models) * repeat
    if not units or not per_unit:
        raise ConfigError(f"{config.source}: the grid is empty (models × tasks × presses/ratios × regimes × seeds "
                          "gives no cells)")
    c = config
    cells = sum(instances.values()) * repeat * per_unit
    return {"cells": cells, "units": units, "cells_per_unit": per_unit,
            "questions_per_unit": sum(instances.values()) * repeat / units,
            "models": [m.name for m in c.models], "instances": instances, "presses": list(c.presses),
            "ratios": list(c.ratios), "restore": list(c.restore), "regimes": list(c.regimes),
            "seeds": list(c.seeds),
            "retrieval_heads": ({m.name: len(m.retrieval_heads or ()) for m in c.models}
                                if c.retrieval_heads is not None else None)}


def _flat(d: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(d, dict):
        return {prefix: d}
    out: dict[str, Any] = {}
    for k, v in d.items():
        out.update(_flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
    return out


#: the manifest's config keys that feed the settings hash (kvroute.sweep.config.settings_hash)
SETTINGS_KEYS = ("decoding", "metrics", "metric_settings")


def attention_ran() -> dict[str, int]:
    """Layer forwards per attention backend in this process so far ({} before the engine was imported)."""
    mod = sys.modules.get("kvroute.engine.attention.backend")
    return dict(mod.ran()) if mod is not None else {}


def attention_since(before: dict[str, int]) -> dict[str, int]:
    """The layer forwards per attention backend since ``before`` (an earlier :func:`attention_ran`)."""
    now = attention_ran()
    return {n: now[n] - before.get(n, 0) for n in sorted(now) if now[n] > before.get(n, 0)}


def heap_mode() -> str | None:
    """How this process's forwards treated freed memory (kvroute.heap; None before the engine was imported)."""
    mod = sys.modules.get("kvroute.heap")
    return mod.describe() if mod is not None else None


#: decoding settings that change how a record is computed, not its values
NO_RECORD_CHANGE = ("decoding.batch_size", "decoding.attention_memory", "decoding.draft", "decoding.gather",
                    "decoding.attention_backend")


def settings_diff(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """``key: old → new`` for every result-changing setting that differs between two resolved configs."""
    a = _flat({k: old.get(k) for k in SETTINGS_KEYS})
    b = _flat({k: new.get(k) for k in SETTINGS_KEYS})
    out = []
    for k in sorted(set(a) | set(b)):
        if k in NO_RECORD_CHANGE:
            continue
        va, vb = a.get(k), b.get(k)
        if isinstance(va, list) and isinstance(vb, list) and k == "metrics":
            va, vb = sorted(va), sorted(vb)
        if va != vb:
            out.append(f"{k}: {a.get(k)!r} → {b.get(k)!r}")
    return out


def check_resume_settings(run_dir: str | Path, config: SweepConfig, *, new_settings: bool = False) -> None:
    """Refuse to resume ``run_dir`` with settings that change results (the store would mix two runs).

    The settings hash of every earlier session is in the manifest; a hash seen before is fine. A new
    one raises :class:`~kvroute.errors.ConfigError` naming the keys that differ, unless
    ``new_settings`` (``--new-settings``) asks to add the new setting explicitly.
    """
    manifest = read_manifest(run_dir)
    if not manifest:
        return
    seen = {s.get("settings_hash") for s in manifest.get("sessions", []) if s.get("settings_hash")}
    old_config = manifest.get("config") or {}
    if old_config.get("settings_hash"):
        seen.add(old_config["settings_hash"])
    if not seen or config.settings_hash in seen or new_settings:
        if new_settings and seen and config.settings_hash not in seen:
            log.warning("adding settings %s to %s next to %s; reports pool all settings unless filtered by the "
                        "'settings' column", config.settings_hash, run_dir, ", ".join(sorted(seen)))
        return
    diff = settings_diff(old_config, config.to_dict())
    if not diff:
        old_v = (manifest.get("versions") or {}).get("kvroute")
        from kvroute import __version__

        diff = [f"kvroute version: {old_v!r} → {__version__!r}"]
    raise ConfigError(f"{run_dir} was run with other settings; resuming would mix two runs in one store. Differs: "
                      f"{'; '.join(diff)}. Resume with the original settings, choose another --out, or pass "
                      "--new-settings to add these settings to the run on purpose")


def check_backend(backend: str) -> None:
    """Raise :class:`~kvroute.errors.UnknownNameError` (closest matches named) unless ``backend`` is in
    :data:`BACKENDS`."""
    if backend not in BACKENDS:
        raise UnknownNameError("backend", backend, BACKENDS,
                               "(ray needs pip install 'kvroute[ray]' and a cluster or a local ray.init())")


def run_sweep(config: SweepConfig, run_dir: str | Path, *, backend: str = "local", resume: bool = False,
              ray_address: str | None = None, progress: Progress = SILENT, retry_errors: bool = False,
              new_settings: bool = False) -> SweepOutcome:
    """Run ``config`` into ``run_dir``; with ``resume`` only the cells missing from its store are computed.

    Errored cells count as done; ``retry_errors`` (with ``resume``) deletes them so they are computed again.
    A resume with settings that change results is refused unless ``new_settings``
    (:func:`check_resume_settings`); a damaged store is refused (``PRAGMA quick_check``).
    """
    check_backend(backend)
    if backend == "ray":
        from kvroute.sweep.ray_backend import _import_ray

        _import_ray()  # fail now, not after the plan, when ray is missing
    if backend == "local":  # a device this machine lacks fails now, naming the config's key, before any write
        from kvroute.sweep.local import check_devices

        check_devices(config)
    plan = plan_sweep(config)
    run_dir = Path(run_dir)
    t0 = time.perf_counter()
    if resume:  # before the store is opened for writing: a refused resume changes no byte of the run
        check_integrity(run_dir)  # a damaged store must not pass as complete
        check_resume_settings(run_dir, config, new_settings=new_settings)
        check_resumed_instances(run_dir, config, plan.task_sets)
    with Store.open(run_dir) as store:
        done = store.keys()
        if done and not resume:
            raise StoreError(f"{run_dir} already holds {len(done)} records from an earlier sweep; pass --resume to "
                             "compute only the missing cells, or choose another --out")
        if retry_errors and store.delete_errors():
            done = store.keys()
        todo = pending(plan.units, done)
        total, remaining = plan.cells, count_cells(todo)
        log.info("%d cells in the grid, %d already in the store, %d to compute", total, total - remaining, remaining)
        files = write_task_sets(run_dir, plan.task_sets)
        manifest = start_session(run_dir, config=config.to_dict(), backend=backend, grid=plan.describe(),
                                 task_files=files, extra={"ray_address": ray_address} if backend == "ray" else None)
        computed = errored = 0
        status, error = "failed", None
        attention_before = attention_ran()
        try:
            with progress.task(f"sweep {config.name}: {total} cells", total=total) as bar:
                bar.update(completed=total - remaining)

                def sink(records: list[dict[str, Any]]) -> None:
                    nonlocal computed, errored
                    store.write(records)
                    computed += len(records)
                    errored += sum(r.get("status") == "error" for r in records)
                    bar.advance(len(records))

                if backend == "local":
                    from kvroute.sweep.local import run_local

                    run_local(config, todo, sink)
                else:
                    from kvroute.sweep.ray_backend import run_ray

                    run_ray(config, todo, sink, address=ray_address)
            status = "complete"
        except KeyboardInterrupt:
            status = "interrupted"
            raise
        except BaseException as e:
            error = f"{type(e).__name__}: {e}"
            raise
        finally:
            try:
                # the attention backends this session's forwards ran (kvroute.engine.attention), like the thread
                # count: in this process only, so a Ray session records none
                ran = attention_since(attention_before) if backend == "local" else None
                finish_session(run_dir, manifest, status=status, cells_computed=computed,
                               seconds=time.perf_counter() - t0, error=error, cells_errored=errored,
                               extra={"attention_backends": ran, "heap": heap_mode() if backend == "local" else None})
            except OSError as e:
                if status == "complete":
                    raise
                # the session's own error (a full disk in the store, Ctrl-C) is the one to report; the manifest
                # keeps "running", which the next resume or report shows as interrupted (mark_stale)
                log.info("could not record the end of the session in the manifest: %s", e)
        summary = store.summary(config.settings_hash)
        errors = store.errors(config.settings_hash)
    return SweepOutcome(run_dir, total, total - remaining, computed, time.perf_counter() - t0, summary,
                        errored, errors)
