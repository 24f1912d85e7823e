"""``kvroute restore-map``: finding the run's cell (unknown names suggest the closest, before any model loads)
and the map's printout, on a hand-built run directory and hand-built records."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from kvroute.cli import app
from kvroute.cli.restore_map import map_lines
from kvroute.errors import ConfigError, UnknownNameError
from kvroute.restore_map import map_from_records, parse_cell, run_cell, slot_condition
from kvroute.tasks import TaskSpec, generate_tasks, save_tasks

runner = CliRunner()


@pytest.fixture
def run_dir(tmp_path):
    """A run directory with a manifest and its task copies, and no store (nothing is computed here)."""
    from kvroute.models import tiny_model

    tok = tiny_model("llama", seed=0).tokenizer
    insts = generate_tasks(TaskSpec("base", n=3, seed=0, target_tokens=200), tok)
    (tmp_path / "tasks").mkdir()
    save_tasks(insts, tmp_path / "tasks" / "base.jsonl")
    config = {"models": [{"name": "m1", "source": "tiny:llama", "device": None, "dtype": None}],
              "presses": ["snapkv[window_size=16]", "knorm"], "ratios": [0.0, 0.5, 0.9],
              "regimes": ["agnostic"], "seeds": [0], "decoding": {"max_new_tokens": 8, "answer_prefix": "Answer:"},
              "metric_settings": {}}
    (tmp_path / "manifest.json").write_text(json.dumps({"config": config}), encoding="utf-8")
    return tmp_path, insts


def test_the_runs_cell_is_found_by_prefix_and_canonical_press_name(run_dir):
    path, insts = run_dir
    rc = run_cell(path, insts[1].id[:6], "snapkv[window_size=16]@0.9")
    assert rc.instance.id == insts[1].id and rc.press == "snapkv[window_size=16]" and rc.ratio == 0.9
    assert rc.settings.metrics == ("utilization",) and rc.settings.answer_prefix == "Answer:"
    assert rc.store == path / "restore_map" and rc.record is None


@pytest.mark.parametrize("instance, cell, error, needle", [
    (None, "snapk[window_size=16]@0.9", UnknownNameError, "did you mean 'snapkv\\[window_size=16\\]'"),
    (None, "knorm@0.7", ConfigError, "no ratio 0.7; its compressed ratios: 0.5, 0.9"),
    (None, "knorm", ConfigError, "write PRESS@RATIO"),
    ("zzzz", "knorm@0.9", UnknownNameError, "It is not in this run \\(3 instances"),
])
def test_unknown_names_are_refused_with_the_closest(run_dir, instance, cell, error, needle):
    path, insts = run_dir
    with pytest.raises(error, match=needle):
        run_cell(path, instance or insts[0].id, cell)


def test_a_near_instance_id_is_suggested(run_dir):
    path, insts = run_dir
    wrong = insts[2].id[:-1] + ("0" if insts[2].id[-1] != "0" else "1")
    with pytest.raises(UnknownNameError, match=f"did you mean '{insts[2].id}'"):
        run_cell(path, wrong, "knorm@0.9")


def test_the_command_refuses_a_bad_cell_before_loading_a_model(run_dir):
    path, insts = run_dir
    out = runner.invoke(app, ["restore-map", str(path), "--instance", insts[0].id, "--cell", "knrm@0.9"])
    assert out.exit_code != 0 and "did you mean 'knorm'" in str(out.exception)


def test_parse_cell_splits_at_the_last_at():
    assert parse_cell("anti_oracle[base=knorm]@0.75") == ("anti_oracle[base=knorm]", 0.75)


def test_the_printout_shows_every_slot_the_minimal_set_and_the_controls():
    recs = [{"press": "none", "ratio": 0.0, "gold_logprob": -1.0, "outcome": "correct", "answer": "a",
             "instance_id": "i1"},
            {"press": "p", "ratio": 0.9, "gold_logprob": -5.0, "outcome": "fabricated", "answer": "b",
             "instance_id": "i1"},
            {"press": "p", "ratio": 0.9, "restore": "answer", "gold_logprob": -1.0, "outcome": "correct",
             "answer": "a"}]
    for (sl, lp) in {(0, 0): -5.0, (0, 1): -1.0, (1, 0): -3.0, (1, 1): -5.0}.items():
        recs.append({"press": "p", "ratio": 0.9, "restore": slot_condition("answer", [sl]), "gold_logprob": lp,
                     "outcome": "correct" if lp == -1.0 else "fabricated", "answer": "a" if lp == -1.0 else "b"})
    recs.append({"press": "p", "ratio": 0.9, "restore": slot_condition("answer", [(0, 0), (0, 1), (1, 0), (1, 1)]),
                 "gold_logprob": -1.0, "outcome": "correct", "answer": "a"})
    recs.append({"press": "p", "ratio": 0.9, "restore": "answer@slots:none", "gold_logprob": -5.0,
                 "outcome": "fabricated", "answer": "b"})
    m = map_from_records(recs)
    text = "\n".join(map_lines(m, "m1"))
    assert "    0   +0.00   +1.00*" in text and "    1   +0.50   +0.00 " in text
    assert "largest effect: slot 0.1 (+1.000); 1 of 4 slots repair alone" in text
    assert "minimal repairing set: 1 slot(s): 0.1" in text
    assert "every_slot_is_whole_target ✔, no_slot_is_compressed ✔" in text
