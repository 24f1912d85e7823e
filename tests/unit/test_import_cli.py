"""``kvroute tasks import | niah | grid`` end to end on files written here (no model is loaded)."""

import json

import pytest
from typer.testing import CliRunner

from kvroute.cli import app
from kvroute.models import tiny_tokenizer
from kvroute.tasks import load_tasks

runner = CliRunner()


@pytest.fixture(autouse=True)
def _wide_console(monkeypatch):
    """Wide enough that no summary line wraps, whatever terminal (or none, as in a pytest-xdist worker) runs this."""
    from kvroute import console

    for c in (console.console, console.err_console):
        monkeypatch.setattr(c, "_width", 200)


@pytest.fixture(autouse=True)
def _wide(monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")


@pytest.fixture
def tiny_tok(monkeypatch):
    import kvroute.models

    monkeypatch.setattr(kvroute.models, "load_tokenizer", lambda source, **kw: tiny_tokenizer())


def test_niah_ruler_file_imports_with_a_summary(tmp_path, tiny_tok):
    ruler = tmp_path / "needles.jsonl"
    out = runner.invoke(app, ["tasks", "niah", "--out", str(ruler), "--layout", "ruler", "--length", "200,400",
                              "--depth", "0", "--depth", "1", "--n", "2", "--tokenizer", "tiny"])
    assert out.exit_code == 0, out.output
    assert "wrote 8 niah instances" in out.output
    rows = [json.loads(line) for line in ruler.read_text().splitlines()]
    assert len(rows) == 8 and set(rows[0]) >= {"input", "outputs", "length", "answer_prefix", "depth"}

    tasks = tmp_path / "tasks.jsonl"
    out = runner.invoke(app, ["tasks", "import", str(ruler), "--out", str(tasks), "--family", "niah"])
    assert out.exit_code == 0, out.output
    assert "ruler layout" in out.output and "spans found" in out.output and "evidence none" in out.output
    line = next(ln for ln in out.output.splitlines() if ln.strip().startswith("│ niah"))
    assert [c.strip() for c in line.split("│")[1:-1]] == ["niah", "8", "8", "8", "0", "0", "0", "0"]
    assert len(load_tasks(tasks)) == 8

    out = runner.invoke(app, ["tasks", "import", str(ruler), "--out", str(tasks), "--tokenizer", "tiny",
                              "--max-tokens", "480"])
    assert out.exit_code == 0, out.output
    assert "window 480 tokens" in out.output
    assert len(load_tasks(tasks)) == 4  # the 400-token ones are skipped (and counted)
    out = runner.invoke(app, ["tasks", "import", str(ruler), "--out", str(tasks), "--tokenizer", "tiny",
                              "--max-tokens", "480", "--truncate", "middle"])
    assert out.exit_code == 0, out.output
    assert len(load_tasks(tasks)) == 8 and sum("truncated" in t.meta for t in load_tasks(tasks)) == 4


def test_import_cli_errors_are_clean(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"context": "c", "question": "q", "answer": "a"}) + "\n" + json.dumps({"context": "c"}))
    out = runner.invoke(app, ["tasks", "import", str(bad), "--out", str(tmp_path / "o.jsonl")])
    assert out.exit_code != 0 and "line 2, field 'question': missing value" in str(out.exception)
    out = runner.invoke(app, ["tasks", "import", str(bad), "--out", str(tmp_path / "o.jsonl"), "--max-tokens", "100"])
    assert "give --model or --tokenizer" in str(out.exception)
    out = runner.invoke(app, ["tasks", "niah", "--out", str(tmp_path / "n.jsonl"), "--layout", "rulr"])
    assert "use one of kvroute, ruler, kvpress" in str(out.exception)


def test_grid_table_from_records(tmp_path):
    tasks = tmp_path / "t.jsonl"
    assert runner.invoke(app, ["tasks", "niah", "--out", str(tasks), "--length", "200,400",
                               "--depth", "0,1"]).exit_code == 0
    insts = load_tasks(tasks)
    recs = []
    for i, inst in enumerate(insts):
        for ratio, ger in ((0.0, 0.0), (0.5, 0.25 * i)):
            recs.append({"instance_id": inst.id, "press": "snapkv", "ratio": ratio, "outcome": "correct" if ger < 0.5
                         else "fabricated", "f1": 1.0 if ger < 0.5 else 0.0, "ger": ger, "reachable": ger < 0.5,
                         "routed_reachable": True})
    rec_file = tmp_path / "records.jsonl"
    rec_file.write_text("".join(json.dumps(r) + "\n" for r in recs))
    out = runner.invoke(app, ["tasks", "grid", str(rec_file), "--tasks", str(tasks)])
    assert out.exit_code == 0, out.output
    assert "press snapkv" in out.output and "ratio 0.50" in out.output
    # instance 3 (length 400, depth 1): GER 0.75, wrong, unreachable
    assert "0.00 · 0.75 · 0.00 (1.00)" in out.output and "1.00 · 0.00 · 1.00 (1.00)" in out.output


def test_grid_by_evidence_counts_evidence_none_apart(tmp_path):
    src = tmp_path / "k.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in [
        {"context": "The code is 4471.", "question": "Code?", "answer": "4471"},
        {"context": "No code here.", "question": "Code?", "answer": "9999"}]))
    tasks = tmp_path / "t.jsonl"
    assert runner.invoke(app, ["tasks", "import", str(src), "--out", str(tasks)]).exit_code == 0
    a, b = load_tasks(tasks)
    recs = [{"instance_id": a.id, "press": "snapkv", "ratio": 0.5, "outcome": "correct", "f1": 1.0, "ger": 0.5,
             "reachable": True, "routed_reachable": True},
            {"instance_id": b.id, "press": "snapkv", "ratio": 0.5, "outcome": "fabricated", "f1": 0.0, "ger": None,
             "reachable": None, "routed_reachable": None}]
    rec_file = tmp_path / "records.jsonl"
    rec_file.write_text("".join(json.dumps(r) + "\n" for r in recs))
    from kvroute.analysis.grid import meta_table
    from kvroute.analysis.load import load_records

    table = meta_table(load_records(rec_file), [a, b], ["evidence"])
    assert table.set_index("evidence")["no_evidence"].to_dict() == {"located": 0, "none": 1}
    assert table.set_index("evidence")["ger"].to_dict()["located"] == 0.5
    out = runner.invoke(app, ["tasks", "grid", str(rec_file), "--tasks", str(tasks), "--by", "evidence"])
    assert out.exit_code == 0, out.output
    assert "1.00 · 0.50 · 1.00 (1.00)" in out.output and "0.00 · — · — (—) [1 no-ev]" in out.output
