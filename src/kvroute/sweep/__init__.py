"""Sweeps: a config's grid of cells, run locally or on Ray, kept in a crash-safe, resumable store.

>>> from kvroute.sweep import load_sweep_config, run_sweep          # doctest: +SKIP
>>> outcome = run_sweep(load_sweep_config("sweep.toml"), "runs/a", resume=True)  # doctest: +SKIP

Modules: ``config`` (the validated config), ``tasks`` (task sets into RUN_DIR), ``grid`` (units,
cell keys, shards), ``store`` (SQLite), ``lock``, ``manifest``, ``local`` and ``ray_backend``
(backends), ``driver`` (run_sweep), ``export``. Names are imported lazily, so reading a store
(``kvroute.sweep.store``) does not import torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "SweepConfig": "config", "load_sweep_config": "config", "sweep_config_from_mapping": "config",
    "Store": "store", "read_records": "store", "STORE_NAME": "store",
    "run_sweep": "driver", "plan_sweep": "driver", "SweepOutcome": "driver", "BACKENDS": "driver",
    "export_records": "export", "FORMATS": "export",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"kvroute.sweep.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'kvroute.sweep' has no attribute {name!r}")
