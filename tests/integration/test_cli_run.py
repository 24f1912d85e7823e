"""`kvroute run` end to end on a tiny model saved as a local folder."""

import json

import pytest
from typer.testing import CliRunner

from kvroute.cli import app
from kvroute.models import save_tiny_model
from kvroute.records import KEY_FIELDS, METRIC_FIELDS
from kvroute.tasks import TaskSpec, generate_tasks, save_tasks


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("tiny-qwen2"), "qwen2", seed=0)


def test_run_writes_one_record_per_cell_with_the_required_fields(tiny_folder, tmp_path):
    tasks = tmp_path / "tasks.jsonl"
    save_tasks(generate_tasks(TaskSpec("base", n=2, seed=0)), tasks)
    out = tmp_path / "out.jsonl"
    res = CliRunner().invoke(app, ["run", "--model", str(tiny_folder), "--tasks", str(tasks), "--press", "knorm",
                                   "--press", "oracle[base=knorm]+adakv", "--ratio", "0.5", "--ratio", "0.9",
                                   "--max-new-tokens", "4", "--out", str(out)])
    assert res.exit_code == 0, res.output
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(recs) == 2 * 2 * 2
    required = {"id", "press", "ratio", "answer", "kept_fraction", "ger", "ger_all_layers", "eviction_rate",
                "evidence_attention_mass", "reachable", "f1", "exact", "outcome", "gold_logprob_delta",
                "consensus_nosink", "rho_nosink", "consensus_group_nosink", "rho_group_nosink",
                "consensus_withsink", "rho_withsink", "evidence_mass_layer", "hidden_cosine"}
    for r in recs:
        assert required <= set(r), required - set(r)
        assert set(KEY_FIELDS) - {"settings"} <= set(r)
        assert (len(r["consensus_nosink"]) == 3 and len(r["consensus_group_nosink"]) == 3
                and len(r["hidden_cosine"]) == 3)
        assert abs(r["kept_fraction"] - (1 - r["ratio"])) < 0.05
    from kvroute.metrics import DEFAULT_METRICS, METRICS

    opt_in = {f for name, m in METRICS.items() if name not in DEFAULT_METRICS for f in m.fields}  # e.g. 'retrieval'
    missing = set(METRIC_FIELDS) - opt_in - set(recs[0])
    assert not missing, missing
    assert not opt_in & set(recs[0])  # an opt-in metric's fields only where it is asked for


def test_run_rejects_bad_press_before_loading(tiny_folder, tmp_path):
    tasks = tmp_path / "tasks.jsonl"
    save_tasks(generate_tasks(TaskSpec("base", n=1, seed=0)), tasks)
    res = CliRunner().invoke(app, ["run", "--model", str(tiny_folder), "--tasks", str(tasks), "--press", "snapvk",
                                   "--ratio", "0.5", "--out", str(tmp_path / "o.jsonl")])
    assert res.exit_code != 0
    assert "did you mean 'snapkv'" in str(res.exception) + res.output


def test_error_messages_keep_their_brackets(tmp_path):
    """A KvrouteError's text is printed verbatim: press specs like snapkv[window_size=8] are not markup."""
    import subprocess
    import sys

    tasks = tmp_path / "t.jsonl"
    save_tasks(generate_tasks(TaskSpec("base", n=1, seed=0)), tasks)
    proc = subprocess.run([sys.executable, "-m", "kvroute.cli", "run", "--model", "nope-model", "--tasks", str(tasks),
                           "--press", "snapkv[window_size=8]+adakw", "--ratio", "0.5", "--out", str(tmp_path / "o")],
                          capture_output=True, text=True)
    assert proc.returncode == 2
    assert "did you mean 'adakv'" in proc.stderr
