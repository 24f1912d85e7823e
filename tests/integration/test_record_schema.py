"""The record schema against what the metrics really emit, read from the registry: every metric returns
exactly the fields it declares, and every field of a record is described in kvroute.records."""

import pytest

from kvroute.engine import Cell, Engine
from kvroute.metrics.base import METRICS
from kvroute.models.tiny import tiny_model
from kvroute.records import ALL_FIELDS
from kvroute.runner import RunSettings, run_instance
from kvroute.tasks import TaskSpec, generate_tasks


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_every_metric_returns_its_declared_fields_and_every_record_field_is_described(arch, monkeypatch):
    lm = tiny_model(arch, seed=0)
    returned: dict[str, list[set[str]]] = {name: [] for name in METRICS.names()}
    for name, metric in METRICS.items():  # registered instances
        real = metric.compute

        def spy(ctx, _real=real, _name=name):
            out = _real(ctx)
            returned[_name].append(set(out))
            return out

        monkeypatch.setattr(metric, "compute", spy)
    settings = RunSettings(max_new_tokens=3, metrics=tuple(METRICS.names()))
    insts = generate_tasks(TaskSpec("base", n=1, seed=0), lm.tokenizer) + \
        generate_tasks(TaskSpec("multi_entity", n=1, seed=0), lm.tokenizer)
    recs = []
    for inst in insts:
        recs += run_instance(Engine(lm, settings.decode_settings()), inst,
                             [Cell("none", 0.0), Cell("knorm", 0.5), Cell("snapkv[window_size=8]+adakv", 0.9)],
                             settings=settings)
    assert all(r["status"] == "ok" for r in recs), [r.get("error") for r in recs]
    for name, outs in returned.items():
        assert outs, f"metric {name} never ran"
        for keys in outs:
            assert keys == set(METRICS.get(name).fields), (
                f"metric {name}: returned {sorted(keys ^ set(METRICS.get(name).fields))} against its declared fields")
    undescribed = sorted({k for r in recs for k in r} - set(ALL_FIELDS))
    assert not undescribed, f"record fields kvroute.records does not describe: {undescribed}"


CONFIG = """
name = "schema"
models = ["{model}"]
presses = ["knorm", "snapkv[window_size=8]+adakv"]
ratios = [0, 0.5]
metrics = [{metrics}]

[[tasks]]
family = "base"
n = 2

[[tasks]]
family = "multi_entity"
n = 1

[decoding]
max_new_tokens = 3
"""


def test_records_survive_sqlite_parquet_csv_with_their_types(tmp_path):
    """sqlite → parquet → csv → records: every field equal, lists as lists (ger_layer, gold), bools as bools."""
    import math

    from kvroute.analysis.load import load_records
    from kvroute.models import save_tiny_model
    from kvroute.sweep import load_sweep_config, run_sweep
    from kvroute.sweep.export import export_records

    model = save_tiny_model(tmp_path / "tiny", "llama", seed=0)
    cfg = tmp_path / "sweep.toml"
    cfg.write_text(CONFIG.format(model=model, metrics=", ".join(f'"{m}"' for m in METRICS.names())))
    run = tmp_path / "run"
    run_sweep(load_sweep_config(cfg), run)
    frames = {"sqlite": load_records(run)}
    for fmt in ("parquet", "csv"):
        path, _ = export_records(run, fmt)
        frames[fmt] = load_records(path)
    ref = frames["sqlite"].sort_values(["instance_id", "press", "ratio"]).reset_index(drop=True)
    assert isinstance(ref.loc[0, "ger_layer"], list) or ref["ger_layer"].isna().all()
    assert all(isinstance(g, list) for g in ref["gold"])
    for fmt in ("parquet", "csv"):
        df = frames[fmt].sort_values(["instance_id", "press", "ratio"]).reset_index(drop=True)
        assert sorted(df.columns) == sorted(ref.columns), fmt
        for col in ref.columns:
            for i, (a, b) in enumerate(zip(ref[col], df[col], strict=True)):
                a, b = _plain(a), _plain(b)
                same = (a == b or (_missing(a) and _missing(b))
                        or (isinstance(a, float) and isinstance(b, float) and math.isclose(a, b, rel_tol=1e-6)))
                assert same, f"{fmt}: row {i} field {col}: {a!r} ({type(a).__name__}) != {b!r} ({type(b).__name__})"


def _plain(v):
    """numpy scalars and arrays as Python values (a float32 vector compares by value)."""
    import numpy as np

    if isinstance(v, np.ndarray):
        return [_plain(x) for x in v.tolist()]
    if isinstance(v, np.generic):
        return v.item()
    if isinstance(v, list):
        return [_plain(x) for x in v]
    return v


def _missing(v) -> bool:
    return v is None or (isinstance(v, float) and v != v)
