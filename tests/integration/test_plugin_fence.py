"""Presses kvroute did not write run in a fence (kvroute.presses.fence), on the tiny random Llama.

Plugins written to misbehave — editing the cache they score in place, raising, exiting, returning
nothing or NaN — are swept beside built-in presses. What must hold: the other presses' records are
equal to a run without the plugin (every field but the timings), the plugin's scored cells are
per-cell errors naming it and the call, no record is lost, and the command exits as a run with
errored cells does (0, with "N of M cells errored"). A NaN from any scorer, built-in or not, never
reaches a keep mask.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from kvroute.engine import Cell, Engine
from kvroute.models import save_tiny_model
from kvroute.models.tiny import tiny_model
from kvroute.presses.scorers.kvpress_adapter import KvpressScorer
from kvroute.runner import RunSettings, run_instance
from kvroute.sweep import read_records
from kvroute.sweep.manifest import read_manifest
from kvroute.tasks import TaskSpec, generate_tasks, save_tasks
from tests.integration.test_bad_inputs import assert_one_line_error, cli
from tests.integration.test_press_plugins import PRESS, _fresh_discovery, declare_plugins

MODULE = "fence_presses"
PRESSES = '''
"""Presses that misbehave, for the fence tests."""
from dataclasses import dataclass, field
from typing import ClassVar

import torch
from kvpress import ScorerPress

from kvroute.presses.scorers import ScoreInputs, Scorer


def knorm(keys):
    return -torch.linalg.vector_norm(keys, dim=-1, dtype=torch.float32)  # [B, Hkv, T]


@dataclass
class ZeroValues(ScorerPress):
    def score(self, module, hidden_states, keys, values, attentions, kwargs):
        s = knorm(keys)
        values.mul_(0)
        return s


@dataclass
class ZeroKeys(ScorerPress):
    def score(self, module, hidden_states, keys, values, attentions, kwargs):
        s = knorm(keys)
        keys.zero_()
        return s


@dataclass
class EditHidden(ScorerPress):
    def score(self, module, hidden_states, keys, values, attentions, kwargs):
        hidden_states.add_(1.0)
        kwargs["position_embeddings"][0].mul_(2)
        return knorm(keys)


@dataclass
class DoubleKeys(Scorer):
    """A kvroute Scorer that edits the keys it reads."""
    name: ClassVar[str] = "double_keys"

    def score(self, x: ScoreInputs, ratio: float) -> torch.Tensor:
        x.keys.mul_(2)
        return knorm(x.keys)


@dataclass
class EditsAfterPrefill(Scorer):
    """Scores every layer after the prefill (as KVzip does), zeroing the first layer's values on the way."""
    name: ClassVar[str] = "edits_after_prefill"
    scores_after_prefill: ClassVar[bool] = True

    def score(self, x: ScoreInputs, ratio: float) -> torch.Tensor:
        raise NotImplementedError

    def score_model(self, x, ratio):
        x.values[0].zero_()
        return torch.cat([knorm(k) for k in x.keys])  # [L, Hkv, T]


CALLS = [0]


@dataclass
class SeventhCall(ScorerPress):
    def score(self, module, hidden_states, keys, values, attentions, kwargs):
        CALLS[0] += 1
        if CALLS[0] == 7:
            return 1 / 0
        return knorm(keys)


@dataclass
class Runtime(ScorerPress):
    def score(self, module, hidden_states, keys, values, attentions, kwargs):
        raise RuntimeError("the plugin's own bug")


@dataclass
class Missing(ScorerPress):
    def score(self, module, hidden_states, keys, values, attentions, kwargs):
        return {}["scores"]


@dataclass
class ReturnsNone(ScorerPress):
    def score(self, module, hidden_states, keys, values, attentions, kwargs):
        return None


@dataclass
class ReturnsList(ScorerPress):
    def score(self, module, hidden_states, keys, values, attentions, kwargs):
        return knorm(keys).tolist()


@dataclass
class Exits(ScorerPress):
    def score(self, module, hidden_states, keys, values, attentions, kwargs):
        raise SystemExit(0)


@dataclass
class OutOfMemory(ScorerPress):
    def score(self, module, hidden_states, keys, values, attentions, kwargs):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")


@dataclass
class Interrupt(ScorerPress):
    def score(self, module, hidden_states, keys, values, attentions, kwargs):
        raise KeyboardInterrupt


