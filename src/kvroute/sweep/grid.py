"""Grid expansion: a config and its task instances → work units of cells, each cell with its store key.

A **work unit** is one (model, instance, regime, seed): one prefill and every (press, ratio) cell
decoded against it, exactly one :func:`~kvroute.runner.run_instance` call, written to the store
in one transaction. With ``decoding.history`` set, a unit is one conversation (the instances that
share a context, :mod:`kvroute.tasks.conversation`): one prefill, its questions asked in turn
(:func:`~kvroute.runner.run_conversation`), one key per (turn, cell). A cell's **key** is a
content hash of what determines its record:

    sha256(canonical JSON [model, dtype, instance_id, press, ratio, regime, seed, settings_hash])[:32]

with the press in its canonical form (``snapkv`` and ``snapkv+per_head`` are one press) and the
instance id being the task content's own hash. The ratio-0 baseline is one cell per unit, press
``"none"`` (the analysis attaches it to every press's curve).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Container, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from kvroute.engine.cell import NO_PRESS, Cell
from kvroute.presses import build_press
from kvroute.sweep.config import ModelSpec, SweepConfig
from kvroute.tasks.conversation import conversations

if TYPE_CHECKING:
    from kvroute.tasks.instance import TaskInstance

KEY_LENGTH = 32  # hex characters of sha256 kept (128 bits)


def model_id(model: ModelSpec) -> str:
    """The model's part of a cell key: its config name and requested dtype (device never changes the maths)."""
    return f"{model.name}|{model.dtype or 'auto'}"


def cell_key(model: str, instance_id: str, press: str, ratio: float, regime: str, seed: int, settings: str,
             restore: str = "") -> str:
    """Content hash of one cell (``model`` from :func:`model_id`, ``press`` canonical; a restore condition, in its
    canonical form, joins the hashed list only when there is one, so cells without keep their keys)."""
    fields: list[object] = [model, instance_id, press, float(ratio), regime, seed, settings]
    if restore:
        fields.append(restore)
    text = json.dumps(fields, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()[:KEY_LENGTH]


@dataclass(frozen=True)
class WorkUnit:
    """One prefill's worth of cells: (model, instance, regime, seed) × cells, with one key per cell."""

    model: str  # ModelSpec.name
    instance: TaskInstance
    regime: str
    seed: int
    cells: tuple[Cell, ...]
    keys: tuple[str, ...]  # one per cell; with ``turns``, one per (turn, cell), turn by turn
    #: a conversation's later instances, asked in turn after ``instance`` on its one prefill (settings.history)
    turns: tuple[TaskInstance, ...] = ()

    @property
    def instances(self) -> tuple[TaskInstance, ...]:
        """The unit's instances: its one, or a conversation's in turn order."""
        return (self.instance, *self.turns)

    def __len__(self) -> int:
        return len(self.keys)


def grid_cells(config: SweepConfig) -> list[tuple[Cell, str]]:
    """Every (press, ratio[, restore]) cell of one unit with its canonical press name: the baseline first, then
    presses × ratios, each compressed cell followed by its restored cells (one per restore condition)."""
    out: list[tuple[Cell, str]] = []
    if any(r == 0 for r in config.ratios):
        out.append((Cell(NO_PRESS, 0.0), NO_PRESS))
    for p in config.presses:
        canon = build_press(p).name
        for r in config.ratios:
            if r > 0:
                out.append((Cell(p, r), canon))
                out.extend((Cell(p, r, restore), canon) for restore in config.restore)
    return out


def expand(config: SweepConfig, tasks: Mapping[str, Sequence[Any]]) -> list[WorkUnit]:
    """All work units, ordered model → seed → regime → instance (``tasks`` maps model name → instances)."""
    cells = grid_cells(config)
    sh = config.settings_hash
    units: list[WorkUnit] = []
    for m in config.models:
        mid = model_id(m)
        # with a history setting, a conversation (instances sharing a context) is one unit: one prefill, turns in order
        groups = conversations(tasks[m.name]) if config.settings.history else [[i] for i in tasks[m.name]]
        for seed in config.seeds:
            for regime in config.regimes:
                for group in groups:
                    keys = tuple(cell_key(mid, inst.id, canon, c.ratio, regime, seed, sh, c.restore)
                                 for inst in group for c, canon in cells)
                    units.append(WorkUnit(m.name, group[0], regime, seed, tuple(c for c, _ in cells), keys,
                                          tuple(group[1:])))
    return units


def pending(units: Sequence[WorkUnit], done: Container[str]) -> list[WorkUnit]:
    """The units with their cells already in ``done`` removed (units left with no cell are dropped)."""
    out = []
    for u in units:
        n = len(u.cells)
        # a conversation's cell is redone in every turn when any of its turns is missing (a later turn needs the
        # earlier answers); the store keeps the records it already has (INSERT OR IGNORE)
        keep = [i for i in range(n) if any(u.keys[t * n + i] not in done for t in range(len(u.instances)))]
        if len(keep) == n:
            out.append(u)
        elif keep:
            keys = tuple(u.keys[t * n + i] for t in range(len(u.instances)) for i in keep)
            out.append(replace(u, cells=tuple(u.cells[i] for i in keep), keys=keys))
    return out


def count_cells(units: Sequence[WorkUnit]) -> int:
    return sum(len(u.keys) for u in units)


def shards(units: Sequence[WorkUnit], instances_per_shard: int) -> list[list[WorkUnit]]:
    """Group units by model, then into runs of ``instances_per_shard`` instances (all their regimes and seeds).

    A shard is what one Ray worker runs at once; shards of the same model come one after another,
    so a worker that keeps taking them loads its model only once.
    """
    by_model: dict[str, dict[str, list[WorkUnit]]] = {}
    for u in units:
        by_model.setdefault(u.model, {}).setdefault(u.instance.id, []).append(u)
    out: list[list[WorkUnit]] = []
    for per_instance in by_model.values():
        groups = list(per_instance.values())
        for i in range(0, len(groups), instances_per_shard):
            out.append([u for g in groups[i:i + instances_per_shard] for u in g])
    return out
