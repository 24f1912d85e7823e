"""Listings that survive a pipe: `presses list`, `models list`, `models architectures` and `tasks show` never cut a
name or a value where stdout is not a terminal (no "…", each name whole on one line), at the default width or a
narrow COLUMNS, and each has a ``--json`` form: a list of objects that names every press, model or instance."""

from __future__ import annotations

import io
import json
import re

import pytest
from rich.console import Console
from rich.table import Table
from typer.testing import CliRunner

import kvroute.cli
from kvroute.cli import app
from kvroute.console import fit_widths, print_table
from kvroute.tasks import TaskSpec, generate_tasks, load_tasks, save_tasks

runner = CliRunner()


@pytest.fixture(autouse=True)
def piped(monkeypatch, tmp_path):
    """The commands' stdout console as a pipe's (FORCE_COLOR in the environment makes rich's import-time console a
    terminal), reading COLUMNS on every print; and an empty model cache."""
    for module in (kvroute.cli.presses, kvroute.cli.models, kvroute.cli.tasks):
        monkeypatch.setattr(module, "console", Console(force_terminal=False))
    monkeypatch.setenv("KVROUTE_HOME", str(tmp_path / "home"))


@pytest.fixture(params=[None, "60"], ids=["default-width", "COLUMNS=60"])
def columns(request, monkeypatch):
    """The width a listing is printed at: the default, or a narrow COLUMNS."""
    if request.param:
        monkeypatch.setenv("COLUMNS", request.param)
    else:
        monkeypatch.delenv("COLUMNS", raising=False)
    return request.param


def invoke(argv: list[str]) -> str:
    out = runner.invoke(app, argv)
    assert out.exit_code == 0, out.output
    return out.stdout


def words(text: str) -> set[str]:
    """The whitespace- and border-separated words of a listing."""
    return set(re.split(r"[\s│┃|]+", text))


def test_presses_list_keeps_every_name_whole_in_a_pipe(columns):
    from kvroute.presses import SCORERS, SELECTIONS
    from kvroute.presses.constraints import CONSTRAINTS

    out = invoke(["presses", "list"])
    assert "…" not in out
    assert {*SCORERS.names(), *SELECTIONS.names(), *CONSTRAINTS.names()} <= words(out)
    assert "n_future_positions=512," in words(out)  # a value: whole, not folded


def test_presses_list_json_names_every_press():
    from kvroute.presses import SCORERS, SELECTIONS

    rows = json.loads(invoke(["presses", "list", "--json"]))
    assert isinstance(rows, list) and all(isinstance(r, dict) and {"kind", "name"} <= r.keys() for r in rows)
    assert {r["name"] for r in rows if r["kind"] == "scorer"} == set(SCORERS.names())
    assert {r["name"] for r in rows if r["kind"] == "selection"} == set(SELECTIONS.names())
    assert {r["name"] for r in rows if r["kind"] == "constraint"} == {"paged", "uniform", "layer_budget"}
    assert any(r["kind"] == "kvpress_not_offered" for r in rows)
    snapkv = next(r for r in rows if r["name"] == "snapkv")
    assert snapkv["parameters"] == {"window_size": 64, "kernel_size": 5} and snapkv["source"] == "kvpress"


@pytest.mark.parametrize("wide", [False, True])
def test_models_list_keeps_every_value_whole_in_a_pipe(columns, wide):
    from kvroute.models import ZOO

    out = invoke(["models", "list", *(["--wide"] if wide else [])])
    assert "…" not in out
    seen = words(out)
    for name, e in ZOO.items():
        assert {name, e.architecture, e.quantization, f"{e.heads}/{e.kv_heads}"} <= seen
        assert all(word in seen for word in e.source.split())
        if wide:
            assert e.original in seen
    assert "layers" in seen and "params" in seen  # headers too


def test_models_list_json_names_every_model():
    from kvroute.models import ZOO

    rows = json.loads(invoke(["models", "list", "--json"]))
    assert [r["name"] for r in rows] == list(ZOO.names())
    assert all(r["cached"] == "no" and r["packages"] and r["notes"] for r in rows)  # the --wide fields too