@dataclass
class BadSetup(Scorer):
    name: ClassVar[str] = "bad_setup"

    def setup(self, model):
        raise RuntimeError("no weights for this model")

    def score(self, x: ScoreInputs, ratio: float) -> torch.Tensor:
        return knorm(x.keys)


@dataclass
class BadDefault(Scorer):
    name: ClassVar[str] = "bad_default"
    window: int = field(default_factory=lambda: 1 // 0)

    def score(self, x: ScoreInputs, ratio: float) -> torch.Tensor:
        return knorm(x.keys)


@dataclass
class AllNan(ScorerPress):
    def score(self, module, hidden_states, keys, values, attentions, kwargs):
        return torch.full(keys.shape[:-1], float("nan"))


@dataclass
class HalfNan(ScorerPress):
    kvroute_options: ClassVar[dict] = {"ratio_dependent": False}

    def score(self, module, hidden_states, keys, values, attentions, kwargs):
        s = knorm(keys)
        s[..., ::2] = float("nan")
        return s
'''

BUILT_INS = ["knorm", "snapkv"]
RATIOS = [0.0, 0.25, 0.5]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_model(tmp_path_factory.mktemp("fence-model") / "tiny-llama", "llama", seed=0)


@pytest.fixture(scope="module")
def tasks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    p = tmp_path_factory.mktemp("fence-tasks") / "tasks.jsonl"
    save_tasks(generate_tasks(TaskSpec("base", n=3, seed=0)), p)
    return p


@pytest.fixture(scope="module")
def modules(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("fence-mods")
    (root / f"{MODULE}.py").write_text(PRESSES)
    (root / "exiting_press.py").write_text("raise SystemExit(3)\n")
    return root


@pytest.fixture(autouse=True)
def importable(modules: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The plugin modules on sys.path, imported afresh by every test (SeventhCall counts its calls)."""
    monkeypatch.syspath_prepend(str(modules))
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2] / "examples" / "press_plugin"))
    monkeypatch.delitem(sys.modules, MODULE, raising=False)
    _fresh_discovery()
    yield
    _fresh_discovery()


def run(capsys, tiny: Path, tasks: Path, out: Path, presses: list[str]) -> tuple[str, list[dict]]:
    argv = ["run", "--model", tiny, "--tasks", tasks, "--max-new-tokens", "4", "--out", out]
    for r in RATIOS:
        argv += ["--ratio", str(r)]
    for p in presses:
        argv += ["--press", p]
    code, stdout, err = cli(argv, capsys)
    assert code == 0, err  # a run whose cells errored still exits 0: the errors are in the records
    assert "Traceback" not in stdout + err
    return stdout, [json.loads(line) for line in out.read_text().splitlines()]


def comparable(rec: dict) -> dict:
    """A record without its timings (the only fields two equal runs may differ in)."""
    return {k: v for k, v in rec.items() if not k.startswith("seconds_")}


@pytest.fixture(scope="module")
def baseline(tiny: Path, tasks: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[tuple, dict]:
    """The built-in presses' records of a run without any plugin, by (instance, press, ratio)."""
    from kvroute.cli import main

    out = tmp_path_factory.mktemp("fence-baseline") / "base.jsonl"
    argv = ["run", "--model", str(tiny), "--tasks", str(tasks), "--max-new-tokens", "4", "--out", str(out)]
    for r in RATIOS:
        argv += ["--ratio", str(r)]
    for p in BUILT_INS:
        argv += ["--press", p]
    with _no_exit():
        main(argv)
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(recs) == 3 * len(BUILT_INS) * len(RATIOS) and all(r["status"] == "ok" for r in recs)
    return {(r["id"], r["press"], r["ratio"]): comparable(r) for r in recs}


class _no_exit:
    """The CLI's main may end with SystemExit(0); anything else fails the fixture."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind, value, tb) -> bool:  # noqa: ANN001
        return kind is SystemExit and value.code in (0, None)


def assert_built_ins_unchanged(recs: list[dict], baseline: dict[tuple, dict]) -> None:
    mine = {(r["id"], r["press"], r["ratio"]): comparable(r) for r in recs if r["press"] in BUILT_INS}
    assert mine.keys() == baseline.keys()
    for key, rec in baseline.items():
        assert mine[key] == rec, key  # answer tokens, kept fraction, GER, every metric: equal


# -- 2. a press that edits its inputs in place -----------------------------------------------------------

MUTATORS = ["ZeroValues", "ZeroKeys", "EditHidden", "DoubleKeys"]


def test_presses_that_edit_the_cache_change_no_other_result(tiny, tasks, tmp_path, capsys, baseline):
    """Four presses that edit keys, values, hidden states, position embeddings in place, swept beside knorm and
    snapkv: the built-ins' records equal a run without them (ratio 0 and scored ratios), and every scored cell of
    each editing press is an error saying what it changed."""
    plugins = [f"{MODULE}:{m}" for m in MUTATORS]
    stdout, recs = run(capsys, tiny, tasks, tmp_path / "out.jsonl", BUILT_INS + plugins)
    assert len(recs) == 3 * (len(BUILT_INS) + len(plugins)) * len(RATIOS)  # no record lost
    assert_built_ins_unchanged(recs, baseline)
    changed = {"ZeroValues": "values", "ZeroKeys": "keys", "EditHidden": "hidden states", "DoubleKeys": "keys"}
    for r in recs:
        if r["press"] in plugins and r["ratio"] > 0:
            assert r["status"] == "error", r
            name = r["press"].split(":")[1]
            assert r["error"] == (f"PressPluginError: press {r['press']!r} changed its {changed[name]} in place in "
                                  "score(); a press must not edit the cache it scores (kvroute gave it a copy, so "
                                  "the other presses are unaffected)")
        elif r["press"] in plugins:  # ratio 0 keeps everything: the press's code never runs
            assert r["status"] == "ok"
    assert "cells errored" in stdout


def test_a_press_scoring_after_the_prefill_edits_a_copy(monkeypatch):
    """score_model() gets copies of every layer's keys and values: knorm's record is the one of a run without it."""
    lm = tiny_model("llama", seed=0)
    settings = RunSettings(max_new_tokens=3)
    engine = Engine(lm, settings.decode_settings())
    inst = generate_tasks(TaskSpec("base", n=1, seed=0))[0]
    alone = run_instance(engine, inst, [Cell("knorm", 0.5)], settings=settings)
    both = run_instance(engine, inst, [Cell(f"{MODULE}:EditsAfterPrefill", 0.5), Cell("knorm", 0.5)],
                        settings=settings)
    assert comparable(both[1]) == comparable(alone[0])
    assert both[0]["status"] == "error"
    assert both[0]["error"].startswith(f"PressPluginError: press '{MODULE}:EditsAfterPrefill' changed its values in "
                                       "place in score_model()")


# -- 3. a press that raises, exits or returns no scores ---------------------------------------------------

@pytest.mark.parametrize("cls,reason", [
    ("SeventhCall", "raised ZeroDivisionError in score(): division by zero"),
    ("Runtime", "raised RuntimeError in score(): the plugin's own bug"),
    ("Missing", "raised KeyError in score(): 'scores'"),
    ("ReturnsNone", "score() returned None, not a tensor of scores [1, 2, "),
    ("ReturnsList", "score() returned a list, not a tensor of scores [1, 2, "),
    ("Exits", "raised SystemExit in score() (exit code 0); a press must return, not exit"),
])
def test_a_press_that_fails_fails_only_its_cells(cls, reason, tiny, tasks, tmp_path, capsys, baseline):
    """The run completes (exit 0, every record written), the press's scored cells are errors naming it and the
    call, and the built-ins' records equal a run without it."""
    press = f"{MODULE}:{cls}"
    stdout, recs = run(capsys, tiny, tasks, tmp_path / "out.jsonl", [*BUILT_INS, press])
    assert len(recs) == 3 * (len(BUILT_INS) + 1) * len(RATIOS)
    assert_built_ins_unchanged(recs, baseline)
    mine = [r for r in recs if r["press"] == press and r["ratio"] > 0]
    errors = [r for r in mine if r["status"] == "error"]
    for r in errors:
        assert r["error"].startswith(f"PressPluginError: press {press!r}") and reason in r["error"], r["error"]
        assert "\n" not in r["error"] and "ger" not in r
    if cls == "SeventhCall":  # 3 layers: the 7th call is the first layer of the third scored cell, and only it fails
        assert len(errors) == 1 and all(r["status"] == "ok" for r in mine if r not in errors)
    else:
        assert len(errors) == len(mine) == 3 * 2
    assert f"{len(errors)} of {len(recs)} cells errored" in " ".join(stdout.split())


SWEEP = """
name = "fence"
models = ["{model}"]
presses = ["knorm", "{press}"]
ratios = [0, 0.5]

[[tasks]]
family = "base"
n = 2

[decoding]
max_new_tokens = 3
"""


def test_a_sweep_completes_past_a_failing_press_and_resumes(tiny, tmp_path, capsys):
    cfg = tmp_path / "sweep.toml"
    cfg.write_text(SWEEP.format(model=tiny, press=f"{MODULE}:Runtime"))
    out = tmp_path / "run"
    code, stdout, err = cli(["sweep", cfg, "--out", out], capsys)
    assert code == 0, err
    assert "Traceback" not in stdout + err
    assert read_manifest(out)["status"] == "complete"
    recs = read_records(out)
    bad = [r for r in recs if r["press"] == f"{MODULE}:Runtime" and r["ratio"] == 0.5]
    assert len(bad) == 2 and all(r["status"] == "error" and "RuntimeError in score()" in r["error"] for r in bad)
    assert all(r["status"] == "ok" for r in recs if r not in bad)
    code, stdout, err = cli(["sweep", cfg, "--out", out, "--resume"], capsys)
    assert code == 0, err
    assert "0 cells computed" in stdout  # an errored cell counts as done; nothing hits the plugin again


def test_an_entry_point_press_is_named_by_its_plugin(tiny, tasks, tmp_path, capsys, monkeypatch, baseline):
    declare_plugins(tmp_path / "site", monkeypatch, {"flaky": f"{MODULE}:Runtime"}, dist="some-plugins")
    _, recs = run(capsys, tiny, tasks, tmp_path / "out.jsonl", [*BUILT_INS, "flaky"])
    assert_built_ins_unchanged(recs, baseline)
    errors = {r["error"] for r in recs if r["press"] == "flaky" and r["ratio"] > 0}
    assert errors == {f"PressPluginError: press plugin 'flaky' ({MODULE}:Runtime, from some-plugins) raised "
                      "RuntimeError in score(): the plugin's own bug"}


@pytest.mark.parametrize("cls,stops", [("OutOfMemory", torch.cuda.OutOfMemoryError), ("Interrupt", KeyboardInterrupt)])
def test_out_of_memory_and_ctrl_c_still_stop_the_run(cls, stops):
    """Not the press's fault, or the user's wish: these pass the fence and end the run as they always did."""
    lm = tiny_model("llama", seed=0)
    settings = RunSettings(max_new_tokens=2)
    inst = generate_tasks(TaskSpec("base", n=1, seed=0))[0]
    with pytest.raises(stops):
        run_instance(Engine(lm, settings.decode_settings()), inst, [Cell("knorm", 0.5), Cell(f"{MODULE}:{cls}", 0.5)],
                     settings=settings)


@pytest.mark.parametrize("cls,match", [
    ("BadSetup", "raised RuntimeError in setup(): no weights for this model"),
    ("BadDefault", "raised ZeroDivisionError in parameters(): integer division or modulo by zero"),
])
def test_a_press_failing_as_it_is_built_is_refused_before_anything_runs(cls, match, tiny, tasks, tmp_path, capsys):
    """parameters() and setup() run when the command checks its presses, before the first cell: one line
    (exit 2, a refused configuration), nothing written."""
    code, out, err = cli(["run", "--model", tiny, "--tasks", tasks, "--press", f"{MODULE}:{cls}", "--ratio", "0.5",
                          "--out", tmp_path / "o.jsonl"], capsys)
    assert code == 2
    assert_one_line_error(code, out, err, (f"press '{MODULE}:{cls}' {match}",))
    assert not (tmp_path / "o.jsonl").exists()


# -- a plugin module that exits while it is imported ----------------------------------------------------

def test_a_plugin_that_exits_at_import_is_listed_as_broken(tasks, tmp_path, capsys, monkeypatch):
    declare_plugins(tmp_path / "site", monkeypatch, {"exiting": "exiting_press:Press", "vknorm": PRESS,
                                                     "baddefault": f"{MODULE}:BadDefault"}, dist="some-plugins")
    monkeypatch.setenv("COLUMNS", "240")
    code, stdout, err = cli(["presses", "list"], capsys)
    assert code == 0, err
    text = " ".join(stdout.split())
    assert "press plugin 'exiting' (exiting_press:Press, from some-plugins) failed to import: SystemExit: 3" in text
    assert any(line.startswith("│ vknorm ") for line in stdout.splitlines())
    assert any(line.startswith("│ knorm ") for line in stdout.splitlines())
    # a plugin whose parameters() raises is its own row's error, not the listing's
    assert "raised ZeroDivisionError in parameters()" in text
    # by import path: one line, before anything runs
    code, out, err = cli(["run", "--tasks", tasks, "--press", "exiting_press:Press", "--ratio", "0.5",
                          "--out", tmp_path / "o.jsonl"], capsys)
    assert code == 2
    assert_one_line_error(code, out, err, ("exiting_press", "failed", "SystemExit: 3"))


# -- 4. non-finite scores ----------------------------------------------------------------------------------

@pytest.mark.parametrize("cls,count", [("AllNan", "NaN of"), ("HalfNan", "NaN of")])
def test_nan_scores_are_a_cell_error(cls, count, tiny, tasks, tmp_path, capsys):
    press = f"{MODULE}:{cls}"
    _, recs = run(capsys, tiny, tasks, tmp_path / "out.jsonl", ["knorm", press])
    scored = [r for r in recs if r["press"] == press and r["ratio"] > 0]
    assert len(scored) == 6
    for r in scored:
        assert r["status"] == "error" and "ger" not in r, r
        assert r["error"].startswith(f"PressPluginError: press {press!r}: score() returned non-finite scores (")
        assert count in r["error"] and r["error"].endswith("a keep mask needs finite scores")
    assert all(r["status"] == "ok" for r in recs if r["press"] == "knorm")


def test_a_built_in_scorer_giving_nan_is_a_cell_error(monkeypatch):
    """kvroute's own scorers are trusted with the cache but not with finiteness: a NaN fails the cell."""
    original = KvpressScorer.score

    def nan_snapkv(self, x, ratio):
        s = original(self, x, ratio)
        if self.name == "snapkv":
            s[..., 3] = float("nan")
            s[..., 4] = float("inf")
        return s

    monkeypatch.setattr(KvpressScorer, "score", nan_snapkv)
    lm = tiny_model("llama", seed=0)
    settings = RunSettings(max_new_tokens=2)
    inst = generate_tasks(TaskSpec("base", n=1, seed=0))[0]
    recs = run_instance(Engine(lm, settings.decode_settings()), inst,
                        [Cell("knorm", 0.5), Cell("snapkv", 0.5), Cell("snapkv", 0.0)], settings=settings)
    assert [r["status"] for r in recs] == ["ok", "error", "ok"]
    assert recs[1]["error"] == ("EngineError: scorer 'snapkv' gave non-finite scores in layers 0, 1, 2 (6 NaN and 6 "
                                f"infinite of {3 * 2 * recs[1]['context_tokens']}); a keep mask needs finite scores")


def test_check_does_not_agree_with_a_nan_press(capsys):
    code, out, err = cli(["presses", "check", f"{MODULE}:HalfNan", "--n", "1", "--ratios", "0.5"], capsys)
    assert "agreement" not in out
    assert_one_line_error(code, out, err, (f"press '{MODULE}:HalfNan'", "non-finite scores"))


def test_scores_of_the_wrong_shape_dtype_or_device_are_refused():
    from kvroute.errors import PressPluginError
    from kvroute.presses.fence import checked_scores

    shape, cpu = torch.Size((1, 2, 5)), torch.device("cpu")
    assert checked_scores(torch.zeros(1, 2, 5), "press 'p'", "score()", shape, cpu).shape == shape
    for bad, match in [(torch.zeros(1, 2, 4), "shape [1, 2, 4], expected [1, 2, 5]"),
                       (torch.zeros(1, 2, 5, dtype=torch.long), "dtype torch.int64"),
                       (torch.zeros(1, 2, 5, device="meta"), "on meta, the keys are on cpu"),
                       (torch.tensor([[[1.0, float("inf"), 0, 0, 0]] * 2]), "2 infinite of 10")]:
        with pytest.raises(PressPluginError, match=match.replace("[", r"\[").replace("]", r"\]")):
            checked_scores(bad, "press 'p'", "score()", shape, cpu)
