"""Restoration maps: where in the network a failing cell needs its answer back.

For one compressed cell (an instance, a press at a ratio) the map restores the target entries (``answer``,
``evidence`` or a ``span:FIRST-LAST`` of context positions; kvroute.presses.restore) in one (layer, KV head)
slot at a time — ``answer@slots:3.1`` — and measures what each single slot repairs. It is activation patching
(TransformerLens ``get_act_patch_*``, pyvene) asked of a compressed cache instead of a corrupted run: the
"clean" run is the full cache, the "corrupted" one the press's mask, and a slot's patch is the target's KV
entries kept again in that slot only.

Effect, in TransformerLens's convention on a continuous metric: the gold answer's teacher-forced
log-probability ``gold_logprob`` (metric ``utilization``), normalised per map so that 0 is the compressed
cell and 1 the full cache::

    effect(l, h) = (lp(restore in slot l.h) − lp(compressed)) / (lp(full) − lp(compressed))

(NaN when the full cache and the compressed cell give the same log-probability: nothing to repair). Beside
it the discrete repair: the slot's cell answers correctly (``outcome == "correct"``).

The **minimal repairing set** is greedy by effect: slots in decreasing effect (ties by layer, then head)
are added until the restored cell repairs; each candidate set is one more cell (``answer@slots:…``), so the
set is verified by the cell that repaired. Sets are tried in doubling chunks (4, 8, 16 … prefixes per
decode), every prefix from the first on, so the set found is the shortest prefix that repairs. None when even
every slot at once (the whole target) does not repair.

Every map also runs its controls as cells: the compressed cell, the full cache, the whole target
(``answer``), every slot at once (``answer@slots:0.0,…``, which must give the whole target's answer) and no
slot (``answer@slots:none``, which must give the compressed cell's answer). A map of SmolLM2-135M (30 layers
× 3 KV heads) is 90 + 5 cells and one prefill, decoded in the engine's batches; the minimal set adds a prefill
per chunk.

Resumable: with ``store`` (the CLI uses ``RUN_DIR/restore_map/``) every cell's record is written to a store
of the run's kind, keyed as sweep cells are (kvroute.sweep.grid.cell_key, the restore condition included),
and a rerun computes only the cells missing from it. The map's own store keeps these cells out of the run's
restoration tables. The records hold everything the map is computed from (:func:`map_from_records`), so the
report rebuilds every map from the store alone.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvroute.engine.cell import NO_PRESS, Cell
from kvroute.errors import ConfigError, EngineError, KvrouteError
from kvroute.presses.restore import Restore, Slot
from kvroute.progress import SILENT, Progress
from kvroute.settings import RunSettings

if TYPE_CHECKING:
    import pandas as pd
    import torch

    from kvroute.engine.engine import Engine
    from kvroute.tasks.instance import TaskInstance

log = logging.getLogger(__name__)

#: what a map's cells compute: the gold log-probability and the answer's outcome, nothing else
MAP_METRICS = ("utilization",)
#: the map store's folder inside a run directory
MAP_DIR = "restore_map"
#: the map's targets (``span:FIRST-LAST`` too)
MAP_TARGETS = ("answer", "evidence")
FIRST_CHUNK = 4  # minimal-set prefixes decoded together at first; doubled each time none repairs
SAME_LOGPROB = 1e-3  # two cells with equal masks agree on the gold log-probability to this (batched float noise)


def slot_condition(target: str, slots: Iterable[Slot]) -> str:
    """The canonical restore condition of ``target`` in ``slots`` (``answer@slots:3.1,4.0``; none: ``@slots:none``)."""
    base = Restore.parse(target)
    if base.layers is not None or base.heads is not None or base.slots is not None:
        raise ConfigError(f"restore map target {target!r}: name the target alone (answer, evidence or "
                          "span:FIRST-LAST); the map chooses the slots")
    if base.target not in (*MAP_TARGETS, "span"):
        raise ConfigError(f"restore map target {target!r}: choose answer, evidence or span:FIRST-LAST")
    return str(Restore(base.target, slots=tuple(sorted(set(slots))), span=base.span))


def all_slots(L: int, Hkv: int) -> list[Slot]:
    return [(layer, h) for layer in range(L) for h in range(Hkv)]


@dataclass
class RestoreMap:
    """One failing cell's map. ``effect [L, Hkv]`` and ``frame`` (one row per slot in ``effect``'s flattened order,
    columns layer, kv_head, effect, repaired, gold_logprob, outcome, answer) are TransformerLens's
    ``get_act_patch_*`` pair: ``effect, frame = m.effect, m.frame``."""

    instance_id: str
    press: str
    ratio: float
    target: str
    effect: torch.Tensor  # [L, Hkv] float: 0 = the compressed cell, 1 = the full cache
    repaired: torch.Tensor  # [L, Hkv] bool: the slot's cell answers correctly
    frame: pd.DataFrame
    compressed: dict[str, Any]  # the control cells' records
    full: dict[str, Any]
    whole: dict[str, Any]  # the whole target (every layer and KV head)
    every_slot: dict[str, Any]
    no_slot: dict[str, Any]
    order: list[Slot]  # slots in greedy order (decreasing effect)
    minimal: list[Slot] | None  # the minimal repairing set; [] when the compressed cell is correct
    minimal_record: dict[str, Any] | None  # the cell that verified it
    model: str = ""
    computed: int = 0  # cells computed by this call (0: all were in the store)
    seconds: float = 0.0
    checks: dict[str, bool] = field(default_factory=dict)

    @property
    def failure(self) -> bool:
        """The full cache answers correctly and the compressed cell does not (a failure compression caused)."""
        return self.full.get("outcome") == "correct" and self.compressed.get("outcome") != "correct"

    def to_dict(self) -> dict[str, Any]:
        def rec(r: Mapping[str, Any] | None) -> dict[str, Any] | None:
            return None if r is None else {k: r.get(k) for k in ("restore", "answer", "outcome", "gold_logprob")}

        return {"instance_id": self.instance_id, "press": self.press, "ratio": self.ratio, "target": self.target,
                "shape": list(self.effect.shape), "effect": [[_num(x) for x in row] for row in self.effect.tolist()],
                "repaired": self.repaired.tolist(), "failure": self.failure,
                "compressed": rec(self.compressed), "full": rec(self.full), "whole_target": rec(self.whole),
                "every_slot": rec(self.every_slot), "no_slot": rec(self.no_slot),
                "minimal": None if self.minimal is None else [list(s) for s in self.minimal],
                "minimal_cell": rec(self.minimal_record), "checks": self.checks, "cells_computed": self.computed,
                "seconds": self.seconds}


def _num(x: float) -> float | None:
    return None if math.isnan(x) else x


def normalised(lp: float | None, lp_comp: float | None, lp_full: float | None) -> float:
    """(lp − compressed) / (full − compressed); NaN when a value is missing or full == compressed."""
    if lp is None or lp_comp is None or lp_full is None or abs(lp_full - lp_comp) < 1e-9:
        return math.nan
    return (lp - lp_comp) / (lp_full - lp_comp)


def greedy_order(effect: torch.Tensor) -> list[Slot]:
    """Slots by decreasing effect (NaN last), ties by (layer, KV head)."""
    L, Hkv = effect.shape
    vals = {(a, b): float(effect[a, b]) for a in range(L) for b in range(Hkv)}
    return sorted(vals, key=lambda s: (math.isnan(vals[s]), -vals[s] if not math.isnan(vals[s]) else 0.0, s))


def map_from_records(records: Iterable[Mapping[str, Any]], target: str = "answer") -> RestoreMap:
    """The map of one (instance, press, ratio) from its cells' records (those :func:`restore_map` computes; the
    minimal set is the shortest greedy prefix whose cell repaired, among the prefix cells present)."""
    import pandas as pd
    import torch

    by: dict[str, dict[str, Any]] = {}
    for r in records:
        if r.get("status", "ok") != "ok":
            continue
        by[NO_PRESS if r.get("press") == NO_PRESS else (r.get("restore") or "")] = dict(r)
    if "" not in by or NO_PRESS not in by:
        raise EngineError("a restore map needs its compressed cell and the full cache among the records")
    comp, full = by[""], by[NO_PRESS]
    t = Restore.parse(target)
    singles: dict[Slot, dict[str, Any]] = {}
    multi: dict[tuple[Slot, ...], dict[str, Any]] = {}
    for cond, r in by.items():
        if cond in ("", NO_PRESS):
            continue
        c = Restore.parse(cond)
        if c.slots is None or (c.target, c.span) != (t.target, t.span):
            continue
        if len(c.slots) == 1:
            singles[c.slots[0]] = r
        multi[c.slots] = r
    if not singles:
        raise EngineError(f"no single-slot {target} cells among the records")
    L = 1 + max(a for a, _ in singles)
    Hkv = 1 + max(b for _, b in singles)
    lp_c, lp_f = comp.get("gold_logprob"), full.get("gold_logprob")
    effect = torch.full((L, Hkv), math.nan)
    repaired = torch.zeros(L, Hkv, dtype=torch.bool)
    rows = []
    for (a, b) in all_slots(L, Hkv):
        if (a, b) not in singles:
            raise EngineError(f"the map's cell for slot {a}.{b} is missing (or errored) among the records")
        r = singles[(a, b)]
        effect[a, b] = normalised(r.get("gold_logprob"), lp_c, lp_f)
        repaired[a, b] = r.get("outcome") == "correct"
        rows.append({"layer": a, "kv_head": b, "effect": float(effect[a, b]), "repaired": bool(repaired[a, b]),
                     "gold_logprob": r.get("gold_logprob"), "outcome": r.get("outcome"), "answer": r.get("answer")})
    frame = pd.DataFrame(rows)
    order = greedy_order(effect)
    every = multi.get(tuple(all_slots(L, Hkv)), {})
    minimal, minimal_rec = _minimal(order, multi, comp, every)
    whole, no_slot = by.get(str(t), {}), multi.get((), {})
    m = RestoreMap(comp.get("instance_id", ""), comp.get("press", ""), float(comp.get("ratio", 0.0)), target,
                   effect, repaired, frame, comp, full, whole, every, no_slot, order, minimal, minimal_rec,
                   model=str(comp.get("model", "")))
    m.checks = _checks(m)
    return m


def _minimal(order: Sequence[Slot], multi: Mapping[tuple[Slot, ...], Mapping[str, Any]], comp: Mapping[str, Any],
             every: Mapping[str, Any]) -> tuple[list[Slot] | None, dict[str, Any] | None]:
    """The shortest greedy prefix whose cell repaired, read only over prefixes that were all decoded from the first
    on (a prefix missing before any repair: not searched that far yet, None)."""
    if comp.get("outcome") == "correct":
        return [], dict(comp)
    if every.get("outcome") != "correct":
        return None, None
    for k in range(1, len(order) + 1):
        r = multi.get(tuple(sorted(order[:k])))
        if r is None:
            return None, None
        if r.get("outcome") == "correct":
            return sorted(order[:k]), dict(r)
    return None, None


def _same(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    la, lb = a.get("gold_logprob"), b.get("gold_logprob")
    same_lp = (la is None and lb is None) or (la is not None and lb is not None and abs(la - lb) <= SAME_LOGPROB)
    return bool(a) and bool(b) and a.get("answer") == b.get("answer") and same_lp


def _checks(m: RestoreMap) -> dict[str, bool]:
    """The map's controls: every slot at once is the whole target; no slot is the compressed cell."""
    out = {}
    if m.every_slot and m.whole:
        out["every_slot_is_whole_target"] = _same(m.every_slot, m.whole)
    if m.no_slot:
        out["no_slot_is_compressed"] = _same(m.no_slot, m.compressed)
    return out


