"""The bad-input and fault catalogue (issue 20): every case runs the real ``kvroute`` entry point
(:func:`kvroute.cli.main`, in process) on tiny models and asserts either the correct output or

* a one-line error on stderr (``error: ...``) naming what is wrong, a nonzero exit code, no traceback;
* no file left behind (nothing new in the case's folder: no temp files, no partial outputs);
* every pre-existing file byte-identical after the failure.

Cases that need a model use the tiny random Llama/Qwen2 of :func:`kvroute.models.save_tiny_model`.
"""

from __future__ import annotations

import errno
import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

import kvroute.errors
import kvroute.files
from kvroute.analysis.load import load_records
from kvroute.cli import main
from kvroute.models import save_tiny_model
from kvroute.sweep.export import export_records
from kvroute.sweep.store import STORE_NAME, Store
from kvroute.tasks import TaskSpec, generate_tasks, save_tasks

# files a sweep's store keeps next to it while open (not outputs; SQLite removes -wal/-shm on close)
_VOLATILE = ("-wal", "-shm", ".lock")


# helpers ---------------------------------------------------------------------------------------------
def cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """Run ``kvroute ARGV`` in process; returns (exit code, stdout, stderr). Uncaught exceptions propagate."""
    capsys.readouterr()
    try:
        main([str(a) for a in argv])
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    out, err = capsys.readouterr()
    return code, out, err


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and not p.name.endswith(_VOLATILE)}


def assert_one_line_error(code: int, out: str, err: str, match: str | tuple[str, ...]) -> str:
    assert code != 0, (out, err)
    assert "Traceback" not in out + err, err
    lines = [line for line in err.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("error: ")]
    assert len(errors) == 1 and lines[-1] == errors[0], err  # progress lines may come before; the error is one line
    line = errors[0]
    for m in (match,) if isinstance(match, str) else match:
        assert m.lower() in line.lower(), (m, line)
    return line


def assert_fails_cleanly(argv: list[str], capsys: pytest.CaptureFixture[str], root: Path,
                         match: str | tuple[str, ...]) -> str:
    """The command fails with one line matching ``match``; nothing under ``root`` appears or changes."""
    before = snapshot(root)
    code, out, err = cli(argv, capsys)
    line = assert_one_line_error(code, out, err, match)
    after = snapshot(root)
    assert sorted(after) == sorted(before), f"files appeared or vanished: {set(after) ^ set(before)}"
    changed = [k for k in before if before[k] != after[k]]
    assert not changed, f"pre-existing files changed: {changed}"
    return line


# fixtures ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_model(tmp_path_factory.mktemp("bad-inputs-model") / "tiny-llama", "llama", seed=0)


@pytest.fixture(scope="module")
def good_instance() -> dict:
    return generate_tasks(TaskSpec("base", n=1, seed=0))[0].to_dict()


CONFIG = """
name = "bad-inputs"
models = ["{model}"]
presses = ["knorm"]
ratios = [0, 0.5]

[[tasks]]
family = "base"
n = 2

[decoding]
max_new_tokens = 3
"""


