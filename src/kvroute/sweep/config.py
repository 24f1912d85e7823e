"""The sweep config: models × tasks × presses × ratios × regimes × seeds, plus decoding and metrics.

A config file (TOML, YAML or JSON; docs/running.md, "Sweeps", has a complete example) is
checked key by key when it is loaded, before any model or tokenizer is touched. Every problem is a
:class:`~kvroute.errors.ConfigError` naming the file, the key and what is allowed; unknown keys
fail with the closest known ones. ``--set dotted.key=value`` overrides are applied to the raw
mapping first, so they are checked exactly like the file's own values.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvroute import __version__
from kvroute.bounds import MAX_SEED
from kvroute.config import apply_overrides, check_keys, load_mapping
from kvroute.errors import ConfigError, KvrouteError, suggest
from kvroute.metrics import DEFAULT_METRICS, METRICS, MetricSettings
from kvroute.presses import build_press, check_ratio
from kvroute.presses.restore import Restore
from kvroute.settings import RunSettings, attention_backend_problem
from kvroute.tasks import FAMILIES, TaskSpec
from kvroute.tasks.prompt import REGIMES

log = logging.getLogger(__name__)

TOP_KEYS = ("name", "models", "tasks", "presses", "ratios", "restore", "retrieval_heads", "regimes", "seeds",
            "metrics", "decoding", "metric_settings", "ray")
MODEL_KEYS = ("name", "device", "dtype")
FILE_TASK_KEYS = ("file", "limit")
SPEC_TASK_KEYS = tuple(f.name for f in dataclasses.fields(TaskSpec))
DECODING_KEYS = ("max_new_tokens", "batch_size", "system_prompt", "answer_prefix", "attention_memory", "draft",
                 "gather", "attention_backend", "history")
METRIC_SETTING_KEYS = tuple(f.name for f in dataclasses.fields(MetricSettings))
RAY_KEYS = ("address", "instances_per_shard", "cpus_per_worker")
DTYPES = ("auto", "float32", "fp32", "bfloat16", "bf16", "float16", "fp16")
_DEVICE = re.compile(r"^(auto|cpu|mps|cuda(:\d+)?)$")
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.\-]*/[\w.\-]+$")


@dataclass(frozen=True)
class ModelSpec:
    """A model as the config names it; ``source`` is what :func:`~kvroute.models.load_model` gets."""

    name: str
    source: str
    device: str | None = None
    dtype: str | None = None
    # (layer, query head) pairs for restore=…@heads:retrieval, from the run the config's retrieval_heads names
    retrieval_heads: tuple[tuple[int, int], ...] | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "source": self.source, "device": self.device, "dtype": self.dtype}
        if self.retrieval_heads is not None:
            out["retrieval_heads"] = [list(p) for p in self.retrieval_heads]
        return out


@dataclass(frozen=True)
class TaskSource:
    """Either a task file (first ``limit`` instances) or a generator spec."""

    file: Path | None = None
    limit: int | None = None
    spec: TaskSpec | None = None

    def to_dict(self) -> dict[str, Any]:
        if self.spec is not None:
            return {k: v for k, v in dataclasses.asdict(self.spec).items()}
        return {"file": str(self.file), "limit": self.limit}


@dataclass(frozen=True)
class RaySettings:
    address: str | None = None  # None: ray.init() decides (RAY_ADDRESS, else a local Ray)
    instances_per_shard: int = 4  # instances (× regimes × seeds) handed to a worker at once
    cpus_per_worker: int = 1  # CPUs per worker when the cluster has no GPUs


@dataclass(frozen=True)
class SweepConfig:
    """A validated sweep; build it with :func:`load_sweep_config` or :func:`sweep_config_from_mapping`."""

    models: tuple[ModelSpec, ...]
    tasks: tuple[TaskSource, ...]
    presses: tuple[str, ...]
    ratios: tuple[float, ...]
    regimes: tuple[str, ...] = ("agnostic",)
    # restore conditions (kvroute.presses.restore, canonical): each compressed cell also runs with each of them
    restore: tuple[str, ...] = ()
    # the run directory the retrieval heads of restore=…@heads:retrieval come from (each model's are in its ModelSpec)
    retrieval_heads: str | None = None
    seeds: tuple[int, ...] = (0,)
    settings: RunSettings = field(default_factory=RunSettings)
    ray: RaySettings = field(default_factory=RaySettings)
    name: str = "sweep"
    source: str = "<config>"  # the file it came from, for messages

    def __post_init__(self) -> None:
        w = _Where(self.source, ())
        for key in ("models", "tasks", "ratios", "regimes", "seeds"):
            if not getattr(self, key):
                raise w.error(key, "is empty, so the grid would be empty; give at least one value")
        for i, r in enumerate(self.ratios):
            try:
                check_ratio(r)
            except KvrouteError as e:
                raise w.error(f"ratios[{i}]", str(e), r) from None
        if any(r > 0 for r in self.ratios) and not self.presses:
            raise w.error("presses", "is empty but the ratios include compressed cells; name at least one press")

    @property
    def settings_hash(self) -> str:
        return settings_hash(self.settings)

    def to_dict(self) -> dict[str, Any]:
        """The resolved config (defaults filled in), JSON-serialisable; recorded in the manifest."""
        s = self.settings
        return {
            "name": self.name, "source": self.source,
            "models": [m.to_dict() for m in self.models], "tasks": [t.to_dict() for t in self.tasks],
            "presses": list(self.presses), "ratios": list(self.ratios), "restore": list(self.restore),
            **({"retrieval_heads": self.retrieval_heads} if self.retrieval_heads is not None else {}),
            "regimes": list(self.regimes),
            "seeds": list(self.seeds), "metrics": list(s.metrics),
            "decoding": {"max_new_tokens": s.max_new_tokens, "batch_size": s.batch_size,
                         "system_prompt": s.system_prompt, "answer_prefix": s.answer_prefix,
                         "attention_memory": s.attention_memory, "draft": s.draft,
                         "gather": s.gather, "attention_backend": s.attention_backend,
                         **({"history": s.history} if s.history else {})},
            "metric_settings": dataclasses.asdict(s.metric), "ray": dataclasses.asdict(self.ray),
            "settings_hash": self.settings_hash,
        }


def settings_hash(s: RunSettings) -> str:
    """Hash of every setting that changes a record's values (batch size, the attention's memory budget, draft
    verification and gathering do not; kvroute's minor version does)."""
    payload = {"max_new_tokens": s.max_new_tokens, "system_prompt": s.system_prompt, "answer_prefix": s.answer_prefix,
               "metrics": sorted(s.metrics), "metric": dataclasses.asdict(s.metric),
               "kvroute": ".".join(__version__.split(".")[:2])}
    if s.history:  # conversations: a later turn's record depends on the turns before it (unset keeps older keys)
        payload["history"] = s.history
    text = json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def load_sweep_config(path: str | Path, overrides: Iterable[str] = ()) -> SweepConfig:
    """Read, override and validate a sweep config file (no model or tokenizer is loaded)."""
    p = Path(path)
    data, keys = apply_overrides(load_mapping(p), overrides)
    return sweep_config_from_mapping(data, source=str(p), base_dir=p.parent, overridden=keys)