def restore_map(engine: Engine, instance: TaskInstance, press: str, ratio: float, *, target: str = "answer",
                regime: str = "agnostic", seed: int = 0, settings: RunSettings | None = None,
                store: str | Path | None = None, model_key: str | None = None, minimal: bool = True,
                progress: Progress = SILENT) -> RestoreMap:
    """The restoration map of ``instance`` under ``press`` at ``ratio`` (see the module doc).

    ``settings``: the run's settings (answer prefix, system prompt, max new tokens); its metrics are replaced by
    :data:`MAP_METRICS`. ``store``: a run-store folder the cells are read from and written to (resumable);
    ``model_key``: the model's part of the cell keys (``kvroute.sweep.grid.model_id``; default ``NAME|auto``).
    """
    import dataclasses

    from kvroute.presses import build_press

    if ratio <= 0 or press == NO_PRESS:
        raise ConfigError("a restore map needs a compressed cell: a press at a ratio above 0")
    s = dataclasses.replace(settings or RunSettings(), metrics=MAP_METRICS)
    engine.validate([Cell(press, ratio)])
    L, Hkv = engine.lm.info.num_layers, engine.lm.info.num_kv_heads
    t0 = time.perf_counter()
    cells = [Cell(NO_PRESS, 0.0), Cell(press, ratio), Cell(press, ratio, str(Restore.parse(target))),
             Cell(press, ratio, slot_condition(target, [])),
             Cell(press, ratio, slot_condition(target, all_slots(L, Hkv))),
             *(Cell(press, ratio, slot_condition(target, [sl])) for sl in all_slots(L, Hkv))]
    runner = _Runner(engine, instance, build_press(press).name, regime=regime, seed=seed, settings=s, store=store,
                     model_key=model_key or f"{engine.lm.name}|auto")
    with progress.task(f"restore map {instance.id[:10]} {press}@{ratio:g}: {len(cells)} cells",
                       total=len(cells)) as bar:
        records = runner.run(cells)
        bar.advance(len(cells))
    m = map_from_records(records, target)
    if minimal and m.minimal is None and m.every_slot.get("outcome") == "correct":
        k, size = 1, FIRST_CHUNK  # the prefix of one slot is that slot's own cell, already in the map
        with progress.task(f"minimal repairing set of {instance.id[:10]}", total=len(m.order)) as bar:
            while k < len(m.order):
                chunk = [Cell(press, ratio, slot_condition(target, m.order[:j]))
                         for j in range(k + 1, min(k + size, len(m.order)) + 1)]
                records += runner.run(chunk)
                bar.advance(len(chunk))
                k, size = k + len(chunk), size * 2
                m = map_from_records(records, target)
                if m.minimal is not None:
                    break
    m.computed, m.seconds = runner.computed, time.perf_counter() - t0
    failed = [name for name, ok in m.checks.items() if not ok]
    if failed:
        log.warning("restore map of %s %s@%g: control(s) failed: %s", instance.id, press, ratio, ", ".join(failed))
    return m


