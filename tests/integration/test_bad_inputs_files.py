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


# 8. tracebacks: each a one-line error now ---------------------------------------------------------------
def test_report_refuses_a_negative_seed(run_copy, tmp_path, capsys):
    assert_fails_cleanly(["report", run_copy, "--seed", "-1"], capsys, tmp_path, ("--seed", "0 to"))


@pytest.mark.parametrize(("where", "value"), [("question", "In which town \ud800?"), ("meta", {"note": "\ud800"}),
                                               ("answers", ["\ud800"]), ("meta", {"\ud800": 1})])
def test_run_and_show_refuse_a_lone_surrogate(where, value, good_instance, tiny, tmp_path, capsys):
    f = tmp_path / "sur.jsonl"
    f.write_text(json.dumps({**good_instance, where: value}) + "\n")  # ASCII escapes: \ud800 reaches json.loads
    assert_fails_cleanly(["run", "--model", tiny, "--tasks", f, "--press", "knorm", "--ratio", "0.5",
                          "--out", tmp_path / "o.jsonl"], capsys, tmp_path, ("line 1", "lone surrogate"))
    assert_fails_cleanly(["tasks", "show", f], capsys, tmp_path, ("line 1", "lone surrogate"))


def test_a_lone_surrogate_in_an_instance_built_in_python_is_refused(good_instance):
    from kvroute.errors import TaskFormatError
    from kvroute.tasks import TaskInstance

    with pytest.raises(TaskFormatError, match="'question'.*lone surrogate"):
        TaskInstance.from_dict({**good_instance, "id": None, "question": "Who \ud800?"})


@pytest.mark.parametrize("name", ["deep.jsonl", "deep.json"])
def test_tasks_refuse_json_nested_too_deep(name, tmp_path, capsys):
    (tmp_path / name).write_text("[" * 100_000 + "]" * 100_000 + "\n")
    assert_fails_cleanly(["tasks", "show", tmp_path / name], capsys, tmp_path, ("nested more than",))


def test_task_meta_nested_too_deep_is_refused(good_instance, tmp_path, capsys):
    meta: dict = {}
    for _ in range(200):
        meta = {"x": meta}
    (tmp_path / "m.jsonl").write_text(json.dumps({**good_instance, "meta": meta}) + "\n")
    assert_fails_cleanly(["tasks", "show", tmp_path / "m.jsonl"], capsys, tmp_path, ("line 1", "nested more than"))


def test_sweep_refuses_a_config_nested_too_deep(tmp_path, capsys):
    (tmp_path / "deep.json").write_text('{"models": ' + "[" * 100_000 + "]" * 100_000 + "}")
    assert_fails_cleanly(["sweep", tmp_path / "deep.json", "--out", tmp_path / "run", "--dry-run"], capsys, tmp_path,
                         ("deep.json", "nested more than"))


@pytest.mark.parametrize("args", [["--seeds", "99999999999999999999999"], ["--set", "seeds=[4294967296]"]])
def test_sweep_dry_run_refuses_a_seed_sqlite_cannot_hold(args, sweep_config, tmp_path, capsys):
    assert_fails_cleanly(["sweep", sweep_config, "--out", tmp_path / "run", "--dry-run", *args], capsys, tmp_path,
                         ("seeds[0]", "0 to 4294967295"))


def test_run_and_generate_refuse_a_huge_seed(tiny, tasks_file, tmp_path, capsys):
    assert_fails_cleanly(["run", "--model", tiny, "--tasks", tasks_file, "--press", "knorm", "--ratio", "0.5",
                          "--seed", str(2**64), "--out", tmp_path / "o.jsonl"], capsys, tmp_path, "--seed")
    assert_fails_cleanly(["tasks", "generate", "base", "--seed", str(2**64), "--out", tmp_path / "t.jsonl"], capsys,
                         tmp_path, "seed")


def _csv_with_ratio(run: Path, tmp_path: Path, cell: str) -> Path:
    """The run's CSV export with the first record's ratio cell replaced by ``cell`` (raw CSV text)."""
    from kvroute.sweep.export import export_records

    src, _ = export_records(run, "csv", tmp_path / "src.csv")
    lines = src.read_text(encoding="utf-8").split("\n")
    src.unlink()
    header = lines[0].split(",")
    i = header.index('"ratio"')
    row = lines[1].split(",")  # the first columns are plain scalars, none holding a comma
    assert i < 8
    row[i] = cell
    lines[1] = ",".join(row)
    out = tmp_path / "bad.csv"
    out.write_text("\n".join(lines), encoding="utf-8")
    return out


@pytest.mark.parametrize(("cell", "match"), [("", "'ratio'"), ("nan", "missing"), ('"nan"', "missing"),
                                             ('"abc"', "'abc'"), ('"1.5"', "[0, 1)"), ('"-0.5"', "[0, 1)")])