@pytest.fixture(scope="module")
def sweep_config(tiny: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    p = tmp_path_factory.mktemp("bad-inputs-config") / "sweep.toml"
    p.write_text(CONFIG.format(model=tiny))
    return p


@pytest.fixture(scope="module")
def finished_run(sweep_config: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One small complete sweep (2 instances × 2 cells); cases copy it before touching it."""
    from kvroute.sweep import load_sweep_config, run_sweep

    run = tmp_path_factory.mktemp("bad-inputs-run") / "run"
    res = run_sweep(load_sweep_config(sweep_config), run)
    assert res.computed == 4
    return run


@pytest.fixture
def run_copy(finished_run: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "run"
    shutil.copytree(finished_run, dst)
    return dst


@pytest.fixture
def tasks_file(tmp_path: Path) -> Path:
    p = tmp_path / "tasks.jsonl"
    save_tasks(generate_tasks(TaskSpec("base", n=2, seed=0)), p)
    return p


# 1. press parameters: refused at config time (sweep --dry-run), with the parameter and the range ----------
BAD_PRESSES = [
    ("snapkv[window_size=-5]", "window_size"),
    ("snapkv[window_size=0]", "window_size"),
    ("snapkv[kernel_size=0]", "kernel_size"),
    ("snapkv[kernel_size=-1]", "kernel_size"),
    ("snapkv[kernel_size=4]", "odd"),
    ("snapkv[kernel_size=2.5]", "integer"),
    ("expected_attention[n_sink=-1]", "n_sink"),
    ("streaming_llm[n_sink=-1]", "n_sink"),
    ("expected_attention[epsilon=nan]", "finite"),
    ("expected_attention[epsilon=inf]", "finite"),
    ("expected_attention[epsilon=-1]", "epsilon"),
    ("expected_attention[n_future_positions=0]", "n_future_positions"),
    ("expected_attention[use_covariance=1]", "true or false"),
    ("random[seed=-2]", "seed"),
    ("knorm+adakv[alpha_safeguard=1.5]", "alpha_safeguard"),
    ("knorm+adakv[alpha_safeguard=nan]", "finite"),
    ("knorm+routes[coverage=-0.1]", "coverage"),
    ("knorm+chunk[chunk_length=0]", "chunk_length"),
    ("knorm+pyramid[beta=0]", "beta"),
    ("knorm+pyramid[window_size=-1]", "window_size"),
    ("oracle[base=snapkv[window_size=-5]]", "window_size"),
    ("snapkv[window=8]", "did you mean"),
    ("snapkvv", "did you mean"),
    ("knorm+per_headd", "did you mean"),
    ("snapkv[window_size]", "key=value"),
    ("knorm+adakv+chunk", "only serving constraints may"),
    # serving constraints (kvroute.presses.constraints)
    ("knorm+paged[block=0]", "block"),
    ("knorm+paged[agg=median]", "agg"),
    ("knorm+criticalkv+paged[block=16]", "per-token scores"),
    ("knorm+block+uniform", "iteratively"),
    ("knorm+uniform+uniform", "appears 2 times"),
    ("snapkv[window_size=8", "cannot read"),
    # kvpress presses kvroute cannot run as asked: hub weights not given, a ratio the press decides itself
    ("qfilter", "weights=FOLDER"),
    ("kvzap[weights=/nonexistent/kvzap]", "does not exist"),
    ("expected_attention_stats+adakv", "stats_folder=FOLDER"),
    ("duo_attention", "cannot follow a ratio grid"),
    ("dms", "threshold"),
]


@pytest.mark.parametrize(("press", "match"), BAD_PRESSES, ids=[p for p, _ in BAD_PRESSES])
def test_sweep_dry_run_refuses_bad_press(press, match, sweep_config, tmp_path, capsys):
    assert_fails_cleanly(["sweep", sweep_config, "--out", tmp_path / "run", "--dry-run", "--press", press],
                         capsys, tmp_path, ("presses[0]", match))


GOOD_PRESSES = ["snapkv[kernel_size=3]", "snapkv[kernel_size=1,window_size=1]", "expected_attention[n_sink=0]",
                "streaming_llm[n_sink=0]", "knorm+adakv[alpha_safeguard=0]", "random[seed=-1]",
                "expected_attention[epsilon=0.5]"]


@pytest.mark.parametrize("press", GOOD_PRESSES)
def test_sweep_dry_run_accepts_edge_press(press, sweep_config, tmp_path, capsys):
    code, out, err = cli(["sweep", sweep_config, "--out", tmp_path / "run", "--dry-run", "--press", press], capsys)
    assert code == 0, err
    assert "valid" in out and not (tmp_path / "run").exists()


@pytest.mark.parametrize(("press", "match"), BAD_PRESSES[:6] + BAD_PRESSES[7:9],
                         ids=[p for p, _ in BAD_PRESSES[:6] + BAD_PRESSES[7:9]])
def test_run_refuses_bad_press_before_loading(press, match, tiny, tasks_file, tmp_path, capsys):
    assert_fails_cleanly(["run", "--model", tiny, "--tasks", tasks_file, "--press", press, "--ratio", "0.5",
                          "--out", tmp_path / "o.jsonl"], capsys, tmp_path, match)


def test_every_numeric_press_parameter_has_a_schema():
    """The schema is the one place ranges live: no numeric parameter of a scorer or selection goes unchecked."""
    from kvroute.presses import SCORERS, SELECTIONS

    missing = []
    for kind, registry in (("scorer", SCORERS), ("selection", SELECTIONS)):
        for name, cls in registry.items():
            for k, v in cls.parameters().items():
                if isinstance(v, int | float) and not isinstance(v, bool) and k not in cls.schema:
                    missing.append(f"{kind} {name}.{k}")
    assert not missing, missing


# 2. task files: refused with the line and the field, before any model loads -------------------------
def _mutate(d: dict, **changes) -> dict:
    d = dict(d)
    for k, v in changes.items():
        if v is _DROP:
            d.pop(k)
        else:
            d[k] = v
    return d


_DROP = object()
BAD_TASKS = [
    ("id-newline", {"id": "a\nb"}, ("line 1", "'id'", "control")),
    ("id-nul", {"id": "a\x00b"}, ("line 1", "'id'", "control")),
    ("id-tab", {"id": "a\tb"}, ("'id'", "control")),
    ("id-escape", {"id": "\x1b[31mred"}, ("'id'", "control")),
    ("id-cr", {"id": "a\rb"}, ("'id'", "control")),
    ("id-line-separator", {"id": "a\u2028b"}, ("'id'", "control")),
    ("id-empty", {"id": ""}, ("'id'", "non-empty")),
    ("id-number", {"id": 5}, ("'id'",)),
    ("id-too-long", {"id": "x" * 600}, ("'id'", "at most")),
    ("context-empty", {"context": ""}, ("'context'",)),
    ("answers-empty", {"answers": []}, ("'answers'",)),
    ("unknown-field", {"foo": 1}, ("'foo'", "unknown")),
    ("missing-question", {"question": _DROP}, ("'question'", "missing")),
    ("span-out-of-range", {"answer_spans": [[0, 10_000]]}, ("'answer_spans'", "out of range")),
    ("unanswerable-not-bool", {"unanswerable": "yes"}, ("'unanswerable'",)),
    ("version-negative", {"version": -1}, ("'version'",)),
]


@pytest.mark.parametrize(("case", "changes", "match"), BAD_TASKS, ids=[c for c, _, _ in BAD_TASKS])
def test_run_refuses_bad_task_line(case, changes, match, good_instance, tiny, tmp_path, capsys):
    f = tmp_path / "bad.jsonl"
    f.write_text(json.dumps(_mutate(good_instance, **changes)) + "\n", encoding="utf-8")
    assert_fails_cleanly(["run", "--model", tiny, "--tasks", f, "--press", "knorm", "--ratio", "0.5",
                          "--out", tmp_path / "o.jsonl"], capsys, tmp_path, match)


BAD_TASK_FILES = [
    ("invalid-json-line-2", lambda g: (json.dumps(g) + "\n{not json\n").encode(), ("line 2", "invalid json")),
    ("not-utf8", lambda g: b'{"id": "\xff\xfe"}\n', ("not utf-8",)),
    ("duplicate-ids", lambda g: (json.dumps(g) + "\n" + json.dumps(g) + "\n").encode(), ("line 2", "duplicate id")),
    ("json-not-a-list", lambda g: json.dumps(g).encode(), ("must hold a list",)),
    ("json-array-line", lambda g: b"[1, 2]\n", ("line 1", "json object")),
]


@pytest.mark.parametrize(("case", "content", "match"), BAD_TASK_FILES, ids=[c for c, _, _ in BAD_TASK_FILES])
def test_run_refuses_bad_task_file(case, content, match, good_instance, tiny, tmp_path, capsys):
    f = tmp_path / ("bad.json" if case == "json-not-a-list" else "bad.jsonl")
    f.write_bytes(content(good_instance))
    assert_fails_cleanly(["run", "--model", tiny, "--tasks", f, "--press", "knorm", "--ratio", "0.5",
                          "--out", tmp_path / "o.jsonl"], capsys, tmp_path, match)


def test_run_refuses_a_directory_as_task_file(tiny, tmp_path, capsys):
    (tmp_path / "dir.jsonl").mkdir()
    assert_fails_cleanly(["run", "--model", tiny, "--tasks", tmp_path / "dir.jsonl", "--press", "knorm",
                          "--ratio", "0.5", "--out", tmp_path / "o.jsonl"], capsys, tmp_path, "no such file")


# 3. sweep configs: refused at --dry-run, naming the key ------------------------------------------------
BAD_SWEEP_ARGS = [
    (["--ratios", "1.0"], "ratios[0]"),
    (["--ratios", "-0.1"], "ratios[0]"),
    (["--ratios", "nan"], "ratios[0]"),
    (["--ratios", "abc"], "comma-separated"),
    (["--ratios", "0.5,0.5"], "twice"),
    (["--seeds", "-1"], "seeds[0]"),
    (["--max-new-tokens", "0"], "max_new_tokens"),
    (["--max-new-tokens", "-1"], "max_new_tokens"),
    (["--set", "decoding.batch_size=0"], "batch_size"),
    (["--set", "decoding.answer_prefix=5"], "answer_prefix"),
    (["--set", "nope.key=1"], "nope"),
    (["--set", 'metrics=["nope"]'], "metrics[0]"),
    (["--models", "/no/such/model/folder"], "no such model folder"),
    (["--models", "smollm3"], "did you mean"),
    (["--regimes", "sideways"], "regimes[0]"),
    (["--backend", "spark"], "unknown backend"),
    (["--new-settings"], "--resume"),
]


@pytest.mark.parametrize(("args", "match"), BAD_SWEEP_ARGS, ids=[" ".join(a) for a, _ in BAD_SWEEP_ARGS])
def test_sweep_dry_run_refuses_bad_config(args, match, sweep_config, tmp_path, capsys):
    assert_fails_cleanly(["sweep", sweep_config, "--out", tmp_path / "run", "--dry-run", *args], capsys, tmp_path,
                         match)


@pytest.mark.parametrize(("name", "text", "match"), [
    ("missing.toml", None, "missing.toml"),
    ("broken.toml", "models = [\n", "broken.toml"),
    ("empty-grid.toml", 'models = ["x"]\n', "empty-grid.toml"),
])
def test_sweep_refuses_bad_config_file(name, text, match, tmp_path, capsys):
    if text is not None:
        (tmp_path / name).write_text(text)
    assert_fails_cleanly(["sweep", tmp_path / name, "--out", tmp_path / "run", "--dry-run"], capsys, tmp_path, match)


# 4. output paths and OS errors: one line naming the path and the fix --------------------------------
def test_run_out_naming_a_directory(tiny, tasks_file, tmp_path, capsys):
    (tmp_path / "outdir").mkdir()
    assert_fails_cleanly(["run", "--model", tiny, "--tasks", tasks_file, "--press", "knorm", "--ratio", "0.5",
                          "--out", tmp_path / "outdir"], capsys, tmp_path, ("outdir", "is a directory"))


def test_run_out_below_a_file(tiny, tasks_file, tmp_path, capsys):
    (tmp_path / "afile").write_text("keep me")
    assert_fails_cleanly(["run", "--model", tiny, "--tasks", tasks_file, "--press", "knorm", "--ratio", "0.5",
                          "--out", tmp_path / "afile" / "o.jsonl"], capsys, tmp_path, ("afile", "not a folder"))


def test_export_out_naming_a_directory(run_copy, tmp_path, capsys):
    (tmp_path / "exp").mkdir()
    assert_fails_cleanly(["export", run_copy, "--format", "csv", "--out", tmp_path / "exp"], capsys, tmp_path,
                         "is a directory")


def test_export_unknown_format(run_copy, tmp_path, capsys):
    assert_fails_cleanly(["export", run_copy, "--format", "xml"], capsys, tmp_path, "unknown export format")


def test_export_missing_run(tmp_path, capsys):
    assert_fails_cleanly(["export", tmp_path / "nope"], capsys, tmp_path, "no such run directory")


def test_tasks_generate_out_naming_a_directory(tmp_path, capsys):
    (tmp_path / "t.jsonl").mkdir()
    assert_fails_cleanly(["tasks", "generate", "base", "--n", "1", "--out", tmp_path / "t.jsonl"], capsys, tmp_path,
                         ("t.jsonl", "is a directory"))


def test_sweep_out_naming_a_file(sweep_config, tmp_path, capsys):
    (tmp_path / "run").write_text("not a folder")
    assert_fails_cleanly(["sweep", sweep_config, "--out", tmp_path / "run"], capsys, tmp_path, "run")


def _fail_fsync(code: int):
    def fsync(fd: int) -> None:
        raise OSError(code, __import__("os").strerror(code))
    return fsync


def _fail_mkstemp(code: int):
    def mkstemp(*a, dir=None, **k):  # noqa: A002
        raise OSError(code, __import__("os").strerror(code), str(dir))
    return mkstemp


@pytest.mark.parametrize(("fault", "code", "match"), [
    ("fsync", errno.ENOSPC, "no space left"),
    ("fsync", errno.EDQUOT, "quota"),
    ("fsync", errno.EIO, "check the path"),
    ("mkstemp", errno.EROFS, "read-only"),
    ("mkstemp", errno.EACCES, "permission denied"),
])
@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_export_disk_faults_keep_the_old_file(fault, code, match, fmt, run_copy, tmp_path, capsys, monkeypatch):
    """A full disk, a read-only folder or an I/O error while exporting: one line, the previous export intact."""
    old = run_copy / f"records.{fmt}"
    old.write_bytes(b"previous export")
    if fault == "fsync":
        monkeypatch.setattr(kvroute.files.os, "fsync", _fail_fsync(code))
    else:
        monkeypatch.setattr(kvroute.files.tempfile, "mkstemp", _fail_mkstemp(code))
    assert_fails_cleanly(["export", run_copy, "--format", fmt], capsys, tmp_path, match)


def test_tasks_generate_full_disk_leaves_no_partial_file(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(kvroute.files.os, "fsync", _fail_fsync(errno.ENOSPC))
    assert_fails_cleanly(["tasks", "generate", "base", "--n", "2", "--out", tmp_path / "t.jsonl"], capsys, tmp_path,
                         "no space left")


def test_sweep_full_disk_keeps_the_store_and_the_manifest(run_copy, sweep_config, tmp_path, capsys, monkeypatch):
    """Resuming a finished run on a full disk: the manifest write fails, the store is untouched and says so."""
    monkeypatch.setattr(kvroute.files.os, "fsync", _fail_fsync(errno.ENOSPC))
    assert_fails_cleanly(["sweep", sweep_config, "--out", run_copy, "--resume"], capsys, tmp_path,
                         ("no space left", "--resume"))
    assert len(load_records(run_copy)) == 4


# 5. `run --out FILE`: nothing is truncated before the work succeeds ----------------------------------
def test_run_failure_keeps_the_previous_out_file(tiny, tasks_file, tmp_path, capsys, monkeypatch):
    out = tmp_path / "o.jsonl"
    out.write_text('{"previous": true}\n')
    import kvroute.runner

    real = kvroute.runner.run_instance
    calls = []

    def failing(*a, **k):
        calls.append(1)
        if len(calls) > 1:
            raise kvroute.errors.KvrouteError("simulated failure in the second instance")
        return real(*a, **k)

    monkeypatch.setattr(kvroute.runner, "run_instance", failing)
    assert_fails_cleanly(["run", "--model", tiny, "--tasks", tasks_file, "--press", "knorm", "--ratio", "0.5",
                          "--max-new-tokens", "2", "--out", out], capsys, tmp_path, "simulated failure")


def test_run_success_replaces_the_out_file(tiny, tasks_file, tmp_path, capsys):
    out = tmp_path / "o.jsonl"
    out.write_text('{"previous": true}\n')
    code, _, err = cli(["run", "--model", tiny, "--tasks", tasks_file, "--press", "knorm", "--ratio", "0.5",
                        "--max-new-tokens", "2", "--out", out], capsys)
    assert code == 0, err
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(recs) == 2 and all("previous" not in r for r in recs)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["o.jsonl", "tasks.jsonl"]


# 6. resume: a changed configuration is refused, naming the keys; a damaged store is named ---------------
@pytest.mark.parametrize(("args", "match"), [
    (["--max-new-tokens", "5"], "decoding.max_new_tokens: 3 → 5"),
    (["--set", "decoding.answer_prefix=Answer:"], "decoding.answer_prefix"),
    (["--set", 'decoding.system_prompt="Be brief."'], "decoding.system_prompt"),
    (["--set", 'metrics=["retention"]'], "metrics"),
])
def test_resume_refuses_changed_settings(args, match, run_copy, sweep_config, tmp_path, capsys):
    line = assert_fails_cleanly(["sweep", sweep_config, "--out", run_copy, "--resume", *args], capsys, tmp_path,
                                (match, "--new-settings"))
    assert str(run_copy) in line


def test_resume_with_the_same_settings_computes_nothing(run_copy, sweep_config, capsys):
    code, out, err = cli(["sweep", sweep_config, "--out", run_copy, "--resume"], capsys)
    assert code == 0, err
    assert "0 cells computed, 4 already in the store" in " ".join(out.split())


def test_resume_with_new_settings_on_purpose(run_copy, sweep_config, capsys):
    code, out, err = cli(["sweep", sweep_config, "--out", run_copy, "--resume", "--new-settings",
                          "--max-new-tokens", "2"], capsys)
    assert code == 0, err
    assert "4 cells computed" in " ".join(out.split())
    with Store.open(run_copy) as s:
        assert s.count() == 8
    # both settings are now the run's: resuming with either is fine
    for extra in ([], ["--max-new-tokens", "2"]):
        code, out, err = cli(["sweep", sweep_config, "--out", run_copy, "--resume", *extra], capsys)
        assert code == 0, err


def test_resume_may_extend_the_grid(run_copy, sweep_config, capsys):
    code, out, err = cli(["sweep", sweep_config, "--out", run_copy, "--resume", "--press", "knorm",
                          "--press", "tova"], capsys)
    assert code == 0, err
    assert "2 cells computed, 4 already in the store" in " ".join(out.split())


def test_rerun_without_resume_is_refused(run_copy, sweep_config, tmp_path, capsys):
    assert_fails_cleanly(["sweep", sweep_config, "--out", run_copy], capsys, tmp_path, "--resume")


def _corrupt(run: Path) -> None:
    """Overwrite the cells of the records table's root b-tree page (its 12-byte page header kept)."""
    import sqlite3

    db = run / STORE_NAME
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        (root,) = con.execute("SELECT rootpage FROM sqlite_master WHERE name = 'records'").fetchone()
        (page,) = con.execute("PRAGMA page_size").fetchone()
    finally:
        con.close()
    data = bytearray(db.read_bytes())
    off = (root - 1) * page
    data[off + 12: off + page] = b"\xff" * (page - 12)
    db.write_bytes(bytes(data))


@pytest.mark.parametrize("command", ["resume", "report", "export-csv", "export-parquet"])
def test_damaged_store_is_named(command, run_copy, sweep_config, tmp_path, capsys):
    _corrupt(run_copy)
    argv = {"resume": ["sweep", sweep_config, "--out", run_copy, "--resume"],
            "report": ["report", run_copy, "--n-boot", "10"],
            "export-csv": ["export", run_copy, "--format", "csv"],
            "export-parquet": ["export", run_copy]}[command]
    assert_fails_cleanly(argv, capsys, tmp_path, (STORE_NAME, "damaged"))


def test_store_that_is_not_sqlite(run_copy, sweep_config, tmp_path, capsys):
    (run_copy / STORE_NAME).write_bytes(b"this is not a database" * 100)
    assert_fails_cleanly(["sweep", sweep_config, "--out", run_copy, "--resume"], capsys, tmp_path, STORE_NAME)


def test_manifest_that_is_not_json(run_copy, tmp_path, capsys):
    (run_copy / "manifest.json").write_text("{torn")
    assert_fails_cleanly(["report", run_copy, "--n-boot", "10"], capsys, tmp_path, ("manifest.json", "json"))


# 7. CSV export: every text field quoted, the round trip exact --------------------------------------------
NASTY = ["M5\r5", "a\nb", "a\r\nb", "\r", "a,b", 'say "hi"', '"', "ünï©ødé ✓ 漢字 🙂", "", " ", "  spaced  ",
         "True", "False", "[1, 2]", '{"a": 1}', "nan", "None", "NULL", "1e5", "007", "-0", "tab\there",
         "\u2028line sep", "\x00nul", "=1+1"]


def _store_with(run: Path, answer: str) -> list[dict]:
    recs = [
        {"key": "a", "model": "m", "instance_id": "i1", "press": "knorm", "ratio": 0.5, "answer": answer,
         "f1": 0.25, "exact": 0, "hallucinated": True, "reachable": None, "consensus_nosink": [0.5, 0.25],
         "hidden_cosine": [0.1, 0.2, 0.30000001], "lens_candidates": [[1.5, -2.0], [3.0]], "status": "ok",
         "error": None, "evidence_heads": 3, "routed_p": float("inf")},
        {"key": "b", "model": "m", "instance_id": answer or "empty", "press": "none", "ratio": 0.0, "answer": None,
         "f1": None, "exact": None, "hallucinated": False, "reachable": True, "consensus_nosink": None,
         "hidden_cosine": [1e-300, -0.0], "lens_candidates": [], "status": "ok", "error": answer,
         "evidence_heads": None, "routed_p": 1e-17},
    ]
    with Store.open(run) as s:
        s.write(recs)
    return recs


@pytest.mark.parametrize("answer", NASTY, ids=[repr(a) for a in NASTY])
def test_export_round_trip_is_exact(answer, tmp_path):
    run = tmp_path / "run"
    _store_with(run, answer)
    ref = load_records(run)
    csv_path, n = export_records(run, "csv")
    pq_path, _ = export_records(run, "parquet")
    assert n == 2
    for path in (csv_path, pq_path):
        got = load_records(path)
        pd.testing.assert_frame_equal(got, ref)
        for col in ref.columns:  # the same Python types too (lists, not arrays; bools; None)
            assert [type(v) for v in got[col]] == [type(v) for v in ref[col]], col
    assert len(pd.read_csv(csv_path)) == 2  # other CSV readers see two rows too
    assert sorted(p.name for p in run.iterdir() if not p.name.endswith(_VOLATILE)) == [
        "records.csv", "records.parquet", STORE_NAME]


def test_export_of_a_real_sweep_round_trips(run_copy):
    ref = load_records(run_copy)
    for fmt in ("csv", "parquet"):
        path, n = export_records(run_copy, fmt)
        assert n == len(ref) == 4
        pd.testing.assert_frame_equal(load_records(path), ref)


def test_foreign_csv_still_loads(tmp_path):
    p = tmp_path / "records.csv"
    pd.DataFrame({"model": ["m"], "f1": [0.5], "hallucinated": [True], "answer": ["x"]}).to_csv(p, index=False)
    df = load_records(p)
    assert df["f1"].tolist() == [0.5] and df["hallucinated"].tolist() == [True]


# 8. names built from data: no path escapes the output folder ----------------------------------------------
SAFE_NAME_CASES = ["../../../../escaped_outside_run", "a/b", "..", ".", ".hidden", "a\\b", "x" * 500, "",
                   "a\x00b", "ünï", "con:x", "a b", "-", "ok-id_1.2", "0123456789abcdef"]


@pytest.mark.parametrize("text", SAFE_NAME_CASES, ids=[repr(t[:20]) for t in SAFE_NAME_CASES])
def test_safe_name_stays_in_its_folder(text, tmp_path):
    from kvroute.files import safe_name

    name = safe_name(text)
    assert name and len(name) <= 120 and not name.startswith(".")
    assert all(c.isascii() and (c.isalnum() or c in "._-") for c in name), name
    assert (tmp_path / name).resolve().parent == tmp_path.resolve()
    if text in ("ok-id_1.2", "0123456789abcdef", "-"):
        assert name == text  # ordinary names are left alone
    others = [safe_name(t) for t in SAFE_NAME_CASES if t != text]
    assert name not in others  # distinct ids never share a file


@pytest.mark.parametrize("iid", ["../../../../escaped_outside_run", "a/b/c", "..", ".hidden"])
def test_ticket_files_stay_in_the_run_dir(iid, tiny, good_instance, tmp_path, capsys):
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps({**good_instance, "id": iid}) + "\n")
    run = tmp_path / "sub" / "run"
    code, out, err = cli(["ticket", "--model", tiny, "--tasks", tasks, "--instance", iid, "--target", "full",
                          "--max-new-tokens", "2", "--max-evaluations", "6", "--out", run], capsys)
    assert code == 0, err
    outside = [p for p in tmp_path.rglob("*") if p.is_file() and run not in p.parents and p != tasks]
    assert not outside, outside
    files = sorted(p.name for p in (run / "tickets").iterdir())
    assert files and all(p.endswith((".npz", ".png")) for p in files)
    assert json.loads((run / "tickets.jsonl").read_text())["instance_id"] == iid


def test_ticket_unknown_instance(tiny, tasks_file, tmp_path, capsys):
    assert_fails_cleanly(["ticket", "--model", tiny, "--tasks", tasks_file, "--instance", "nope", "--out",
                          tmp_path / "run"], capsys, tmp_path, "unknown instance id")


# 9. the atomic writer itself ---------------------------------------------------------------------------
def test_atomic_write_keeps_old_bytes_on_exception(tmp_path):
    from kvroute.files import atomic_write

    p = tmp_path / "f.txt"
    p.write_text("old")
    with pytest.raises(RuntimeError), atomic_write(p) as f:
        f.write("half")
        raise RuntimeError("boom")
    assert p.read_text() == "old" and [x.name for x in tmp_path.iterdir()] == ["f.txt"]


def test_atomic_write_keeps_old_bytes_on_interrupt(tmp_path):
    from kvroute.files import atomic_write

    p = tmp_path / "f.txt"
    p.write_text("old")
    with pytest.raises(KeyboardInterrupt), atomic_write(p, "wb") as f:
        f.write(b"half")
        raise KeyboardInterrupt
    assert p.read_text() == "old" and [x.name for x in tmp_path.iterdir()] == ["f.txt"]


def test_atomic_write_refuses_a_directory(tmp_path):
    from kvroute.files import write_text

    with pytest.raises(IsADirectoryError):
        write_text(tmp_path, "x")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EACCES, errno.EROFS, errno.EISDIR, errno.ENOTDIR,
                                  errno.EEXIST, errno.ENOENT, errno.EIO])