class _Runner:
    """Runs cells of one instance (one prefill per call), reading and writing a store when there is one."""

    def __init__(self, engine: Engine, instance: TaskInstance, canon: str, *, regime: str, seed: int,
                 settings: RunSettings, store: str | Path | None, model_key: str) -> None:
        from kvroute.sweep.config import settings_hash

        self.engine, self.instance, self.canon = engine, instance, canon
        self.regime, self.seed, self.settings, self.store = regime, seed, settings, store
        self.model_key, self.sh = model_key, settings_hash(settings)
        self.computed = 0

    def key(self, c: Cell) -> str:
        from kvroute.sweep.grid import cell_key

        press = NO_PRESS if c.press == NO_PRESS else self.canon
        return cell_key(self.model_key, self.instance.id, press, c.ratio, self.regime, self.seed, self.sh, c.restore)

    def run(self, cells: Sequence[Cell]) -> list[dict[str, Any]]:
        from kvroute.runner import run_instance

        keys = [self.key(c) for c in cells]
        if self.store is None:
            recs = run_instance(self.engine, self.instance, cells, regime=self.regime, seed=self.seed,
                                settings=self.settings, model_name=self.model_key.split("|")[0])
            self.computed += len(cells)
            return recs
        from kvroute.sweep.grid import WorkUnit
        from kvroute.sweep.local import finish_records
        from kvroute.sweep.store import Store, iter_records

        with Store.open(self.store) as st:
            done = st.keys()
            todo = [i for i, k in enumerate(keys) if k not in done]
            if todo:
                unit = WorkUnit(self.model_key.split("|")[0], self.instance, self.regime, self.seed,
                                tuple(cells[i] for i in todo), tuple(keys[i] for i in todo))
                recs = run_instance(self.engine, self.instance, list(unit.cells), regime=self.regime, seed=self.seed,
                                    settings=self.settings, model_name=unit.model)
                st.write(finish_records(unit, recs, self.sh))
                self.computed += len(todo)
        want = set(keys)
        return [r for r in iter_records(self.store) if r.get("key") in want]