def test_report_refuses_a_csv_record_with_a_bad_ratio(cell, match, run_copy, tmp_path, capsys):
    bad = _csv_with_ratio(run_copy, tmp_path, cell)
    assert_fails_cleanly(["report", bad, "--n-boot", "10"], capsys, tmp_path, ("record 1", "'ratio'", match))


@pytest.mark.parametrize(("sql", "match"), [
    ("UPDATE records SET ratio = NULL WHERE rowid = 1", ("record 1", "'ratio'", "missing")),
    ("UPDATE records SET ratio = 'abc' WHERE rowid = 1", ("record 1", "'ratio'", "'abc'")),
    ("UPDATE records SET consensus_nosink = x'0102' WHERE rowid = 1", ("store", "blob of 2 bytes")),
], ids=["null-ratio", "text-ratio", "torn-blob"])
@pytest.mark.parametrize("command", [["report", "--n-boot", "10"], ["export", "--format", "csv"],
                                     ["export", "--format", "parquet"]], ids=["report", "csv", "parquet"])
def test_report_and_export_refuse_a_damaged_record(sql, match, command, run_copy, tmp_path, capsys):
    import sqlite3

    con = sqlite3.connect(run_copy / STORE_NAME)
    con.execute(sql)
    con.commit()
    con.close()
    assert_fails_cleanly([command[0], run_copy, *command[1:]], capsys, tmp_path, match)


@pytest.mark.parametrize("value", ["not a value", "mod:", ":Cls", "a.b:c:d", "1mod:Cls"])
def test_a_malformed_plugin_value_is_refused_in_one_line(value, sweep_config, tmp_path, capsys, monkeypatch):
    from tests.integration.test_press_plugins import _fresh_discovery, declare_plugins

    declare_plugins(tmp_path / "site", monkeypatch, {"oddpress": value}, dist="odd-plugins")
    try:
        assert_fails_cleanly(["sweep", sweep_config, "--out", tmp_path / "run", "--dry-run", "--press", "oddpress"],
                             capsys, tmp_path, "oddpress")
        code, out, err = cli(["presses", "list"], capsys)
        assert code == 0 and "Traceback" not in out + err, err
        assert "not module:Class" in " ".join(out.split())
    finally:
        _fresh_discovery()


# 9. readers that check what they read ---------------------------------------------------------------------
BOM = "\ufeff"


def test_a_task_file_with_a_byte_order_mark_reads(tasks_file, capsys):
    tasks_file.write_bytes(BOM.encode() + tasks_file.read_bytes())
    code, out, err = cli(["tasks", "show", tasks_file, "--json"], capsys)
    assert code == 0, err
    assert len(json.loads(out)) == 2


@pytest.mark.parametrize("suffix", ["csv", "jsonl"])
def test_an_import_with_a_byte_order_mark_reads(suffix, good_instance, tmp_path, capsys):
    row = {"context": good_instance["context"], "question": good_instance["question"],
           "answer": good_instance["answers"][0]}
    src = tmp_path / f"excel.{suffix}"
    if suffix == "csv":
        import csv
        import io

        buf = io.StringIO()
        w = csv.DictWriter(buf, fieldnames=list(row))
        w.writeheader()
        w.writerow(row)
        text = buf.getvalue()
    else:
        text = json.dumps(row) + "\n"
    src.write_text(BOM + text, encoding="utf-8")
    code, _, err = cli(["tasks", "import", src, "--out", tmp_path / "t.jsonl"], capsys)
    assert code == 0, err
    from kvroute.tasks import load_tasks

    (inst,) = load_tasks(tmp_path / "t.jsonl")
    assert inst.context == good_instance["context"]


def test_a_csv_export_with_a_byte_order_mark_reads_back(run_copy, tmp_path):
    from kvroute.analysis.load import load_records
    from kvroute.sweep.export import export_records

    path, n = export_records(run_copy, "csv", tmp_path / "r.csv")
    plain = load_records(path)
    path.write_bytes(BOM.encode() + path.read_bytes())
    with_bom = load_records(path)
    assert list(with_bom.columns) == list(plain.columns) and len(with_bom) == n


@pytest.mark.parametrize("version", ["0", "2", None])
@pytest.mark.parametrize("command", [["report", "--n-boot", "10"], ["export", "--format", "csv"]],
                         ids=["report", "export"])
def test_report_and_export_refuse_another_schema_version(version, command, run_copy, tmp_path, capsys):
    import sqlite3

    con = sqlite3.connect(run_copy / STORE_NAME)
    if version is None:
        con.execute("DELETE FROM meta WHERE key = 'schema_version'")
    else:
        con.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (version,))
    con.commit()
    con.close()
    assert_fails_cleanly([command[0], run_copy, *command[1:]], capsys, tmp_path, ("schema version", "reads version 1"))


