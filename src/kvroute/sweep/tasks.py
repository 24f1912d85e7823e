"""The task instances of a sweep: read task files, run generator specs, and keep a copy in RUN_DIR.

Generator specs need a tokenizer only when they set ``target_tokens`` (the filler is measured in
the model's own tokens, so each model then gets its own instances); the tokenizer is loaded
without the model. Every task set a run used is written to ``RUN_DIR/tasks/`` under a name
that carries its content hash, so the run can be reproduced from its directory alone.
"""

from __future__ import annotations

import hashlib
import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvroute.errors import ConfigError, KvrouteError
from kvroute.files import write_text
from kvroute.sweep.config import ModelSpec, SweepConfig, TaskSource
from kvroute.tasks import dumps_tasks, generate_tasks, load_tasks

log = logging.getLogger(__name__)

TASKS_DIR = "tasks"


@dataclass(frozen=True)
class TaskSet:
    """The instances one task source gave for one model, and the file name they are kept under."""

    source: int  # index in config.tasks
    filename: str
    instances: tuple[Any, ...]


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_")[-48:] or "model"


def _digest(instances: tuple[Any, ...]) -> str:
    return hashlib.sha256(dumps_tasks(instances).encode()).hexdigest()[:8]


def _load(src: TaskSource, i: int, config: SweepConfig, model: ModelSpec, tokenizers: dict[str, Any]) -> TaskSet:
    key = f"{config.source}: tasks[{i}]"
    if src.file is not None:
        try:
            inst = tuple(load_tasks(src.file)[: src.limit])
        except KvrouteError as e:
            raise ConfigError(f"{key}.file: {e}") from None
        name = f"{_slug(src.file.stem)}-{_digest(inst)}.jsonl"
    else:
        spec = src.spec
        assert spec is not None  # a TaskSource holds a file or a spec
        tok = None
        if spec.target_tokens is not None:
            if model.name not in tokenizers:
                from kvroute.models import load_tokenizer

                log.info("loading the tokenizer of %s to measure target_tokens", model.name)
                tokenizers[model.name] = load_tokenizer(model.source)
            tok = tokenizers[model.name]
        try:
            inst = tuple(generate_tasks(spec, tok))
        except KvrouteError as e:
            raise ConfigError(f"{key}: {e}") from None
        stem = f"{spec.family}-n{spec.n}-s{spec.seed}-d{spec.difficulty}"
        if tok is not None:
            stem += f"-{_slug(model.name)}"
        name = f"{stem}-{_digest(inst)}.jsonl"
    if not inst:
        raise ConfigError(f"{key}: gives no task instances, so the grid would be empty")
    return TaskSet(i, name, inst)


def resolve_tasks(config: SweepConfig) -> tuple[dict[str, list[Any]], list[TaskSet]]:
    """Each model's instances (in config order) and the distinct task sets behind them.

    Raises :class:`ConfigError` when a file is unreadable, a source gives nothing, or two sources
    give the same instance (the same id would be one grid row counted twice).
    """
    tokenizers: dict[str, Any] = {}
    per_model: dict[str, list[Any]] = {}
    sets: dict[str, TaskSet] = {}
    shared: dict[int, TaskSet] = {}  # sources that do not depend on the model are read once
    for model in config.models:
        seen: dict[str, int] = {}
        out: list[Any] = []
        for i, src in enumerate(config.tasks):
            per_tok = src.spec is not None and src.spec.target_tokens is not None
            ts = _load(src, i, config, model, tokenizers) if per_tok else shared.get(i)
            if ts is None:
                ts = shared[i] = _load(src, i, config, model, tokenizers)
            sets.setdefault(ts.filename, ts)
            for inst in ts.instances:
                if inst.id in seen:
                    raise ConfigError(f"{config.source}: tasks[{i}] repeats instance {inst.id!r} already given by "
                                      f"tasks[{seen[inst.id]}]; list each task set once")
                seen[inst.id] = i
                out.append(inst)
        per_model[model.name] = out
    return per_model, list(sets.values())


def check_resumed_instances(run_dir: Path, config: SweepConfig, sets: list[TaskSet]) -> None:
    """Refuse to resume ``run_dir`` when an instance keeps its id but not its content.

    A cell's store key holds the instance id, not its content, so an instance edited in a hand-written
    task file (context, question, answers …) under the same id would pass as computed: the store's records
    are for the old text. The run keeps every task set it used in ``RUN_DIR/tasks/``; an id found there
    with other content raises :class:`ConfigError` naming the instance, the field and the fix.
    """
    folder = Path(run_dir) / TASKS_DIR
    if not folder.is_dir():
        return
    new = {inst.id: (inst, ts) for ts in sets for inst in ts.instances}
    for snap in sorted(folder.glob("*.jsonl")):
        if snap.name in {ts.filename for ts in sets}:
            continue  # the same bytes as a set of this plan (its name holds their hash)
        try:
            old = load_tasks(snap)
        except KvrouteError as e:
            log.warning("cannot read the run's task copy %s to compare instances (%s)", snap, e)
            continue
        for o in old:
            if o.id not in new:
                continue
            inst, ts = new[o.id]
            if inst.content_id() == o.content_id():
                continue
            a, b = o.to_dict(), inst.to_dict()
            field = next((k for k in a if k not in ("id", "meta", "seed", "version") and a[k] != b[k]), "content")
            src = config.tasks[ts.source]
            where = f"{src.file}" if src.file is not None else f"tasks[{ts.source}]"
            raise ConfigError(f"{where}: instance {inst.id!r} has another {field} than when {run_dir} computed it "
                              f"({TASKS_DIR}/{snap.name}); its stored results are for the old content. Give the "
                              f"edited instance a new id (or drop its id to get a content hash), restore the old "
                              f"content, or choose another --out")


def write_task_sets(run_dir: Path, sets: list[TaskSet]) -> list[str]:
    """Write each task set to ``RUN_DIR/tasks/`` (unchanged files are left alone); returns the relative paths."""
    folder = Path(run_dir) / TASKS_DIR
    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for ts in sets:
        path = folder / ts.filename
        text = dumps_tasks(ts.instances)
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            write_text(path, text)
        out.append(f"{TASKS_DIR}/{ts.filename}")
    return out
