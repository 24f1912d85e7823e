"""Presses of one's own (examples/press_plugin): by import path, by entry point, checked against kvpress.

Every case runs the real ``kvroute`` entry point in process on the tiny random Llama. The example
package is made importable by putting its folder on ``sys.path``; its entry point is declared by a
hand-made ``*.dist-info`` folder on ``sys.path`` (what ``pip install`` would write), so nothing is
installed anywhere.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import pytest
import torch

from kvroute.models import save_tiny_model
from kvroute.presses import build_press
from kvroute.presses import plugins as plugins_mod
from kvroute.presses.scorers import ScoreInputs, Scorer
from kvroute.tasks import TaskSpec, generate_tasks, save_tasks
from tests.integration.test_bad_inputs import assert_one_line_error, cli

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "press_plugin"
PRESS = "vknorm_press:ValueKeyNormPress"


@dataclass
class KeyNormScorer(Scorer):
    """A kvroute Scorer of one's own: -||k||, i.e. kvpress's Knorm written as a kvroute scorer."""

    name: ClassVar[str] = "key_norm_here"

    def score(self, x: ScoreInputs, ratio: float) -> torch.Tensor:
        return -torch.linalg.vector_norm(x.keys, dim=-1, dtype=torch.float32)  # [1, Hkv, T]


def _fresh_discovery() -> None:
    plugins_mod.plugins.cache_clear()
    plugins_mod._RESOLVED.clear()


@pytest.fixture(autouse=True)
def example_importable(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.syspath_prepend(str(EXAMPLE))
    _fresh_discovery()
    yield
    _fresh_discovery()


def declare_plugins(root: Path, monkeypatch: pytest.MonkeyPatch, entries: dict[str, str],
                    dist: str = "kvroute-press-example") -> None:
    """A ``dist-info`` folder declaring ``entries`` (name -> module:Class) in group kvroute.presses, on sys.path."""
    info = root / f"{dist.replace('-', '_')}-0.1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text("[kvroute.presses]\n" + "".join(f"{k} = {v}\n" for k, v in entries.items()))
    monkeypatch.syspath_prepend(str(root))
    _fresh_discovery()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_model(tmp_path_factory.mktemp("plugins-model") / "tiny-llama", "llama", seed=0)


@pytest.fixture(scope="module")
def tasks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    p = tmp_path_factory.mktemp("plugins-tasks") / "tasks.jsonl"
    save_tasks(generate_tasks(TaskSpec("base", n=2, seed=0)), p)
    return p


def run_records(capsys, tiny: Path, tasks: Path, out: Path, presses: list[str]) -> list[dict]:
    argv = ["run", "--model", tiny, "--tasks", tasks, "--ratio", "0.5", "--ratio", "0.9", "--max-new-tokens", "4",
            "--out", out]
    for p in presses:
        argv += ["--press", p]
    code, stdout, err = cli(argv, capsys)
    assert code == 0, err
    return [json.loads(line) for line in out.read_text().splitlines()]


def test_import_path_presses_run_and_keep_the_name_given(tiny, tasks, tmp_path, capsys):
    """An outside ScorerPress (with a parameter and a selection) and an outside Scorer run as built-ins do;
    the Scorer that is Knorm written anew answers exactly as the built-in knorm."""
    given = [f"{PRESS}[alpha=0.5]", f"{PRESS}+adakv", "tests.integration.test_press_plugins:KeyNormScorer", "knorm"]
    recs = run_records(capsys, tiny, tasks, tmp_path / "out.jsonl", given)
    assert len(recs) == 2 * len(given) * 2
    assert all(r["status"] == "ok" for r in recs), [r.get("error") for r in recs]
    assert {r["press"] for r in recs} == set(given)  # the record's press is the string the user gave
    assert {r["scorer"] for r in recs} >= {f"{PRESS}[alpha=0.5]", PRESS}
    by = {(r["id"], r["press"], r["ratio"]): r for r in recs}
    for (iid, press, ratio), r in by.items():
        if press == "knorm":
            mine = by[(iid, "tests.integration.test_press_plugins:KeyNormScorer", ratio)]
            assert (mine["answer"], mine["kept_fraction"], mine["ger"]) == (r["answer"], r["kept_fraction"], r["ger"])


def test_ratio_dependence_of_outside_presses():
    """kvpress sets the ratio before every score(): an outside press is scored per ratio unless it says otherwise."""
    assert not build_press(PRESS).scorer.ratio_dependent  # the example's kvroute_options say so
    assert build_press("kvpress:KnormPress").scorer.ratio_dependent  # no options: the safe default
    assert build_press(f"{PRESS}[alpha=2]").scorer.press.alpha == 2.0  # an int given for a float field is cast


SWEEP = """
name = "plugins"
models = ["{model}"]
presses = ["{press}[alpha=0.5]", "vknorm+adakv"]
ratios = [0, 0.5]

[[tasks]]
family = "base"
n = 2