class _Where:
    """Builds messages that name the file (and the --set overrides that touched the key)."""

    def __init__(self, source: str, overridden: tuple[str, ...]) -> None:
        self.source, self.overridden = source, overridden

    def error(self, key: str, msg: str, value: Any = dataclasses.MISSING) -> ConfigError:
        top = re.split(r"[.\[]", key)[0]
        sets = [o for o in self.overridden if re.split(r"[.\[]", o)[0] == top]
        where = self.source + (f" (with --set {', '.join(sets)})" if sets else "")
        shown = "" if value is dataclasses.MISSING else f" = {value!r}"
        return ConfigError(f"{where}: {key}{shown}: {msg}")


def _list(data: Mapping[str, Any], key: str, w: _Where, default: Any = None, *, empty_ok: bool = False) -> list[Any]:
    if key not in data:
        if default is None:
            raise w.error(key, "missing; this key is required (see docs/running.md, Sweeps)")
        return list(default)
    v = data[key]
    if isinstance(v, str | int | float) and not isinstance(v, bool):
        v = [v]
    if not isinstance(v, list):
        raise w.error(key, "must be a list", v)
    if not v and not empty_ok:
        raise w.error(key, "is empty, so the grid would be empty; give at least one value", v)
    return v


def _int(v: Any, key: str, w: _Where, lo: int = 0) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < lo:
        raise w.error(key, f"must be an integer >= {lo}", v)
    return v