def test_os_error_message_names_path_and_fix(code):
    from kvroute.files import os_error_message

    msg = os_error_message(OSError(code, __import__("os").strerror(code), "/some/where/x.csv"))
    assert "/some/where/x.csv" in msg and "\n" not in msg and ";" in msg


# 10. length: the cheap character bound refuses a huge context before it is tokenised; `ask` checks too ------
def test_run_refuses_a_huge_context_without_tokenising_it(tiny, good_instance, tmp_path, capsys, monkeypatch):
    import kvroute.runner

    huge = {**good_instance, "id": "huge", "context": good_instance["context"] + " filler" * 200_000}
    tasks = tmp_path / "t.jsonl"
    tasks.write_text(json.dumps(huge) + "\n")
    tokenised = []
    real = kvroute.runner.build_prompt
    monkeypatch.setattr(kvroute.runner, "build_prompt", lambda *a, **k: tokenised.append(1) or real(*a, **k))
    out = tmp_path / "o.jsonl"
    code, _, err = cli(["run", "--model", tiny, "--tasks", tasks, "--press", "knorm", "--ratio", "0.5",
                        "--max-new-tokens", "2", "--out", out], capsys)
    assert code == 0 and "Traceback" not in err, err
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    assert recs and all(r["status"] == "error" and "context window" in r["error"] for r in recs)
    assert not tokenised