@dataclass(frozen=True)
class RunCell:
    """A run's compressed cell a map is asked of (:func:`run_cell`): what loads its model and runs its cells."""

    run_dir: Path
    model: Any  # kvroute.sweep.config.ModelSpec
    instance: Any  # TaskInstance
    press: str
    ratio: float
    regime: str
    seed: int
    settings: RunSettings
    record: dict[str, Any] | None  # the run's own record of the cell (None when the run has none)

    @property
    def store(self) -> Path:
        return self.run_dir / MAP_DIR


def parse_cell(cell: str) -> tuple[str, float]:
    """``"snapkv@0.9"`` → ("snapkv", 0.9); ConfigError naming the part."""
    press, sep, ratio = cell.strip().rpartition("@")
    try:
        value = float(ratio)
    except ValueError:
        value = math.nan
    if not sep or not press or math.isnan(value):
        raise ConfigError(f"--cell {cell!r}: write PRESS@RATIO, e.g. snapkv@0.9")
    return press, value


def run_cell(run_dir: str | Path, instance_id: str, cell: str, *, model: str | None = None) -> RunCell:
    """Find ``instance_id`` (an id or a unique prefix) and ``cell`` (PRESS@RATIO, one of the run's presses and
    ratios) in the sweep run at ``run_dir``; unknown names raise :class:`~kvroute.errors.UnknownNameError` with
    the closest."""
    from kvroute.errors import UnknownNameError, suggest
    from kvroute.metrics.base import MetricSettings
    from kvroute.presses import build_press
    from kvroute.sweep.config import ModelSpec
    from kvroute.sweep.manifest import read_manifest
    from kvroute.sweep.store import STORE_NAME, iter_records
    from kvroute.sweep.tasks import TASKS_DIR
    from kvroute.tasks.io import load_tasks

    run = Path(run_dir)
    manifest = read_manifest(run)
    if not manifest or not isinstance(manifest.get("config"), dict):
        raise ConfigError(f"{run} is not a sweep run directory (no manifest.json with its config)")
    c = manifest["config"]
    models = [ModelSpec(m["name"], m["source"], m.get("device"), m.get("dtype")) for m in c.get("models", [])]
    names = [m.name for m in models]
    if model is None and len(models) != 1:
        raise ConfigError(f"{run} has {len(models)} models ({', '.join(names)}); choose one with --model")
    if model is not None and model not in names:
        raise UnknownNameError("model", model, names, plural="models in this run")
    spec = models[0] if model is None else models[names.index(model)]
    press, ratio = parse_cell(cell)
    presses = list(c.get("presses", []))
    canon = {build_press(p).name: p for p in presses}
    if press not in presses:
        try:
            press = canon[build_press(press).name]
        except (KeyError, KvrouteError):
            raise UnknownNameError("press", press, presses, plural="presses in this run") from None
    ratios = [float(r) for r in c.get("ratios", []) if float(r) > 0]
    if ratio not in ratios:
        raise ConfigError(f"--cell {cell!r}: the run has no ratio {ratio:g}; its compressed ratios: "
                          f"{', '.join(f'{r:g}' for r in ratios)}")
    instances = {i.id: i for f in sorted((run / TASKS_DIR).glob("*.jsonl")) for i in load_tasks(f)}
    hits = [i for i in instances if i == instance_id] or [i for i in instances if i.startswith(instance_id)]
    if len(hits) != 1:
        close = suggest(instance_id, instances) if not hits else hits[:3]
        why = f"it matches {len(hits)} instances" if hits else "it is not in this run"
        hint = f"{why} ({len(instances)} instances in {run / TASKS_DIR})"
        if close:
            hint += f"; did you mean {', '.join(map(repr, close))}?"
        raise UnknownNameError("instance", instance_id, [], hint=hint[0].upper() + hint[1:])
    inst = instances[hits[0]]
    rec = None
    if (run / STORE_NAME).is_file():
        rec = next((r for r in iter_records(run) if r.get("instance_id") == inst.id and r.get("press") == press
                    and r.get("ratio") == ratio and not r.get("restore") and r.get("model") == spec.name), None)
    dec = c.get("decoding", {})
    settings = RunSettings(max_new_tokens=int(dec.get("max_new_tokens", RunSettings().max_new_tokens)),
                           batch_size=dec.get("batch_size"), system_prompt=dec.get("system_prompt"),
                           answer_prefix=dec.get("answer_prefix", ""), metrics=MAP_METRICS,
                           metric=MetricSettings(**c.get("metric_settings", {})))
    regime = str(rec["regime"]) if rec else str((c.get("regimes") or ["agnostic"])[0])
    seed = int(rec["seed"]) if rec else int((c.get("seeds") or [0])[0])
    return RunCell(run, spec, inst, press, ratio, regime, seed, settings, rec)


def restore_map_of_run(rc: RunCell, *, target: str = "answer", minimal: bool = True, progress: Progress = SILENT,
                       engine: Engine | None = None) -> RestoreMap:
    """:func:`restore_map` of a run's cell, its cells kept in ``RUN_DIR/restore_map/`` (a rerun reuses them).
    ``engine``: one built for the run's model with ``rc.settings`` (default: the model is loaded)."""
    from kvroute.sweep.grid import model_id
    from kvroute.sweep.local import load_engine

    slot_condition(target, [])  # a bad target fails before the model loads
    engine = engine or load_engine(rc.model, rc.settings)
    m = restore_map(engine, rc.instance, rc.press, rc.ratio, target=target, regime=rc.regime, seed=rc.seed,
                    settings=rc.settings, store=rc.store, model_key=model_id(rc.model), minimal=minimal,
                    progress=progress)
    if rc.record is not None and rc.record.get("status") == "ok":
        m.checks["compressed_is_the_runs_answer"] = rc.record.get("answer") == m.compressed.get("answer")
    return m