def _unique(values: list[Any], key: str, w: _Where) -> None:
    seen: set[Any] = set()
    for i, v in enumerate(values):
        if v in seen:
            raise w.error(f"{key}[{i}]", "appears twice; each value may be listed once", v)
        seen.add(v)


def _model(item: Any, i: int, w: _Where, base_dir: Path | None) -> ModelSpec:
    key = f"models[{i}]"
    if isinstance(item, str):
        item = {"name": item}
    if not isinstance(item, dict):
        raise w.error(key, "must be a model name/path or a table {name, device, dtype}", item)
    check_keys(item, MODEL_KEYS, w.source, key)
    name = item.get("name")
    if not isinstance(name, str) or not name.strip():
        raise w.error(f"{key}.name", "must be a zoo name, a local folder, a .gguf file or a hub id (org/name)", name)
    device, dtype = item.get("device"), item.get("dtype")
    if device is not None and not (isinstance(device, str) and _DEVICE.match(device)):
        raise w.error(f"{key}.device", "allowed: auto, cpu, cuda, cuda:N, mps", device)
    if dtype is not None and dtype not in DTYPES:
        raise w.error(f"{key}.dtype", f"allowed: {', '.join(DTYPES)}", dtype)
    return ModelSpec(name, _model_source(name, f"{key}.name", w, base_dir), device, dtype)


def _model_source(name: str, key: str, w: _Where, base_dir: Path | None) -> str:
    from kvroute.models import ZOO

    if name in ZOO:
        return name
    path = Path(name).expanduser()
    if not path.is_absolute() and base_dir is not None and (base_dir / path).exists():
        path = base_dir / path
    if path.is_dir() or (path.suffix == ".gguf" and path.is_file()):
        return str(path.resolve())
    if _HUB_ID.match(name) and not name.startswith((".", "/", "~")):
        return name  # a hub id; whether it loads is known only when it is loaded
    if "/" in name or name.startswith((".", "~")) or name.endswith(".gguf"):
        raise w.error(key, "no such model folder or .gguf file", name)
    from kvroute.errors import UnknownNameError

    raise w.error(key, str(UnknownNameError("model", name, ZOO.names(), "A model is a zoo name, a local folder, "
                                            "a .gguf file or a hub id (org/name).")))


def _task(item: Any, i: int, w: _Where, base_dir: Path | None) -> TaskSource:
    key = f"tasks[{i}]"
    if isinstance(item, str):
        item = {"file": item}
    if not isinstance(item, dict):
        raise w.error(key, "must be a table: {file = \"x.jsonl\"} or a generator spec {family = \"base\", n = 20, ...}",
                      item)
    if "file" in item:
        check_keys(item, FILE_TASK_KEYS, w.source, key)
        f = item["file"]
        if not isinstance(f, str) or not f:
            raise w.error(f"{key}.file", "must be the path of a .jsonl task file", f)
        path = Path(f).expanduser()
        if not path.is_absolute() and base_dir is not None:
            path = base_dir / path
        if not path.is_file():
            raise w.error(f"{key}.file", f"no such task file ({path}); write one with `kvroute tasks generate` "
                          "or use a generator spec {family = ..., n = ...}", f)
        limit = item.get("limit")
        if limit is not None:
            _int(limit, f"{key}.limit", w, lo=1)
        return TaskSource(file=path.resolve(), limit=limit)
    if "family" not in item:
        check_keys(item, (*FILE_TASK_KEYS, *SPEC_TASK_KEYS), w.source, key)
        raise w.error(key, "needs either 'file' (a task file) or 'family' (a generator spec); "
                      f"task families: {', '.join(FAMILIES.names())}", item)
    check_keys(item, SPEC_TASK_KEYS, w.source, key)
    if item["family"] not in FAMILIES:
        try:
            FAMILIES.get(str(item["family"]))
        except KvrouteError as e:
            raise w.error(f"{key}.family", str(e)) from None
    try:
        spec = TaskSpec(**item)
    except KvrouteError as e:
        raise w.error(key, str(e)) from None
    return TaskSource(spec=spec)