@pytest.mark.parametrize(("args", "match"), [
    (["--context", ""], "context is empty"),
    (["--context", "   "], "context is empty"),
    (["--question", ""], "question is empty"),
    (["--max-new-tokens", "0"], "max-new-tokens"),
    (["--max-new-tokens", "-1"], "max-new-tokens"),
    (["--context", "@NONUTF8"], "not utf-8"),
    (["--context", "@MISSING"], "no such file"),
    (["--context", "word " * 30_000], "context window"),
])
def test_ask_checks_the_prompt_like_run(args, match, tiny, tmp_path, capsys):
    (tmp_path / "bad.txt").write_bytes(b"caf\xe9 \xff")
    args = [a.replace("@NONUTF8", f"@{tmp_path / 'bad.txt'}").replace("@MISSING", f"@{tmp_path / 'nope.txt'}")
            for a in args]
    assert_fails_cleanly(["ask", "--model", tiny, *args], capsys, tmp_path, match)


def test_ask_answers_a_short_prompt(tiny, capsys):
    code, out, err = cli(["ask", "--model", tiny, "--max-new-tokens", "2"], capsys)
    assert code == 0, err
    assert "answer" in out


# 11. the report is written whole or not at all (kvroute.files.write_folder) ---------------------------------
@pytest.mark.parametrize(("code", "match"), [(errno.ENOSPC, "no space left"), (errno.EIO, "check the path"),
                                             (errno.EDQUOT, "quota")])
