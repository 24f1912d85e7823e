"""``kvroute tasks list | generate | show``."""

import json

from typer.testing import CliRunner

from kvroute.cli import app
from kvroute.tasks import load_tasks

runner = CliRunner()


def test_list_shows_every_family(monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")
    out = runner.invoke(app, ["tasks", "list"])
    assert out.exit_code == 0, out.output
    for name in ("base", "knowledge", "multi_presence", "multi_entity", "coreference", "long_context", "hops"):
        assert name in out.output
    assert "Date/Time" in out.output and "Manipulated" in out.output and "target_tokens" in out.output


def test_generate_is_byte_identical_and_all_expands(tmp_path):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    for p in (a, b):
        out = runner.invoke(app, ["tasks", "generate", "all", "--n", "3", "--seed", "4", "--out", str(p)])
        assert out.exit_code == 0, out.output
    assert a.read_bytes() == b.read_bytes()
    tasks = load_tasks(a)
    families = {t.family for t in tasks}
    assert {"base", "knowledge", "multi_presence", "multi_entity", "coreference", "long_context", "hops"} <= families
    assert len(tasks) == 3 * len(families)


def test_generate_knobs(tmp_path):
    p = tmp_path / "c.jsonl"
    out = runner.invoke(app, ["tasks", "generate", "coreference", "hops", "--n", "4", "--difficulty", "2",
                              "--target-tokens", "250", "--depth", "0.3", "--answer-type", "Location",
                              "--out", str(p)])
    assert out.exit_code == 0, out.output
    tasks = load_tasks(p)
    assert {t.answer_type for t in tasks} == {"Location"} and all(t.meta["target_tokens"] == 250 for t in tasks)


def test_generate_bad_knob_is_a_clean_error(tmp_path):
    from kvroute.cli import main  # noqa: F401  (errors are printed by main; the app raises them)

    out = runner.invoke(app, ["tasks", "generate", "bsae", "--out", str(tmp_path / "x.jsonl")])
    assert out.exit_code != 0 and "did you mean 'base'" in str(out.exception)
    out = runner.invoke(app, ["tasks", "generate", "base", "--difficulty", "7", "--out", str(tmp_path / "x.jsonl")])
    assert "has levels" in str(out.exception)


def test_show_highlights_and_escapes_markup(tmp_path, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    ctx = "[bold]Maren[/bold] was born in Velkirra."
    i = ctx.index("Velkirra")
    line = {"family": "custom", "version": 1, "context": ctx,
            "question": "Where was Maren born?", "answers": ["Velkirra"], "unanswerable": False,
            "answer_spans": [[i, i + 8]], "evidence_spans": [[0, len(ctx)]], "distractors": [],
            "answer_type": "Location", "question_type": "Standard"}
    p = tmp_path / "mine.jsonl"
    p.write_text(json.dumps(line) + "\n")
    out = runner.invoke(app, ["tasks", "show", str(p)])
    assert out.exit_code == 0, out.output
    assert "[bold]Maren[/bold]" in out.output and "Velkirra" in out.output and "1 instances" in out.output
