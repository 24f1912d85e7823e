"""Sweep configs: TOML/YAML loading, overrides, and errors that name the file, the key and what is allowed."""

import json
from pathlib import Path

import pytest

from kvroute.config import apply_overrides, parse_value
from kvroute.errors import ConfigError
from kvroute.runner import RunSettings
from kvroute.sweep.config import load_sweep_config, settings_hash

TOML = """
name = "demo"
models = ["smollm2-135m", {name = "qwen2.5-0.5b", dtype = "bfloat16"}]
presses = ["expected_attention", "snapkv+adakv"]
ratios = [0, 0.5, 0.9]
regimes = ["agnostic", "aware"]
seeds = [0, 1]
metrics = ["retention", "utilization"]

[[tasks]]
family = "base"
n = 4

[[tasks]]
file = "tasks.jsonl"
limit = 2

[decoding]
max_new_tokens = 16

[metric_settings]
reach_kappa = 3.0
"""

YAML = """
name: demo
models: [smollm2-135m, {name: qwen2.5-0.5b, dtype: bfloat16}]
presses: [expected_attention, snapkv+adakv]
ratios: [0, 0.5, 0.9]
regimes: [agnostic, aware]
seeds: [0, 1]
metrics: [retention, utilization]
tasks:
  - {family: base, n: 4}
  - {file: tasks.jsonl, limit: 2}
decoding: {max_new_tokens: 16}
metric_settings: {reach_kappa: 3.0}
"""


@pytest.fixture
def folder(tmp_path):
    (tmp_path / "tasks.jsonl").write_text("")
    return tmp_path


def write(folder, text, name="sweep.toml"):
    p = folder / name
    p.write_text(text)
    return p


def test_toml_and_yaml_give_the_same_resolved_config(folder):
    a = load_sweep_config(write(folder, TOML)).to_dict()
    b = load_sweep_config(write(folder, YAML, "sweep.yaml")).to_dict()
    a.pop("source"), b.pop("source")
    assert a == b
    assert a["models"][1] == {"name": "qwen2.5-0.5b", "source": "qwen2.5-0.5b", "device": None, "dtype": "bfloat16"}
    assert a["tasks"][1]["file"] == str((folder / "tasks.jsonl").resolve())  # relative to the config file
    assert a["decoding"]["max_new_tokens"] == 16 and a["decoding"]["batch_size"] == RunSettings().batch_size
    assert a["metric_settings"]["reach_kappa"] == 3.0
    json.dumps(a)  # the manifest stores it


@pytest.mark.parametrize(("edit", "needles"), [
    (("presses", '["expected_attention", "snapvk"]'), ["sweep.toml", "presses[1]", "did you mean 'snapkv'"]),
    (("ratios", "[0, 0.5, 1.0]"), ["sweep.toml", "ratios[2]", "1.0", "[0, 1)"]),
    (("ratios", "[]"), ["sweep.toml", "ratios", "empty"]),
    (("presses", "[]"), ["sweep.toml", "presses", "empty"]),
    (("regimes", '["agnostik"]'), ["regimes[0]", "agnostic, aware"]),
    (("metrics", '["retention", "utilisation"]'), ["metrics[1]", "did you mean 'utilization'"]),
    (("seeds", "[0, 0]"), ["seeds[1]", "twice"]),
    (("models", '["smollm2"]'), ["models[0].name", "did you mean 'smollm2-135m'"]),
    (("models", '["./no/such/folder"]'), ["models[0].name", "no such model folder"]),
    (("models", '[{name = "smollm2-135m", dtype = "fp8"}]'), ["models[0].dtype", "bfloat16"]),
])
def test_bad_values_name_file_key_and_allowed_values(folder, edit, needles):
    key, value = edit
    text = "\n".join(f"{key} = {value}" if line.startswith(f"{key} =") else line for line in TOML.splitlines())
    with pytest.raises(ConfigError) as e:
        load_sweep_config(write(folder, text))
    for n in needles:
        assert n in str(e.value), (n, str(e.value))