def _press(item: Any, i: int, w: _Where) -> tuple[str, str]:
    key = f"presses[{i}]"
    if not isinstance(item, str):
        raise w.error(key, "must be a press spec string such as 'snapkv' or 'expected_attention+adakv'", item)
    try:
        return item, build_press(item).name
    except KvrouteError as e:
        raise w.error(key, f"{e} (list them with `kvroute presses list`)", item) from None


def sweep_config_from_mapping(data: Mapping[str, Any], *, source: str = "<config>", base_dir: Path | None = None,
                              overridden: tuple[str, ...] = ()) -> SweepConfig:
    """Validate a raw mapping (as read from a file) into a :class:`SweepConfig`."""
    w = _Where(source, overridden)
    check_keys(data, TOP_KEYS, source)
    name = data.get("name", "sweep")
    if not isinstance(name, str):
        raise w.error("name", "must be a string", name)
    models = tuple(_model(m, i, w, base_dir) for i, m in enumerate(_list(data, "models", w)))
    _unique([m.name for m in models], "models", w)
    tasks = tuple(_task(t, i, w, base_dir) for i, t in enumerate(_list(data, "tasks", w)))
    ratios_raw = _list(data, "ratios", w)
    ratios = []
    for i, r in enumerate(ratios_raw):
        if isinstance(r, bool):
            raise w.error(f"ratios[{i}]", "must be a number in [0, 1)", r)
        try:
            ratios.append(check_ratio(r))
        except KvrouteError as e:
            raise w.error(f"ratios[{i}]", f"{e}; allowed: numbers in [0, 1), 0 = the uncompressed baseline",
                          r) from None
    _unique(ratios, "ratios", w)
    compressed = any(r > 0 for r in ratios)
    presses_raw = _list(data, "presses", w, default=None if compressed else ())
    presses = [_press(p, i, w) for i, p in enumerate(presses_raw)]
    _unique([canon for _, canon in presses], "presses (as canonical names)", w)
    restore = _restores(data, w, compressed)
    heads_from = _retrieval_source(data, restore, w, base_dir)
    if heads_from is not None:
        models = _with_retrieval_heads(models, heads_from, w)
    regimes = _list(data, "regimes", w, default=("agnostic",))
    for i, r in enumerate(regimes):
        if r not in REGIMES:
            raise w.error(f"regimes[{i}]", f"allowed: {', '.join(REGIMES)}", r)
    _unique(regimes, "regimes", w)
    seeds = [_int(s, f"seeds[{i}]", w) for i, s in enumerate(_list(data, "seeds", w, default=(0,)))]
    for i, s in enumerate(seeds):
        if s > MAX_SEED:  # a seed goes into every generator and the store's integer column
            raise w.error(f"seeds[{i}]", f"must be an integer from 0 to {MAX_SEED}", s)
    _unique(seeds, "seeds", w)
    metrics = _list(data, "metrics", w, default=DEFAULT_METRICS)
    for i, m in enumerate(metrics):
        if m not in METRICS:
            try:
                METRICS.get(str(m))
            except KvrouteError as e:
                raise w.error(f"metrics[{i}]", str(e)) from None
    _unique(metrics, "metrics", w)
    if "utilization" not in metrics and metrics:
        log.warning("%s: metrics %s leave out 'utilization': the records will hold no answer, outcome or "
                    "hallucinated flag, so no report can fit a cliff or a restoration table from them", source,
                    list(metrics))
    settings = RunSettings(**_decoding(data.get("decoding", {}), w), metrics=tuple(metrics),
                           metric=_metric_settings(data.get("metric_settings", {}), w))
    if settings.history and "aware" in regimes:
        raise w.error("decoding.history", "a conversation asks its questions after the compressed context, so it "
                      "needs regimes = [\"agnostic\"] only", settings.history)
    return SweepConfig(models=models, tasks=tasks, presses=tuple(p for p, _ in presses), ratios=tuple(ratios),
                       restore=tuple(restore), retrieval_heads=None if heads_from is None else str(heads_from),
                       regimes=tuple(regimes), seeds=tuple(seeds), settings=settings,
                       ray=_ray(data.get("ray", {}), w), name=name, source=source)


