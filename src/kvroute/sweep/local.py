"""Running work units: the shared per-unit step, and the local (in-process) backend.

:func:`run_units` is the one place a work unit becomes records — the local backend and every Ray
worker call it — so both backends give identical records. Per model the local backend loads the
model once, builds one :class:`~kvroute.engine.Engine`, and for each unit runs one prefill and
all the unit's cells (``run_instance``), handing the unit's records to ``sink`` (the driver writes
them in one transaction).
"""

from __future__ import annotations

import gc
import logging
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from kvroute.engine import Engine
from kvroute.errors import ConfigError, InsufficientMemoryError, KvrouteError, SweepError
from kvroute.records import KEY_FIELDS
from kvroute.runner import check_memory, run_conversation, run_instance
from kvroute.settings import RunSettings
from kvroute.sweep.config import ModelSpec, SweepConfig
from kvroute.sweep.grid import WorkUnit

log = logging.getLogger(__name__)

Sink = Callable[[list[dict[str, Any]]], None]


def check_devices(config: SweepConfig) -> None:
    """Refuse, before the store is opened, a model whose config ``device`` this machine lacks.

    The message names the config's key: ``sweep`` has no ``--device`` option (the models' devices are
    the config's), so the loader's own hint would point at an option that does not exist here.
    """
    from kvroute.models.loading import resolve_device

    for i, m in enumerate(config.models):
        if m.device is None:
            continue
        try:
            resolve_device(m.device)
        except ConfigError as e:
            reason = str(e).split("; use --device")[0]
            raise ConfigError(f"{config.source}: models[{i}].device ({m.name}): {reason}; set device = \"cpu\" in "
                              "that model's table, or leave device out to choose automatically") from None


def load_engine(model: ModelSpec, settings: RunSettings) -> Engine:
    from kvroute.models import load_model

    log.info("loading model %s", model.name)
    lm = load_model(model.source, device=model.device, dtype=model.dtype)
    return Engine(lm, settings.decode_settings(), retrieval_heads=model.retrieval_heads)


def free_memory(device: Any) -> None:
    """Return a dropped model's memory (call after the last reference to its engine is gone)."""
    gc.collect()
    if getattr(device, "type", None) == "cuda":
        import torch

        torch.cuda.empty_cache()


def finish_records(unit: WorkUnit, records: list[dict[str, Any]], settings_hash: str) -> list[dict[str, Any]]:
    """Attach each record's ``key`` and ``settings``; key fields first, in :mod:`kvroute.records` order."""
    if len(records) != len(unit.keys):
        raise SweepError(f"instance {unit.instance.id}: the runner returned {len(records)} records for "
                         f"{len(unit.keys)} cells")
    out = []
    for key, cell, rec in zip(unit.keys, unit.cells * len(unit.instances), records, strict=True):
        same = (rec.get("press"), rec.get("ratio"), rec.get("restore") or "") == (cell.press, cell.ratio, cell.restore)
        if not same:
            raise SweepError(f"instance {unit.instance.id}: record for {rec.get('press')}@{rec.get('ratio')} "
                             f"(restore {rec.get('restore')}) came back where {cell.press}@{cell.ratio} (restore "
                             f"{cell.restore or None}) was expected")
        rec = {**rec, "settings": settings_hash}
        head = {"key": key, **{k: rec.pop(k, None) for k in KEY_FIELDS}}
        out.append({**head, **rec})
    return out


def run_units(engine: Engine, units: Sequence[WorkUnit], settings: RunSettings,
              settings_hash: str) -> Iterator[list[dict[str, Any]]]:
    """One ``run_instance`` per unit (one prefill, all its cells); yields each unit's finished records.

    First, before any unit runs, the largest unit is checked against the free memory (``check_memory``): a grid
    that would not fit stops here with the size it needs, not after hours of smaller instances."""
    try:
        check_memory(engine, [(u.instance, u.regime, len(u.cells)) for u in units], settings)
    except InsufficientMemoryError as e:
        raise SweepError(f"model {units[0].model}: {e}") from e
    for u in units:
        try:
            if u.turns:
                recs = [r for turn in run_conversation(engine, u.instances, list(u.cells), regime=u.regime,
                                                       seed=u.seed, settings=settings, model_name=u.model)
                        for r in turn]
            else:
                recs = run_instance(engine, u.instance, list(u.cells), regime=u.regime, seed=u.seed,
                                    settings=settings, model_name=u.model)
        except KvrouteError as e:
            raise SweepError(f"model {u.model}, instance {u.instance.id} ({u.regime}, seed {u.seed}): {e}") from e
        yield finish_records(u, recs, settings_hash)


def run_local(config: SweepConfig, units: Sequence[WorkUnit], sink: Sink) -> None:
    """Run ``units`` in this process, model by model (each model loaded once)."""
    by_model: dict[str, list[WorkUnit]] = {}
    for u in units:
        by_model.setdefault(u.model, []).append(u)
    specs = {m.name: m for m in config.models}
    for name, munits in by_model.items():
        engine = load_engine(specs[name], config.settings)
        device = engine.lm.device
        try:
            for records in run_units(engine, munits, config.settings, config.settings_hash):
                sink(records)
        finally:
            del engine  # the last reference: the model's memory can go before the next model loads
            free_memory(device)