@pytest.mark.parametrize(("field", "cell", "match"), [
    ("ratio", '"1.5"', "[0, 1)"),
    ("instance_id", '""', "non-empty"),
    ("instance_id", "nan", "non-empty"),
    ("hallucinated", '"maybe"', "true/false"),
    ("status", '"fine"', "ok, error"),
    ("seed", '"-3"', "non-negative"),
])
def test_report_refuses_a_csv_record_kvroute_could_not_have_written(field, cell, match, run_copy, tmp_path, capsys):
    import csv

    from kvroute.sweep.export import export_records

    src, _ = export_records(run_copy, "csv", tmp_path / "src.csv")
    rows = list(csv.reader(src.open(encoding="utf-8", newline="")))
    src.unlink()
    i = rows[0].index(field)
    lines = []
    for r, row in enumerate(rows):
        cells = ["nan" if c == "nan" else '"' + c.replace('"', '""') + '"' for c in row]  # kvroute's dialect
        if r == 1:
            cells[i] = cell
        lines.append(",".join(cells))
    bad = tmp_path / "bad.csv"
    bad.write_text("\n".join(lines) + "\n", encoding="utf-8")
    assert_fails_cleanly(["report", bad, "--n-boot", "10"], capsys, tmp_path, ("record 1", repr(field), match))


def test_two_spellings_of_one_ratio_are_one_ratio(sweep_config, tiny, tasks_file, tmp_path, capsys):
    assert_fails_cleanly(["sweep", sweep_config, "--out", tmp_path / "run", "--dry-run",
                          "--ratios", "0,0.5,0.5000000000000001"], capsys, tmp_path, ("ratios[2]", "twice"))
    assert_fails_cleanly(["run", "--model", tiny, "--tasks", tasks_file, "--press", "knorm", "--ratio", "0.5",
                          "--ratio", "0.5000000000000001", "--out", tmp_path / "o.jsonl"], capsys, tmp_path,
                         "given twice")
    from kvroute.presses import check_ratio

    assert check_ratio(0.5000000000000001) == 0.5 and check_ratio(0.1 + 0.2) == 0.3
    assert check_ratio(0.123456789) == 0.123456789  # ratios as people write them are kept as written


def test_an_empty_store_exports_a_header_only_csv(tmp_path, capsys):
    import pandas as pd

    from kvroute.sweep.store import Store

    with Store.open(tmp_path / "run"):
        pass
    code, _, err = cli(["export", tmp_path / "run", "--format", "csv", "--out", tmp_path / "r.csv"], capsys)
    assert code == 0, err
    text = (tmp_path / "r.csv").read_text()
    assert text.strip() and text.count("\n") == 1, text  # one header line, no rows
    assert len(pd.read_csv(tmp_path / "r.csv")) == 0


# 7. sizes bounded where they enter; --dry-run sizes without generating ---------------------------------------
@pytest.mark.parametrize(("args", "match"), [
    (["--target-tokens", "100000000"], ("target_tokens", "1048576")),
    (["--target-tokens", "1000000", "--n", "1000"], ("target_tokens", "at most")),
])
def test_generate_refuses_unbounded_sizes(args, match, tmp_path, capsys):
    assert_fails_cleanly(["tasks", "generate", "base", "--out", tmp_path / "t.jsonl", *args], capsys, tmp_path, match)


def test_sweep_refuses_unbounded_target_tokens(sweep_config, tmp_path, capsys):
    assert_fails_cleanly(["sweep", sweep_config, "--out", tmp_path / "run", "--dry-run",
                          "--set", "tasks.0.target_tokens=100000000"], capsys, tmp_path, "target_tokens")


def test_sweep_dry_run_sizes_without_generating(sweep_config, tmp_path, capsys, monkeypatch):
    import kvroute.models
    import kvroute.sweep.tasks
    import kvroute.tasks

    def refuse(*args, **kwargs):
        raise AssertionError("a dry run generated tasks or loaded a tokenizer")

    for mod in (kvroute.sweep.tasks, kvroute.tasks):
        monkeypatch.setattr(mod, "generate_tasks", refuse)
    monkeypatch.setattr(kvroute.models, "load_tokenizer", refuse)
    code, out, err = cli(["sweep", sweep_config, "--out", tmp_path / "run", "--dry-run",
                          "--set", "tasks.0.target_tokens=1000000", "--set", "tasks.0.n=100"], capsys)
    assert code == 0, err
    text = " ".join(out.split())
    assert "200 cells = 100 units" in text and ": 100" in text, text
    assert not (tmp_path / "run").exists()