def test_missing_task_file_is_named(folder):
    with pytest.raises(ConfigError, match=r"sweep.toml: tasks\[1\].file = 'gone.jsonl': no such task file"):
        load_sweep_config(write(folder, TOML.replace("tasks.jsonl", "gone.jsonl")))


def test_unknown_keys_fail_with_suggestions(folder):
    with pytest.raises(ConfigError, match=r"unknown key 'ratio'; did you mean 'ratios'.*Allowed keys: name, models"):
        load_sweep_config(write(folder, TOML.replace("ratios =", "ratio =")))
    with pytest.raises(ConfigError, match=r"unknown key 'decoding.max_tokens'; did you mean 'max_new_tokens'"):
        load_sweep_config(write(folder, TOML.replace("max_new_tokens = 16", "max_tokens = 16")))
    with pytest.raises(ConfigError, match=r"unknown key 'tasks\[0\].famly'"):
        load_sweep_config(write(folder, TOML.replace('family = "base"', 'famly = "base"')))
    with pytest.raises(ConfigError, match=r"tasks\[0\].family.*did you mean 'base'"):
        load_sweep_config(write(folder, TOML.replace('family = "base"', 'family = "bse"')))
    with pytest.raises(ConfigError, match="missing; this key is required"):
        load_sweep_config(write(folder, TOML.replace("models =", "# models =")))


def test_overrides_apply_dotted_keys_and_are_named_in_errors(folder):
    p = write(folder, TOML)
    cfg = load_sweep_config(p, ["decoding.max_new_tokens=8", "ratios=[0, 0.25]", "tasks.0.n=2", "seeds=3"])
    assert cfg.settings.max_new_tokens == 8 and cfg.ratios == (0.0, 0.25) and cfg.seeds == (3,)
    assert cfg.tasks[0].spec.n == 2
    with pytest.raises(ConfigError, match=r"sweep.toml \(with --set ratios\): ratios\[0\] = 1.5"):
        load_sweep_config(p, ["ratios=[1.5]"])
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        load_sweep_config(p, ["ratios"])


def test_parse_value_reads_toml_scalars_and_falls_back_to_text():
    assert parse_value("0.5") == 0.5 and parse_value("true") is True and parse_value("[0, 0.5]") == [0, 0.5]
    assert parse_value("snapkv+adakv") == "snapkv+adakv"
    data, keys = apply_overrides({"a": {"b": 1}}, ["a.c=2", "x.y=z"])
    assert data == {"a": {"b": 1, "c": 2}, "x": {"y": "z"}} and keys == ("a.c", "x.y")


def test_settings_hash_follows_what_changes_records():
    base = settings_hash(RunSettings())
    assert settings_hash(RunSettings(batch_size=7)) == base  # batching does not change a record
    assert settings_hash(RunSettings(max_new_tokens=7)) != base
    assert settings_hash(RunSettings(metrics=("retention",))) != base
    assert settings_hash(RunSettings(metrics=tuple(reversed(RunSettings().metrics)))) == base


def test_duplicate_presses_after_canonicalisation_are_refused(folder):
    with pytest.raises(ConfigError, match="appears twice"):
        load_sweep_config(write(folder, TOML.replace('"snapkv+adakv"', '"expected_attention+per_head"')))


def test_the_documented_example_config_is_valid(tmp_path):
    import re
    from pathlib import Path

    readme = (Path(__file__).parents[2] / "docs" / "running.md").read_text()
    section = readme[readme.index("## Sweeps"):]
    toml = re.search(r"```toml\n(.*?)```", section, re.S).group(1)
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "base.jsonl").write_text("")
    cfg = load_sweep_config(write(tmp_path, toml))
    assert cfg.name == "cliff" and len(cfg.models) == 2 and cfg.ray.address == "auto"
    assert cfg.tasks[1].spec.target_tokens == 1024 and cfg.settings.system_prompt == "Answer from the context."


@pytest.mark.parametrize("given, bytes_", [(1 << 30, 1 << 30), ("512MB", 512 * 10**6), ("4GiB", 4 << 30),
                                           ("2G", 2 * 10**9), ("1.5 GiB", int(1.5 * 2**30)), ("300kib", 300 * 1024)])