[decoding]
max_new_tokens = 3
"""


def test_sweep_config_by_import_path_and_entry_point_resumes(tiny, tmp_path, capsys, monkeypatch):
    declare_plugins(tmp_path / "site", monkeypatch, {"vknorm": PRESS})
    cfg = tmp_path / "sweep.toml"
    cfg.write_text(SWEEP.format(model=tiny, press=PRESS))
    out = tmp_path / "run"
    code, stdout, err = cli(["sweep", cfg, "--out", out], capsys)
    assert code == 0, err
    assert "6 cells computed" in stdout  # per instance: the baseline + 2 presses at 0.5
    _fresh_discovery()  # a later process discovers anew: the cell keys must come out the same
    code, stdout, err = cli(["sweep", cfg, "--out", out, "--resume"], capsys)
    assert code == 0, err
    assert "0 cells computed, 6 already in the store" in stdout


def test_entry_point_press_is_listed_run_and_checked(tiny, tasks, tmp_path, capsys, monkeypatch):
    declare_plugins(tmp_path / "site", monkeypatch, {"vknorm": PRESS})
    monkeypatch.setenv("COLUMNS", "240")  # one table row per line (the console reads it on every print)
    code, stdout, err = cli(["presses", "list"], capsys)
    assert code == 0, err
    row = next(line for line in stdout.splitlines() if line.startswith("│ vknorm "))
    assert "plugin kvroute-press-example" in row and "alpha=1.0" in row
    knorm_row = next(line for line in stdout.splitlines() if line.startswith("│ knorm "))
    assert "kvpress" in knorm_row
    recs = run_records(capsys, tiny, tasks, tmp_path / "out.jsonl", ["vknorm[alpha=0.5]", f"{PRESS}[alpha=0.5]"])
    by = {(r["id"], r["press"], r["ratio"]): r["answer"] for r in recs}
    for (iid, _, ratio), answer in by.items():  # the plugin name and the import path are one press
        assert answer == by[(iid, f"{PRESS}[alpha=0.5]", ratio)]
    code, stdout, err = cli(["presses", "check", "vknorm[alpha=0.5]", "--n", "2"], capsys)
    assert code == 0, stdout + err
    assert stdout.strip().splitlines()[-1] == "agreement: 8/8"


def test_check_says_when_there_is_nothing_to_compare(capsys):
    code, stdout, err = cli(["presses", "check", "tests.integration.test_press_plugins:KeyNormScorer"], capsys)
    assert code == 0, err
    assert "kvroute Scorer" in stdout and "no press to compare" in stdout


def test_check_reports_a_mismatch_and_exits_1(capsys, monkeypatch):
    """A scorer whose kvroute side differs from its kvpress side (here: kvroute's scores negated) must fail."""
    from kvroute.presses.scorers.kvpress_adapter import KvpressScorer

    original = KvpressScorer.score
    monkeypatch.setattr(KvpressScorer, "score", lambda self, x, ratio: -original(self, x, ratio))
    code, stdout, err = cli(["presses", "check", "knorm", "--n", "1", "--ratios", "0.75,0.9"], capsys)
    assert code == 1, stdout + err
    lines = stdout.strip().splitlines()
    assert lines[-1].startswith("agreement: ") and lines[-1] != "agreement: 2/2"
    assert any(line.startswith("mismatch ") and "knorm@" in line for line in lines)


@pytest.mark.parametrize("press,match", [
    ("no_such_pkg_xyz.presses:MyPress[alpha=1]", ("no module named 'no_such_pkg_xyz'", "PYTHONPATH")),
    ("vknorm_pres:ValueKeyNormPress", ("no module named 'vknorm_pres'", "did you mean 'vknorm_press'")),
    ("vknorm_press:ValueKeyNormPres", ("has no attribute 'ValueKeyNormPres'", "did you mean 'ValueKeyNormPress'")),
    ("vknorm_press:torch", ("is the module torch, not a press class", "ScorerPress subclass")),
    ("kvpress:AdaKVPress", ("not a ScorerPress", "accepted")),
    (f"{PRESS}[beta=1]", ("unknown parameter", "beta", "alpha")),
    (f"{PRESS}[alpha=high]", ("alpha must be a number",)),
    ("vknorm_press.ValueKeyNormPress", ("module:Class",)),
])
def test_bad_import_paths_fail_in_one_line(press, match, tasks, tmp_path, capsys):
    code, out, err = cli(["run", "--tasks", tasks, "--press", press, "--ratio", "0.5", "--out", tmp_path / "o.jsonl"],
                         capsys)
    assert code == 2
    assert_one_line_error(code, out, err, match)
    assert not (tmp_path / "o.jsonl").exists()


def test_broken_and_clashing_plugins(tasks, tmp_path, capsys, monkeypatch):
    """A plugin that fails to import fails when used, naming itself; a built-in's name is refused; others work."""
    (tmp_path / "mods").mkdir()
    (tmp_path / "mods" / "broken_press.py").write_text("import no_such_dependency_xyz\n")
    monkeypatch.syspath_prepend(str(tmp_path / "mods"))
    declare_plugins(tmp_path / "site", monkeypatch, {"broken": "broken_press:Press", "knorm": PRESS, "vknorm": PRESS},
                    dist="some-plugins")
    code, out, err = cli(["run", "--tasks", tasks, "--press", "broken", "--ratio", "0.5",
                          "--out", tmp_path / "o.jsonl"], capsys)
    assert_one_line_error(code, out, err, ("plugin 'broken'", "broken_press:Press", "some-plugins",
                                           "failed to import", "no_such_dependency_xyz"))
    assert code == 2
    assert build_press("vknorm").scorer.press_cls.__name__ == "ValueKeyNormPress"  # the others still resolve
    assert build_press("knorm").scorer.press_cls.__name__ == "KnormPress"  # the built-in wins
    code, stdout, err = cli(["presses", "list"], capsys)
    assert code == 0, err
    text = " ".join(stdout.split())
    assert "press plugin 'knorm'" in text and "refused" in text and "built-ins win" in text
    assert "plugin 'broken'" in text and "failed to import" in text
    assert "vknorm" in text


def test_plugins_are_not_discovered_at_import_or_for_built_in_names(tmp_path, monkeypatch):
    declare_plugins(tmp_path / "site", monkeypatch, {"vknorm": PRESS})
    build_press("snapkv[window_size=8]+adakv")
    assert plugins_mod.plugins.cache_info().currsize == 0  # a registered name never reads the entry points
    build_press("vknorm")
    assert plugins_mod.plugins.cache_info().currsize == 1