def test_report_disk_fault_keeps_the_previous_report(code, match, run_copy, tmp_path, capsys, monkeypatch):
    """A full disk while the report is written: one line, the earlier report byte for byte, no temp folder."""
    assert cli(["report", run_copy, "--n-boot", "10", "--title", "earlier"], capsys)[0] == 0
    monkeypatch.setattr(kvroute.files.os, "fsync", _fail_fsync(code))
    assert_fails_cleanly(["report", run_copy, "--n-boot", "10"], capsys, tmp_path, ("report", match))


def test_report_disk_fault_leaves_no_report_folder(run_copy, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(kvroute.files.os, "fsync", _fail_fsync(errno.ENOSPC))
    assert_fails_cleanly(["report", run_copy, "--n-boot", "10"], capsys, tmp_path, "no space left")
    assert not (run_copy / "report").exists()


def test_report_replaces_the_previous_report_whole(run_copy, tmp_path, capsys):
    """A second report replaces the first: no stale figure of the first survives, no temp folder is left."""
    assert cli(["report", run_copy, "--n-boot", "10"], capsys)[0] == 0
    (run_copy / "report" / "figures" / "stale.png").write_bytes(b"from an older report")
    code, _, err = cli(["report", run_copy, "--n-boot", "10"], capsys)
    assert code == 0, err
    assert not (run_copy / "report" / "figures" / "stale.png").exists()
    assert [p.name for p in run_copy.iterdir() if p.name.endswith(".tmp")] == []


def test_report_into_a_folder_with_other_files_keeps_them(run_copy, tmp_path, capsys):
    out = tmp_path / "shared"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    code, _, err = cli(["report", run_copy, "--n-boot", "10", "--out", out], capsys)
    assert code == 0, err
    assert (out / "notes.txt").read_text() == "mine" and (out / "report.html").is_file()
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


def test_report_out_naming_a_file(run_copy, tmp_path, capsys):
    (tmp_path / "afile").write_text("keep me")
    assert_fails_cleanly(["report", run_copy, "--n-boot", "10", "--out", tmp_path / "afile"], capsys, tmp_path,
                         ("afile", "not a folder"))


# 12. devices: one check for `run`, `ask` and `ticket` ----------------------------------------------------------
BAD_DEVICES = [("banana", "unknown device"), ("gpu", "unknown device"), ("cuda:x", "unknown device"),
               ("cpu:0:1", "unknown device"), ("cuda:99", "cuda")]


@pytest.mark.parametrize(("device", "match"), BAD_DEVICES, ids=[d for d, _ in BAD_DEVICES])
@pytest.mark.parametrize("command", ["ask", "run"])
def test_bad_device_is_one_line(command, device, match, tiny, tasks_file, tmp_path, capsys):
    argv = {"ask": ["ask", "--model", tiny, "--device", device],
            "run": ["run", "--model", tiny, "--tasks", tasks_file, "--press", "knorm", "--ratio", "0.5",
                    "--out", tmp_path / "o.jsonl", "--device", device]}[command]
    assert_fails_cleanly(argv, capsys, tmp_path, (match, "--device cpu" if device == "cuda:99" else "cpu"))


# 13. model folders transformers would fail on with a traceback --------------------------------------------------
def _model_copy(tiny: Path, tmp_path: Path, **config_changes) -> Path:
    dst = tmp_path / "model"
    shutil.copytree(tiny, dst)
    if config_changes:
        cfg = json.loads((dst / "config.json").read_text())
        cfg.update(config_changes)
        (dst / "config.json").write_text(json.dumps(cfg))
    return dst


def test_custom_code_model_folder_is_refused(tiny, tmp_path, capsys):
    model = _model_copy(tiny, tmp_path, model_type="my_custom_llm",
                        auto_map={"AutoConfig": "configuration_x.XConfig", "AutoModelForCausalLM": "modeling_x.XModel"})
    (model / "modeling_x.py").write_text("raise SystemExit('kvroute must not run this')\n")
    assert_fails_cleanly(["ask", "--model", model], capsys, tmp_path, ("own model code", "auto_map",
                                                                       "trust_remote_code"))


def test_auto_map_on_a_known_architecture_loads_the_builtin_code(tiny, tmp_path, capsys):
    model = _model_copy(tiny, tmp_path, auto_map={"AutoModelForCausalLM": "modeling_x.XModel"})
    (model / "modeling_x.py").write_text("raise SystemExit('kvroute must not run this')\n")
    code, out, err = cli(["ask", "--model", model, "--max-new-tokens", "2"], capsys)
    assert code == 0, err
    assert "answer" in out


@pytest.mark.parametrize("keep", [0, 5, 8, 100, -16])
def test_truncated_safetensors_is_named(keep, tiny, tmp_path, capsys):
    model = _model_copy(tiny, tmp_path)
    f = model / "model.safetensors"
    data = f.read_bytes()
    f.write_bytes(data[:keep] if keep >= 0 else data[:keep])
    assert_fails_cleanly(["ask", "--model", model], capsys, tmp_path, ("model.safetensors", "not a complete",
                                                                       "copy the model folder again"))


def test_config_json_that_is_not_json(tiny, tmp_path, capsys):
    model = _model_copy(tiny, tmp_path)
    (model / "config.json").write_text("{torn")
    assert_fails_cleanly(["ask", "--model", model], capsys, tmp_path, ("config.json", "not valid json"))


@pytest.fixture
def damaged_zoo_home(tiny, tmp_path, monkeypatch):
    """A $KVROUTE_HOME whose pulled smollm2-135m has a truncated model.safetensors (the tiny model stands in)."""
    from kvroute.models.fetch import MARKER, model_dir

    home = tmp_path / "home"
    folder = model_dir("smollm2-135m", home)
    shutil.copytree(tiny, folder)
    sizes = {p.name: p.stat().st_size for p in folder.iterdir()}
    (folder / MARKER).write_text(json.dumps({"name": "smollm2-135m", "sizes": sizes}))
    f = folder / "model.safetensors"
    f.write_bytes(f.read_bytes()[:-1000])
    monkeypatch.setenv("KVROUTE_HOME", str(home))
    return home


def test_truncated_cached_zoo_model_says_how_to_pull_again(damaged_zoo_home, tmp_path, capsys):
    assert_fails_cleanly(["ask", "--model", "smollm2-135m"], capsys, tmp_path,
                         ("model.safetensors", "kvroute models pull smollm2-135m --force"))


def test_models_list_does_not_call_a_truncated_model_cached(damaged_zoo_home, capsys, monkeypatch):
    from rich.console import Console

    import kvroute.cli

    monkeypatch.setattr(kvroute.cli.models, "console", Console(width=250))  # the whole table on one line per model
    code, out, err = cli(["models", "list"], capsys)
    assert code == 0, err
    row = next(line for line in out.splitlines() if "smollm2-135m" in line)
    assert "damaged" in row and " yes " not in row
    assert "kvroute models pull smollm2-135m --force" in " ".join(out.split())


# 14. smaller CLI checks (issue 20, item 12) ---------------------------------------------------------------
@pytest.mark.parametrize("limit", ["-1", "0"])
def test_run_limit_must_be_positive(limit, tiny, tasks_file, tmp_path, capsys):
    assert_fails_cleanly(["run", "--model", tiny, "--tasks", tasks_file, "--press", "knorm", "--ratio", "0.5",
                          "--out", tmp_path / "o.jsonl", "--limit", limit], capsys, tmp_path, "--limit")


@pytest.mark.parametrize(("args", "match"), [(["--scale", "-1"], "--scale"), (["--scale", "0"], "--scale"),
                                             (["--scale", "nan"], "--scale"), (["--tickets", "-1"], "--tickets"),
                                             (["--n-boot", "0"], "--n-boot")])
def test_demo_refuses_bad_numbers_before_pulling(args, match, tmp_path, capsys, monkeypatch):
    import kvroute.models.fetch

    monkeypatch.setattr(kvroute.models.fetch, "pull", lambda *a, **k: pytest.fail("pulled before the check"))
    assert_fails_cleanly(["demo", "--out", tmp_path / "demo", *args], capsys, tmp_path, match)


@pytest.mark.parametrize(("backend", "match"), [("spark", "known backends: local, ray"),
                                                ("locl", "did you mean 'local'"), ("Ray", "did you mean 'ray'")])
def test_unknown_backend_names_the_known_ones(backend, match, sweep_config, tmp_path, capsys):
    assert_fails_cleanly(["sweep", sweep_config, "--out", tmp_path / "run", "--backend", backend, "--dry-run"],
                         capsys, tmp_path, match)


def test_sweep_help_shows_the_ray_extra(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")
    code, out, _ = cli(["sweep", "--help"], capsys)
    assert code == 0 and "pip install 'kvroute[ray]'" in out


def test_unknown_family_plural(tmp_path, capsys):
    line = assert_fails_cleanly(["tasks", "generate", "nope", "--out", tmp_path / "t.jsonl"], capsys, tmp_path,
                                "known task families:")
    assert "familys" not in line


def test_plural_of():
    from kvroute.errors import plural_of

    assert [plural_of(w) for w in ("task family", "selection strategy", "model", "key", "box", "instance id")] == [
        "task families", "selection strategies", "models", "keys", "boxes", "instance ids"]


ESCAPES = ["\x1b[31mred\x1b[0m", "\x1b]0;title\x07", "a\rb", "\x9b31m", "bidi \u202eevil", "nul\x00", "del\x7f"]


@pytest.mark.parametrize("text", ESCAPES, ids=[repr(t) for t in ESCAPES])
def test_tasks_show_does_not_pass_control_characters(text, good_instance, tmp_path, capsys):
    inst = {**good_instance, "context": good_instance["context"] + " " + text, "question": "Q " + text + "?"}
    f = tmp_path / "t.jsonl"
    f.write_text(json.dumps(inst) + "\n")
    code, out, err = cli(["tasks", "show", f], capsys)
    assert code == 0, err
    bad = [c for c in out if (ord(c) < 32 and c not in "\n") or 0x7F <= ord(c) < 0xA0 or c == "\u202e"]
    assert not bad, [hex(ord(c)) for c in bad]
    assert any(c in out for c in "␛␍␀␡�")  # shown, not dropped


@pytest.mark.parametrize("width", [250, 60])
def test_sweep_summary_keeps_press_parameters(width, sweep_config, tmp_path, capsys, monkeypatch):
    from rich.console import Console

    import kvroute.cli

    monkeypatch.setattr(kvroute.cli.sweep, "console", Console(width=width))
    code, out, err = cli(["sweep", sweep_config, "--out", tmp_path / "run", "--ratios", "0.5",
                          "--press", "snapkv[window_size=4]", "--press", "snapkv[window_size=8]"], capsys)
    assert code == 0, err
    table = out[out.index("summary"):]
    if width == 250:
        rows = [line for line in table.splitlines() if "snapkv" in line]
        assert len(rows) == 2 and "window_size=4" in rows[0] and "window_size=8" in rows[1], out
    else:  # wrapped inside the cell, never cut: both parameter values are there
        cells = "".join(line.split("│")[2] if line.count("│") > 3 else "" for line in table.splitlines())
        assert "window_size=4" in cells.replace(" ", "") and "window_size=8" in cells.replace(" ", ""), out


def test_token_length_warning_does_not_leak_into_run(tiny, tasks_file, tmp_path, capsys):
    model = _model_copy(tiny, tmp_path)
    tok_cfg = json.loads((model / "tokenizer_config.json").read_text())
    (model / "tokenizer_config.json").write_text(json.dumps({**tok_cfg, "model_max_length": 16}))
    code, out, err = cli(["run", "--model", model, "--tasks", tasks_file, "--press", "knorm", "--ratio", "0.5",
                          "--max-new-tokens", "2", "--out", tmp_path / "o.jsonl"], capsys)
    assert code == 0, err
    assert "Token indices" not in out + err


# a press whose cost does not fit the model ------------------------------------------------------------
def test_kvzip_on_a_context_its_replay_does_not_fit_fails_its_cells_in_one_line():
    """KVzip replays the context after it; when that passes the model's window its cells say so (one line
    each) and the other presses of the instance are computed."""
    from kvroute.engine import Cell, Engine
    from kvroute.models.tiny import tiny_model
    from kvroute.runner import RunSettings, run_instance
    from kvroute.tasks.prompt import build_prompt

    lm = tiny_model("llama", seed=0)
    inst = generate_tasks(TaskSpec("base", n=1, seed=0), lm.tokenizer)[0]
    settings = RunSettings(max_new_tokens=2)
    prompt = build_prompt(lm.tokenizer, inst)
    lm.model.config.max_position_embeddings = len(prompt.context_ids) + len(prompt.question_ids) + 8  # it fits
    recs = run_instance(Engine(lm, settings.decode_settings()), inst,
                        [Cell("knorm", 0.5), Cell("kvzip", 0.5), Cell("kvzip", 0.9)], settings=settings)
    assert [r["status"] for r in recs] == ["ok", "error", "error"]
    for r in recs[1:]:
        assert "\n" not in r["error"] and "exceed the model's context window" in r["error"], r["error"]
        assert "kvzip[chunk_size=" in r["error"] or "shorter context" in r["error"]


# numbers and lists on the command line: one parser, one line naming the option ------------------------
@pytest.mark.parametrize(("argv", "match"), [
    (["tasks", "niah", "--depth", "abc"], ("--depth", "'abc'", "not a number")),
    (["tasks", "niah", "--length", "1000,1x"], ("--length", "'1x'", "not an integer")),
    (["presses", "check", "knorm", "--ratios", "0.5,half"], ("--ratios", "'half'", "not a number")),
])
def test_a_bad_number_in_a_list_option_is_one_line(argv, match, tmp_path, capsys):
    assert_fails_cleanly([*argv, *(["--out", tmp_path / "t.jsonl"] if argv[1] == "niah" else [])], capsys, tmp_path,
                         match)