def test_attention_memory_takes_bytes_or_a_size_with_a_unit(folder, given, bytes_):
    value = given if isinstance(given, int) else f'"{given}"'
    cfg = load_sweep_config(write(folder, TOML + f"\n[decoding]\nattention_memory = {value}\n"
                                  if "[decoding]" not in TOML else
                                  TOML.replace("[decoding]", f"[decoding]\nattention_memory = {value}")))
    assert cfg.settings.attention_memory == bytes_
    assert cfg.settings.decode_settings().attention_memory == bytes_
    assert cfg.settings_hash == load_sweep_config(write(folder, TOML)).settings_hash  # not a result-changing setting


@pytest.mark.parametrize("bad", ['"lots"', "0", '"-1GB"', '"3 parsecs"', "true"])
def test_a_bad_attention_memory_is_refused_naming_the_key(folder, bad):
    text = (TOML.replace("[decoding]", f"[decoding]\nattention_memory = {bad}") if "[decoding]" in TOML
            else TOML + f"\n[decoding]\nattention_memory = {bad}\n")
    with pytest.raises(ConfigError, match="decoding.attention_memory.*memory size"):
        load_sweep_config(write(folder, text))


def _with_decoding(line):
    return (TOML.replace("[decoding]", f"[decoding]\n{line}") if "[decoding]" in TOML
            else TOML + f"\n[decoding]\n{line}\n")


@pytest.mark.parametrize("given, expected", [('"auto"', None), ("8", 8)])
def test_batch_size_is_a_number_or_auto(folder, given, expected):
    cfg = load_sweep_config(write(folder, _with_decoding(f"batch_size = {given}")))
    assert cfg.settings.batch_size == expected
    assert cfg.settings.decode_settings().batch_size == expected
    assert cfg.settings_hash == load_sweep_config(write(folder, TOML)).settings_hash


@pytest.mark.parametrize("bad", ['"big"', "0", "true", "2.5"])
def test_a_bad_batch_size_is_refused_naming_the_key(folder, bad):
    with pytest.raises(ConfigError, match='decoding.batch_size.*integer >= 1 or "auto"'):
        load_sweep_config(write(folder, _with_decoding(f"batch_size = {bad}")))


def test_draft_is_a_boolean_outside_the_settings_hash(folder):
    cfg = load_sweep_config(write(folder, _with_decoding("draft = false")))
    assert cfg.settings.draft is False and cfg.settings.decode_settings().draft is False
    assert cfg.settings_hash == load_sweep_config(write(folder, TOML)).settings_hash
    with pytest.raises(ConfigError, match="decoding.draft.*true or false"):
        load_sweep_config(write(folder, _with_decoding('draft = "yes"')))


def _restore(line):
    return TOML.replace("ratios = [0, 0.5, 0.9]", f"ratios = [0, 0.5, 0.9]\nrestore = {line}")


def test_restore_conditions_are_checked_and_made_canonical(folder):
    cfg = load_sweep_config(write(folder, _restore('["answer", " evidence@layers:late ", "random"]')))
    assert cfg.restore == ("answer", "evidence@layers:late", "random")
    assert cfg.to_dict()["restore"] == list(cfg.restore)
    with pytest.raises(ConfigError, match=r"restore\[0\].*unknown target 'anser'"):
        load_sweep_config(write(folder, _restore('["anser"]')))
    with pytest.raises(ConfigError, match=r"restore.*appears twice"):
        load_sweep_config(write(folder, _restore('["answer", "answer@layers:0-1", "answer"]')))
    with pytest.raises(ConfigError, match=r"restore\[0\]"):
        load_sweep_config(write(folder, _restore("[3]")))


def test_an_empty_restore_list_means_no_restored_cells(folder):
    # `--set restore=[]` turns a study config's restoration off; the grid is the unrestored one, not an error
    assert load_sweep_config(write(folder, _restore("[]"))).restore == ()
    assert load_sweep_config(write(folder, TOML)).restore == ()