def _restores(data: Mapping[str, Any], w: _Where, compressed: bool) -> list[str]:
    """The config's restore conditions, canonical and checked (none when the key is missing or empty)."""
    restore = []
    for i, r in enumerate(_list(data, "restore", w, default=(), empty_ok=True)):
        if not isinstance(r, str) or not r:
            raise w.error(f"restore[{i}]", "must be a restore condition such as \"answer\" or "
                          "\"answer@layers:late\"", r)
        try:
            restore.append(str(Restore.parse(r)))
        except KvrouteError as e:
            raise w.error(f"restore[{i}]", str(e), r) from None
    _unique(restore, "restore (as canonical conditions)", w)
    if restore and not compressed:
        raise w.error("restore", "needs compressed cells (a ratio above 0): a restore puts entries back into a "
                      "press's mask")
    return restore


def _retrieval_source(data: Mapping[str, Any], restore: list[str], w: _Where, base_dir: Path | None) -> Path | None:
    """The run directory named by ``retrieval_heads`` (relative to the config's folder), checked against the
    restore conditions: one that restores in the retrieval heads needs it, and it is only read for those."""
    wants = [r for r in restore if Restore.parse(r).needs_retrieval_heads]
    v = data.get("retrieval_heads")
    if v is None:
        if wants:
            raise w.error("retrieval_heads", f"missing; restore condition {wants[0]!r} needs the run directory whose "
                          "full-cache cells identify each model's retrieval heads (a sweep with the 'retrieval' "
                          "metric, e.g. at ratio 0 on other instances)")
        return None
    if not isinstance(v, str) or not v:
        raise w.error("retrieval_heads", "must be the path of a run directory", v)
    if not wants:
        raise w.error("retrieval_heads", "is set but no restore condition uses @heads:retrieval", v)
    p = Path(v).expanduser()
    if not p.is_absolute() and base_dir is not None and not p.exists():
        p = base_dir / p
    if not p.exists():
        raise w.error("retrieval_heads", "no such run directory", v)
    return p


def _with_retrieval_heads(models: tuple[ModelSpec, ...], run: Path, w: _Where) -> tuple[ModelSpec, ...]:
    """Each model with its retrieval heads as scored on the full-cache cells of the run directory ``run``."""
    from kvroute.metrics.retrieval import MIN_EVENTS, THRESHOLD, heads_from_records
    from kvroute.sweep.store import STORE_NAME, read_records

    if not (run / STORE_NAME).is_file():
        raise w.error("retrieval_heads", f"{run} holds no run store ({STORE_NAME}); name the run directory of a "
                      "sweep with the 'retrieval' metric", str(run))
    try:
        heads = {m: rh for m, rh in heads_from_records(read_records(run)).items() if rh is not None}
    except KvrouteError as e:
        raise w.error("retrieval_heads", f"{run}: {e}") from None
    missing = [m.name for m in models if m.name not in heads]
    if missing:
        raise w.error("retrieval_heads", f"{run} has no retrieval scores for {', '.join(map(repr, missing))} (its "
                      f"full-cache cells need the 'retrieval' metric and at least {MIN_EVENTS} copying events per "
                      f"model; it scored {', '.join(map(repr, sorted(heads))) or 'no model'})", str(run))
    log.info("retrieval heads from %s (score ≥ %g): %s", run, THRESHOLD,
             "; ".join(f"{m.name}: {len(heads[m.name].heads)}" for m in models))
    return tuple(dataclasses.replace(m, retrieval_heads=tuple(heads[m.name].heads)) for m in models)


def _table(v: Any, key: str, allowed: tuple[str, ...], w: _Where) -> dict[str, Any]:
    if not isinstance(v, dict):
        raise w.error(key, f"must be a table with keys {', '.join(allowed)}", v)
    check_keys(v, allowed, w.source, key)
    return v


def _history(v: Any, w: _Where) -> str:
    """``decoding.history``: "own" or "gold" (a did-you-mean error otherwise)."""
    if v not in ("own", "gold"):
        close = suggest(v, ["own", "gold"]) if isinstance(v, str) else []
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise w.error("decoding.history", f'{hint}must be "own" (each cell\'s own answers) or "gold"; leave it out to '
                      "ask every question alone", v)
    return str(v)