def test_models_architectures_lists_the_registry_whole_in_a_pipe(columns):
    from kvroute.models.tiny import TINY_ARCHITECTURES

    out = invoke(["models", "architectures"])
    assert "…" not in out
    seen = words(out)
    for name, arch in TINY_ARCHITECTURES.items():
        assert name in seen
        assert (f"{name}: kvroute cannot study" in " ".join(out.split())) is (not arch.studied)


def test_models_architectures_json_is_one_row_per_registry_architecture():
    from kvroute.models.tiny import TINY_ARCHITECTURES

    rows = json.loads(invoke(["models", "architectures", "--json"]))
    assert [r["architecture"] for r in rows] == list(TINY_ARCHITECTURES)
    for r in rows:
        arch = TINY_ARCHITECTURES[r["architecture"]]
        assert r["studied"] is arch.studied and r["head_dims"] == list(arch.head_dims)
        # a studied architecture has a measured agreement; one kvroute cannot study has its load-time refusal
        assert (r["agreement"] is not None) is arch.studied and (r["refusal"] is None) is arch.studied


@pytest.fixture
def task_file(tmp_path):
    path = tmp_path / "t.jsonl"
    save_tasks([*generate_tasks(TaskSpec("base", n=2, seed=1, target_tokens=900)),
                *generate_tasks(TaskSpec("hops", n=1, seed=1))], path)
    return path


def test_tasks_show_keeps_whole_contexts_in_a_pipe(columns, task_file):
    insts = load_tasks(task_file)
    assert len(insts[0].context) > 2000  # past the cut a terminal gets
    out = invoke(["tasks", "show", str(task_file)])
    assert "…" not in out and "more characters" not in out
    seen = words(out)
    for inst in insts:
        assert inst.id in seen and inst.context.split()[-1] in seen  # the context's last word: nothing cut
    cut = invoke(["tasks", "show", str(task_file), "--max-chars", "100"])  # a cut asked for is still made
    assert "more characters]" in cut


def test_tasks_show_json_gives_the_instances_whole(task_file):
    insts = load_tasks(task_file)
    rows = json.loads(invoke(["tasks", "show", str(task_file), "--json", "--skip", "1", "--n", "5"]))
    assert rows == [inst.to_dict() for inst in insts[1:]]


@pytest.mark.parametrize(("mins", "maxs", "room", "want"), [
    ([3, 4], [5, 6], 20, [5, 6]),  # all fits
    ([3, 4], [5, 6], 6, None),  # not even the longest words
    ([2, 2, 2], [10, 3, 30], 20, [9, 3, 8]),  # the wide ones narrowed to a common cap, the spare shared
    ([12, 2], [20, 40], 20, [12, 8]),  # a column never below its longest word
])
def test_fit_widths(mins, maxs, room, want):
    got = fit_widths(mins, maxs, room)
    assert got == want
    if got is not None:
        assert sum(got) <= room and all(lo <= w <= hi for lo, w, hi in zip(mins, got, maxs, strict=True))


def test_a_table_wider_than_a_pipe_is_printed_whole_and_a_terminal_folds_all_but_its_names():
    def table() -> Table:
        t = Table()
        t.add_column("name", overflow="fold")
        t.add_column("value", overflow="fold")
        t.add_row("a_rather_long_press_name", "parameter_with_a_long_name=0.5, other=1")
        return t

    pipe = Console(file=io.StringIO(), width=30, force_terminal=False)
    print_table(table(), pipe)
    text = pipe.file.getvalue()
    assert "a_rather_long_press_name" in text and "parameter_with_a_long_name=0.5," in text and "…" not in text
    assert max(len(line) for line in text.splitlines()) > 30
    for width in (40, 20):  # 40: room for the whole names, the values folded; 20: not even that, rich folds all
        tty = Console(file=io.StringIO(), width=width, force_terminal=True, color_system=None)
        print_table(table(), tty)
        text = tty.file.getvalue()
        assert max(len(line) for line in text.splitlines()) <= width and "…" not in text
        assert ("a_rather_long_press_name" in text) == (width == 40)
        assert "".join(re.findall(r"^│ (\S+)", text, re.M)) == "a_rather_long_press_name"  # every character shown
