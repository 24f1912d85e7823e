"""Built-in kvpress scorers name their press and read its parameters from a table, not from kvpress.

The table (kvroute.presses.scorers.kvpress_fields) must equal kvpress's own dataclass fields, the
press must be what the scorer builds when it is used, and the commands that load no model must
not import kvpress or transformers (kvpress patches every attention function when imported).
"""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import version

import kvpress
import pytest

from kvroute.engine.check import no_kvpress_counterpart
from kvroute.presses import SCORERS, build_press
from kvroute.presses.scorers.kvpress_adapter import KvpressClass, KvpressScorer
from kvroute.presses.scorers.kvpress_fields import KVPRESS_FIELDS, KVPRESS_VERSION, format_table, live_fields
from kvroute.presses.scorers.local_weights import LocalWeightsScorer

BUILT_IN = sorted(n for n, cls in SCORERS.items() if issubclass(cls, KvpressScorer))


def test_the_table_is_kvpress_s_own_fields():
    assert version("kvpress") == KVPRESS_VERSION, (
        "kvpress changed version: run `python -m kvroute.presses.scorers.kvpress_fields` and paste its output "
        "into kvroute/presses/scorers/kvpress_fields.py")
    for name, fields in KVPRESS_FIELDS.items():
        assert fields == live_fields(getattr(kvpress, name)), name
    assert {SCORERS.get(n).press_name() for n in BUILT_IN} == set(KVPRESS_FIELDS), "a table row per built-in press"
    namespace: dict = {"Any": object}
    exec(format_table(KVPRESS_FIELDS).replace(": dict[str, dict[str, Any]]", ""), namespace)
    assert namespace["KVPRESS_FIELDS"] == KVPRESS_FIELDS  # the printed table reads back as itself


@pytest.mark.parametrize("name", BUILT_IN)
def test_a_built_in_names_its_press_and_builds_it_when_used(name):
    cls = SCORERS.get(name)
    assert cls.lazy() and isinstance(cls.__dict__.get("press_cls") or next(
        vars(c)["press_cls"] for c in cls.__mro__ if "press_cls" in vars(c)), KvpressClass)
    assert cls.press_cls is getattr(kvpress, cls.press_name())  # the descriptor resolves to kvpress's class
    spec = f"{name}[weights=/tmp]" if name in ("qfilter", "kvzap") else (
        f"{name}[stats_folder=/tmp]" if name == "expected_attention_stats" else name)
    scorer = build_press(spec).scorer
    assert "_press" not in scorer.__dict__  # not built at config time
    press = scorer.press
    assert isinstance(press, cls.press_cls) and scorer.press is press  # built once, on first use
    if not issubclass(cls, LocalWeightsScorer):  # (those need real weights to build; `presses list` says so)
        assert no_kvpress_counterpart(spec) is None  # `presses list` says "equal" for built-ins without asking


def test_a_schema_value_kvpress_refuses_still_fails_at_first_use_with_a_config_error():
    from kvroute.errors import ConfigError

    scorer = build_press("kvzip[chunk_size=8]").scorer
    scorer.params["chunk_size"] = 0  # past the schema (lo=1), as a bug in a schema would let through
    with pytest.raises(ConfigError, match="KVzipPress refused the parameters"):
        _ = scorer.press


@pytest.mark.parametrize("argv", [["presses", "list"], ["sweep", "{config}", "--out", "{out}", "--dry-run"]])
def test_model_free_commands_import_neither_kvpress_nor_transformers(argv, tmp_path):
    config = tmp_path / "c.toml"
    config.write_text('name = "t"\nmodels = ["smollm2-135m"]\npresses = ["expected_attention", "snapkv", '
                      '"expected_attention+adakv", "kvzip", "finch+chunk[rescore=false]"]\nratios = [0.0, 0.5]\n'
                      'regimes = ["aware"]\n[[tasks]]\nfamily = "base"\nn = 2\n')
    args = [a.format(config=config, out=tmp_path / "run") for a in argv]
    code = ("import runpy, sys\n"
            f"sys.argv = ['kvroute', *{args!r}]\n"
            "try:\n    runpy.run_module('kvroute.cli', run_name='__main__')\n"
            "except SystemExit as e:\n    assert not e.code, e.code\n"
            "print('HEAVY', sorted(m for m in ('kvpress', 'transformers') if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "HEAVY []" in out.stdout, out.stdout[-500:]