STUDY_CONFIGS = sorted((Path(__file__).resolve().parents[2] / "benchmarks" / "configs").glob("*.toml"))


@pytest.mark.parametrize("path", STUDY_CONFIGS, ids=lambda p: p.name)
def test_the_committed_study_configs_are_valid(path):
    cfg = load_sweep_config(path)
    assert cfg.models and cfg.tasks and cfg.ratios


def _heads_run(folder, models=("smollm2-135m", "qwen2.5-0.5b"), events=6):
    """A run store standing in for a sweep whose full-cache cells carry the 'retrieval' metric: in every model,
    (layer 1, query head 2) took part in 3 of the copying events, (0, 0) in none."""
    import shutil

    from kvroute.sweep.store import Store

    path = folder / "heads"
    shutil.rmtree(path, ignore_errors=True)
    recs = []
    for m in models:
        for i in range(2):
            hits = [[0.0, 0.0, 0.0], [0.0, 0.0, 3.0 if i == 0 else 0.0]]
            recs.append({"key": f"{m}-{i}", "model": m, "instance_id": f"i{i}", "press": "none", "ratio": 0.0,
                         "regime": "agnostic", "seed": 0, "status": "ok", "retrieval_hits": hits,
                         "retrieval_events": events // 2})
    with Store.open(path) as store:
        store.write(recs)
    return path


def test_retrieval_head_restoration_reads_each_models_heads_from_another_run(folder):
    _heads_run(folder)
    text = 'retrieval_heads = "heads"\n' + _restore('["answer@heads:retrieval", "answer"]')
    cfg = load_sweep_config(write(folder, text))
    assert [m.retrieval_heads for m in cfg.models] == [((1, 2),), ((1, 2),)]  # score 3/6 ≥ 0.1; (0, 0) scores 0
    assert cfg.to_dict()["retrieval_heads"].endswith("heads")
    assert cfg.to_dict()["models"][0]["retrieval_heads"] == [[1, 2]]


def test_retrieval_head_restoration_without_its_source_is_refused(folder):
    with pytest.raises(ConfigError, match=r"retrieval_heads.*missing; restore condition 'answer@heads:retrieval'"):
        load_sweep_config(write(folder, _restore('["answer@heads:retrieval"]')))
    (folder / "empty").mkdir()
    with pytest.raises(ConfigError, match="holds no run store"):
        load_sweep_config(write(folder, 'retrieval_heads = "empty"\n' + _restore('["answer@heads:retrieval"]')))
    with pytest.raises(ConfigError, match="no such run directory"):
        load_sweep_config(write(folder, 'retrieval_heads = "nope"\n' + _restore('["answer@heads:retrieval"]')))
    with pytest.raises(ConfigError, match="no restore condition uses @heads:retrieval"):
        load_sweep_config(write(folder, 'retrieval_heads = "heads"\n' + _restore('["answer"]')))
    _heads_run(folder, models=("smollm2-135m",))
    with pytest.raises(ConfigError, match=r"no retrieval scores for 'qwen2.5-0.5b'.*it scored 'smollm2-135m'"):
        load_sweep_config(write(folder, 'retrieval_heads = "heads"\n' + _restore('["answer@heads:retrieval"]')))
    _heads_run(folder, events=2)  # fewer copying events than the scores need
    with pytest.raises(ConfigError, match="at least 5 copying events"):
        load_sweep_config(write(folder, 'retrieval_heads = "heads"\n' + _restore('["answer@heads:retrieval"]')))


def test_metrics_without_utilization_warn_that_no_cliff_can_be_fitted(folder, caplog):
    with caplog.at_level("WARNING"):
        load_sweep_config(write(folder, TOML.replace('metrics = ["retention", "utilization"]',
                                                     'metrics = ["retention"]')))
    assert "leave out 'utilization'" in caplog.text and "no report can fit a cliff" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING"):
        load_sweep_config(write(folder, TOML))
    assert "utilization" not in caplog.text