def _decoding(v: Any, w: _Where) -> dict[str, Any]:
    d = _table(v, "decoding", DECODING_KEYS, w)
    out: dict[str, Any] = {}
    if "max_new_tokens" in d:
        out["max_new_tokens"] = _int(d["max_new_tokens"], "decoding.max_new_tokens", w, lo=1)
    if "batch_size" in d:  # "auto": as many cells as the free memory takes (kvroute.engine.plan)
        b = d["batch_size"]
        if b != "auto" and (isinstance(b, bool) or not isinstance(b, int) or b < 1):
            raise w.error("decoding.batch_size", 'must be an integer >= 1 or "auto"', b)
        out["batch_size"] = None if b == "auto" else b
    if "system_prompt" in d:
        if d["system_prompt"] is not None and not isinstance(d["system_prompt"], str):
            raise w.error("decoding.system_prompt", "must be a string (or left out for the model's default)",
                          d["system_prompt"])
        out["system_prompt"] = d["system_prompt"]
    if "answer_prefix" in d:
        if not isinstance(d["answer_prefix"], str):
            raise w.error("decoding.answer_prefix", "must be a string", d["answer_prefix"])
        out["answer_prefix"] = d["answer_prefix"]
    if "attention_memory" in d:
        out["attention_memory"] = _bytes(d["attention_memory"], "decoding.attention_memory", w)
    for flag in ("draft", "gather"):
        if flag in d:
            if not isinstance(d[flag], bool):
                raise w.error(f"decoding.{flag}", "must be true or false", d[flag])
            out[flag] = d[flag]
    if "history" in d:  # several questions over one context asked in turn (kvroute.tasks.conversation)
        out["history"] = _history(d["history"], w)
    if "attention_backend" in d:  # "auto" or a backend of kvroute.engine.attention (docs/performance.md)
        problem = attention_backend_problem(d["attention_backend"])
        if problem is not None:
            raise w.error("decoding.attention_backend", problem, d["attention_backend"])
        out["attention_backend"] = d["attention_backend"]
    return out


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B?|B)?\s*$", re.IGNORECASE)
_UNIT = {"": 1, "B": 1, "K": 10**3, "KB": 10**3, "KIB": 2**10, "M": 10**6, "MB": 10**6, "MIB": 2**20,
         "G": 10**9, "GB": 10**9, "GIB": 2**30, "T": 10**12, "TB": 10**12, "TIB": 2**40}


def _bytes(v: Any, key: str, w: _Where) -> int:
    """A memory size: a positive number of bytes, or a string with a unit ("512MB", "4GiB", "2G")."""
    if isinstance(v, int) and not isinstance(v, bool) and v > 0:
        return v
    m = _SIZE.match(v) if isinstance(v, str) else None
    unit = (m.group(2) or "").upper() if m else ""
    if m is None or unit not in _UNIT or float(m.group(1)) * _UNIT[unit] < 1:
        raise w.error(key, "must be a positive memory size: bytes, or a number with a unit such as "
                           "\"512MB\", \"4GiB\" or \"2G\"", v)
    return int(float(m.group(1)) * _UNIT[unit])


def _metric_settings(v: Any, w: _Where) -> MetricSettings:
    d = _table(v, "metric_settings", METRIC_SETTING_KEYS, w)
    defaults = MetricSettings()
    out = {}
    for k, val in d.items():
        kind = type(getattr(defaults, k))
        ok = not isinstance(val, bool) and (isinstance(val, int | float) if kind is float else isinstance(val, kind))
        if not ok or (isinstance(val, int | float) and val < 0):
            raise w.error(f"metric_settings.{k}", f"must be a non-negative {kind.__name__}", val)
        out[k] = kind(val)
    return MetricSettings(**out)


def _ray(v: Any, w: _Where) -> RaySettings:
    d = _table(v, "ray", RAY_KEYS, w)
    address = d.get("address")
    if address is not None and (not isinstance(address, str) or not address):
        raise w.error("ray.address", "must be a Ray address such as 'auto' or 'ray://head:10001'", address)
    return RaySettings(address=address,
                       instances_per_shard=_int(d.get("instances_per_shard", 4), "ray.instances_per_shard", w, lo=1),
                       cpus_per_worker=_int(d.get("cpus_per_worker", 1), "ray.cpus_per_worker", w, lo=1))
