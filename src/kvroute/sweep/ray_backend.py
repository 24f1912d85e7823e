"""The Ray backend: shards of (model, group of instances) on Ray workers; the driver alone writes the store.

Each worker is a Ray actor that keeps one model loaded and runs whole shards through
:func:`~kvroute.sweep.local.run_units` — the same code the local backend runs, so records are
identical. The driver hands an idle worker the next shard of the model it already holds when
there is one (so a worker loads each model once), waits on the shards in flight with
``ray.wait``, and writes each returned unit's records in its own transaction as they arrive.

Workers ask for one GPU each when the cluster has GPUs (as many workers as GPUs), otherwise
``ray.cpus_per_worker`` CPUs each. ``ray`` is imported only here and only when this backend runs
(``pip install 'kvroute[ray]'``). Model folders and task files are read by the driver and
workers alike: on a multi-machine cluster, give zoo names or hub ids, or paths every node has.
"""

from __future__ import annotations

import logging
from collections import OrderedDict, deque
from collections.abc import Sequence
from typing import Any

from kvroute.engine import Engine
from kvroute.errors import KvrouteError, SweepError
from kvroute.settings import RunSettings
from kvroute.sweep.config import ModelSpec, SweepConfig
from kvroute.sweep.grid import WorkUnit, shards
from kvroute.sweep.local import Sink, free_memory, load_engine, run_units

log = logging.getLogger(__name__)


class Worker:
    """The body of a Ray actor: holds one loaded model at a time and runs shards for it."""

    def __init__(self, models: dict[str, ModelSpec], settings: RunSettings, settings_hash: str) -> None:
        self.models, self.settings, self.settings_hash = models, settings, settings_hash
        self.model: str | None = None
        self.engine: Engine | None = None

    def run(self, shard: list[WorkUnit]) -> list[list[dict[str, Any]]]:
        name = shard[0].model
        if name != self.model:
            device = self.engine.lm.device if self.engine is not None else None
            self.engine, self.model = None, None
            free_memory(device)
            self.engine, self.model = load_engine(self.models[name], self.settings), name
        assert self.engine is not None
        return list(run_units(self.engine, shard, self.settings, self.settings_hash))


def _import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise SweepError("the Ray backend needs ray: pip install 'kvroute[ray]' (or use --backend local)") from None
    return ray


def _worker_options(ray: Any, cpus_per_worker: int) -> tuple[dict[str, Any], int]:
    res = ray.cluster_resources()
    gpus, cpus = int(res.get("GPU", 0)), int(res.get("CPU", 1))
    if gpus >= 1:
        return {"num_gpus": 1, "num_cpus": min(cpus_per_worker, max(1, cpus // gpus))}, gpus
    return {"num_cpus": cpus_per_worker}, max(1, cpus // cpus_per_worker)


def run_ray(config: SweepConfig, units: Sequence[WorkUnit], sink: Sink, *, address: str | None = None) -> None:
    """Run ``units`` on Ray (an existing ``ray.init``, ``address``, ``config.ray.address``, or a local Ray)."""
    ray = _import_ray()
    todo = shards(units, config.ray.instances_per_shard)
    if not todo:
        return
    started = not ray.is_initialized()
    if started:
        addr = address or config.ray.address
        log.info("starting Ray (%s)", f"address {addr}" if addr else "a local Ray, or the cluster in RAY_ADDRESS")
        try:
            ray.init(address=addr, logging_level=logging.WARNING)
        except Exception as e:  # ConnectionError, ValueError, RuntimeError from a bad address
            raise SweepError(f"cannot start or reach Ray{f' at {addr}' if addr else ''}: {e}") from None
    actors: list[Any] = []
    try:
        opts, n_workers = _worker_options(ray, config.ray.cpus_per_worker)
        n_workers = min(n_workers, len(todo))
        log.info("%d shards on %d Ray workers (%s each)", len(todo), n_workers, opts)
        remote = ray.remote(max_restarts=0, **opts)(Worker)
        models = {m.name: m for m in config.models}
        actors = [remote.remote(models, config.settings, config.settings_hash) for _ in range(n_workers)]
        _dispatch(ray, actors, todo, sink)
    finally:
        for a in actors:
            ray.kill(a)
        if started:
            ray.shutdown()


def _dispatch(ray: Any, actors: list[Any], todo: list[list[WorkUnit]], sink: Sink) -> None:
    queues: OrderedDict[str, deque[list[WorkUnit]]] = OrderedDict()
    for shard in todo:
        queues.setdefault(shard[0].model, deque()).append(shard)
    holds: list[str | None] = [None] * len(actors)
    idle = list(range(len(actors)))[::-1]
    in_flight: dict[Any, tuple[int, list[WorkUnit]]] = {}

    def next_shard(model: str | None) -> list[WorkUnit]:
        q = queues.get(model) if model is not None else None
        if not q:
            q = next(v for v in queues.values() if v)
        return q.popleft()

    while True:
        while idle and any(queues.values()):
            i = idle.pop()
            shard = next_shard(holds[i])
            holds[i] = shard[0].model
            in_flight[actors[i].run.remote(shard)] = (i, shard)
        if not in_flight:
            return
        done, _ = ray.wait(list(in_flight), num_returns=1)
        i, shard = in_flight.pop(done[0])
        try:
            results = ray.get(done[0])
        except Exception as e:
            cause = getattr(e, "cause", None)
            if isinstance(cause, KvrouteError):
                raise cause from None
            first = shard[0]
            raise SweepError(f"a Ray worker failed on model {first.model}, instances from {first.instance.id}: {e}. "
                             "Finished cells are in the store; fix the cause and rerun with --resume") from None
        for records in results:
            sink(records)
        idle.append(i)
