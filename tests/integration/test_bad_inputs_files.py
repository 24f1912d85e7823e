"""The bad-input catalogue, part two (issue 46): files and bounds at the door.

Every case runs the real ``kvroute`` entry point in process on tiny models (the helpers and fixtures
of :mod:`tests.integration.test_bad_inputs`) and asserts either the correct output or a one-line
error with a nonzero exit code, no traceback and no file changed:

* no output may be an input of the same command, the run's store or its manifest;
* a resumed run refuses a task file whose instance changed under the same id;
* sizes, seeds, nesting depth and string content are checked where they enter;
* every reader checks what it reads (a BOM, the store's schema version, each record's values).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvroute.sweep.store import STORE_NAME
from tests.integration import test_bad_inputs as catalogue
from tests.integration.test_bad_inputs import assert_fails_cleanly, cli

# the catalogue's fixtures, shared by name (module-scoped ones are built once per module)
tiny = catalogue.tiny
good_instance = catalogue.good_instance
sweep_config = catalogue.sweep_config
finished_run = catalogue.finished_run
run_copy = catalogue.run_copy
tasks_file = catalogue.tasks_file


# 5. an output that is an input of the same command -------------------------------------------------------
def test_run_refuses_out_that_is_its_task_file(tiny, tasks_file, tmp_path, capsys):
    assert_fails_cleanly(["run", "--model", tiny, "--tasks", tasks_file, "--press", "knorm", "--ratio", "0.5",
                          "--out", tasks_file], capsys, tmp_path, ("--out", "task file"))


def test_run_refuses_out_that_is_its_task_file_by_another_name(tiny, tasks_file, tmp_path, capsys):
    (tmp_path / "sub").mkdir()
    (tmp_path / "link.jsonl").symlink_to(tasks_file)
    assert_fails_cleanly(["run", "--model", tiny, "--tasks", tmp_path / "link.jsonl", "--press", "knorm",
                          "--ratio", "0.5", "--out", tmp_path / "sub" / ".." / tasks_file.name], capsys, tmp_path,
                         "task file")


@pytest.mark.parametrize("name", [STORE_NAME, "manifest.json"])
@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_export_refuses_out_that_is_the_store_or_manifest(name, fmt, run_copy, tmp_path, capsys):
    assert_fails_cleanly(["export", run_copy, "--format", fmt, "--out", run_copy / name], capsys, tmp_path,
                         ("--out", "the run's"))


def test_sweep_refuses_a_config_that_the_run_would_overwrite(tiny, tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    cfg = run / "manifest.json"
    cfg.write_text(json.dumps({"name": "x", "models": [str(tiny)], "presses": ["knorm"], "ratios": [0, 0.5],
                               "tasks": [{"family": "base", "n": 1}]}))
    assert_fails_cleanly(["sweep", cfg, "--out", run, "--dry-run"], capsys, tmp_path,
                         ("manifest", "under --out", "sweep config"))


def test_sweep_refuses_a_task_file_that_the_run_would_overwrite(tiny, good_instance, tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / "manifest.json").write_text(json.dumps([good_instance]))
    cfg = tmp_path / "sweep.toml"
    cfg.write_text(f'models = ["{tiny}"]\npresses = ["knorm"]\nratios = [0, 0.5]\n'
                   '[[tasks]]\nfile = "run/manifest.json"\n')
    assert_fails_cleanly(["sweep", cfg, "--out", run, "--dry-run"], capsys, tmp_path,
                         ("manifest", "task file of tasks[0]"))


def test_findings_refuses_keep_that_is_its_summary(tmp_path, capsys):
    summary = tmp_path / "summary.json"
    summary.write_text("{}\n")
    assert_fails_cleanly(["findings", summary, "--keep", summary], capsys, tmp_path, ("--keep", "summary"))


def test_import_refuses_out_that_is_its_source(good_instance, tmp_path, capsys):
    src = tmp_path / "rows.jsonl"
    src.write_text(json.dumps({"context": good_instance["context"], "question": good_instance["question"],
                               "answer": good_instance["answers"][0]}) + "\n")
    assert_fails_cleanly(["tasks", "import", src, "--out", src], capsys, tmp_path, ("--out", "dataset"))


# 6. --resume with an instance edited under the same id ------------------------------------------------------
def _hand_written(good_instance: dict, path: Path, *, edit: bool = False) -> Path:
    inst = {**good_instance, "id": "q1"}
    if edit:
        inst["context"] += " The harbour was rebuilt in 1990."
        inst["question"] = inst["question"].rstrip("?") + " originally?"
    path.write_text(json.dumps(inst, ensure_ascii=False) + "\n", encoding="utf-8")
    return path


def _file_config(tiny: Path, tasks: Path, folder: Path) -> Path:
    cfg = folder / "sweep.toml"
    cfg.write_text(f'name = "resume-edit"\nmodels = ["{tiny}"]\npresses = ["knorm"]\nratios = [0, 0.5]\n'
                   f'[[tasks]]\nfile = "{tasks}"\n[decoding]\nmax_new_tokens = 3\n')
    return cfg


def test_resume_refuses_an_instance_edited_under_the_same_id(tiny, good_instance, tmp_path, capsys):
    tasks = _hand_written(good_instance, tmp_path / "mine.jsonl")
    cfg = _file_config(tiny, tasks, tmp_path)
    code, _, err = cli(["sweep", cfg, "--out", tmp_path / "run"], capsys)
    assert code == 0, err
    _hand_written(good_instance, tasks, edit=True)
    line = assert_fails_cleanly(["sweep", cfg, "--out", tmp_path / "run", "--resume"], capsys, tmp_path,
                                ("'q1'", "another context", "new id"))
    assert str(tasks) in line
    _hand_written(good_instance, tasks)  # the original content back: the resume has nothing to do
    code, out, err = cli(["sweep", cfg, "--out", tmp_path / "run", "--resume"], capsys)
    assert code == 0 and "0 cells computed" in out, err
