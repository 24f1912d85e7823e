"""`kvroute ticket --out RUN_DIR` builds the prompt the sweep in RUN_DIR built."""

import json

from typer.testing import CliRunner

from kvroute.cli import app
from kvroute.models import save_tiny_model
from kvroute.sweep.manifest import write_manifest
from kvroute.tasks import TaskSpec, generate_tasks, save_tasks


def test_ticket_takes_the_answer_prefix_from_the_runs_manifest(tmp_path):
    folder = save_tiny_model(tmp_path / "tiny", "llama", seed=0)
    tasks = tmp_path / "tasks.jsonl"
    save_tasks(generate_tasks(TaskSpec("base", n=1, seed=1)), tasks)
    run = tmp_path / "run"
    run.mkdir()
    write_manifest(run, {"config": {"decoding": {"answer_prefix": "Answer:", "system_prompt": None}}})
    res = CliRunner().invoke(app, ["ticket", "--model", str(folder), "--tasks", str(tasks), "--target", "full",
                                   "--max-new-tokens", "3", "--max-evaluations", "10", "--out", str(run)])
    assert res.exit_code == 0, res.output
    line = json.loads((run / "tickets.jsonl").read_text().splitlines()[0])
    assert line["answer_prefix"] == "Answer:" and line["regime"] == "agnostic"
    assert line["question_tokens"] > 0 and line["fraction_with_question"] >= line["fraction"]
    # an explicit option wins over the manifest
    res = CliRunner().invoke(app, ["ticket", "--model", str(folder), "--tasks", str(tasks), "--target", "full",
                                   "--max-new-tokens", "3", "--max-evaluations", "10", "--out", str(run),
                                   "--answer-prefix", ""])
    assert res.exit_code == 0, res.output
    line = json.loads((run / "tickets.jsonl").read_text().splitlines()[1])
    assert line["answer_prefix"] == ""