def test_dry_run_sizes_as_the_plan_does(sweep_config, good_instance, tmp_path):
    from kvroute.sweep import load_sweep_config
    from kvroute.sweep.driver import plan_sweep, size_sweep

    (tmp_path / "mine.jsonl").write_text(json.dumps({**good_instance, "id": "q1"}) + "\n")
    for extra in ([], ["regimes=[\"agnostic\", \"aware\"]", "seeds=[0, 1]", "ratios=[0, 0.5, 0.9]"],
                  [f"tasks=[{{file = \"{tmp_path / 'mine.jsonl'}\"}}, {{family = \"base\", n = 3}}]"]):
        cfg = load_sweep_config(sweep_config, extra)
        assert size_sweep(cfg) == plan_sweep(cfg).describe(), extra


# 10. smaller: messages that point at what exists, a report written into the current folder --------------------
@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="needs a machine without CUDA")
def test_sweep_with_a_cuda_model_on_a_cpu_machine_names_the_config_key(tiny, tmp_path, capsys):
    cfg = tmp_path / "cuda.toml"
    cfg.write_text(f'presses = ["knorm"]\nratios = [0, 0.5]\n[[models]]\nname = "{tiny}"\ndevice = "cuda"\n'
                   '[[tasks]]\nfamily = "base"\nn = 1\n')
    line = assert_fails_cleanly(["sweep", cfg, "--out", tmp_path / "run"], capsys, tmp_path,
                                ("models[0].device", "cuda", 'device = "cpu"'))
    assert "--device" not in line


def test_presses_check_help_keeps_its_brackets(capsys):
    code, out, err = cli(["presses", "check", "--help"], capsys)
    assert code == 0, err
    assert "[key=value] and +selection" in " ".join(out.replace("│", " ").split())


def test_no_help_text_loses_brackets_to_markup():
    """Rich markup reads [word] as a tag and drops it; every bracket in a help text is escaped (\\[)."""
    import re

    import typer.main

    from kvroute.cli import app

    def walk(cmd, path=()):
        yield path, cmd
        for name, sub in getattr(cmd, "commands", {}).items():
            yield from walk(sub, (*path, name))

    bad = []
    for path, cmd in walk(typer.main.get_command(app)):
        for text in [cmd.help or "", *(getattr(p, "help", None) or "" for p in cmd.params)]:
            if re.search(r"(?<!\\)\[[a-z_]+(=[^\]]*)?\]", text):
                bad.append((" ".join(path), text))
    assert not bad, bad


def test_report_into_the_current_empty_folder(run_copy, tmp_path, capsys, monkeypatch):
    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    code, out, err = cli(["report", run_copy, "--out", ".", "--n-boot", "10"], capsys)
    assert code == 0, err
    assert (here / "report.html").is_file() and (here / "summary.json").is_file()
    assert Path.cwd() == here and here.is_dir()  # still standing in the same folder
    code, out, err = cli(["report", run_copy, "--out", ".", "--n-boot", "10"], capsys)  # again, over its own report
    assert code == 0, err


def test_write_folder_never_swaps_the_working_directory(tmp_path, monkeypatch):
    from kvroute.files import write_folder

    monkeypatch.chdir(tmp_path)
    inode = tmp_path.stat().st_ino
    write_folder(".", {"a.txt": b"1"})
    write_folder(tmp_path, {"a.txt": b"2"})
    assert (tmp_path / "a.txt").read_bytes() == b"2" and tmp_path.stat().st_ino == inode


def test_a_foreign_csv_with_a_byte_order_mark_loads(tmp_path):
    from kvroute.analysis.load import load_records

    f = tmp_path / "foreign.csv"  # pandas' dialect (bare values), not kvroute's: read by pandas
    f.write_text(BOM + "model,instance_id,press,ratio,f1\nm,a,none,0,1.0\nm,a,knorm,0.5,0.5\n", encoding="utf-8")
    df = load_records(f)
    assert list(df.columns)[:2] == ["model", "instance_id"] and list(df["ratio"]) == [0, 0.5]


def test_tickets_file_with_a_bom_reads_and_a_deep_line_is_refused(tmp_path):
    from kvroute.analysis.tickets import load_tickets
    from kvroute.errors import StoreError

    f = tmp_path / "tickets.jsonl"
    f.write_text(BOM + json.dumps({"model": "m", "entries": 3}) + "\n", encoding="utf-8")
    assert load_tickets(tmp_path).to_dict("records") == [{"model": "m", "entries": 3}]
    f.write_text("[" * 100_000 + "]" * 100_000 + "\n")
    with pytest.raises(StoreError, match="line 1.*nested more than"):
        load_tickets(tmp_path)


def test_ticket_refuses_to_append_to_its_task_file(tiny, tasks_file, tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    tickets = run / "tickets.jsonl"
    tickets.write_bytes(tasks_file.read_bytes())
    assert_fails_cleanly(["ticket", "--model", tiny, "--tasks", tickets, "--out", run], capsys, tmp_path,
                         ("tickets file", "task file"))
