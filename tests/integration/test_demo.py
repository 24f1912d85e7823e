"""The main job's pipeline end to end on a tiny model saved as a folder (the real demo uses SmolLM2)."""

import json

import pytest

from kvroute.demo import DEMO_MODEL, DEMO_PRESSES, DEMO_RATIOS, demo_config, run_demo
from kvroute.models import save_tiny_model
from kvroute.sweep import sweep_config_from_mapping


def test_demo_config_is_a_valid_sweep_with_the_required_presses():
    cfg = sweep_config_from_mapping(demo_config([DEMO_MODEL]), source="demo")
    assert {"expected_attention+adakv", "expected_attention", "expected_attention+routes", "snapkv[window_size=16]",
            "streaming_llm", "kvzip"} <= set(cfg.presses)
    assert list(cfg.ratios) == list(DEMO_RATIOS) and cfg.ratios[0] == 0 and 0.95 in cfg.ratios
    assert sum(1 for r in cfg.ratios if r >= 0.8) >= 4  # dense where the cliff lies
    lengths = sorted(t.spec.target_tokens for t in cfg.tasks if t.spec and t.spec.family == "long_context")
    assert len(lengths) >= 4 and lengths[-1] >= 10 * lengths[0]


def test_the_cli_demo_defaults_to_the_demo_model():
    import inspect

    from kvroute.cli.run import demo

    assert inspect.signature(demo).parameters["models"].default == DEMO_MODEL


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("tiny-llama"), "llama", seed=0)


def test_demo_runs_end_to_end_and_resumes(tiny_folder, tmp_path, monkeypatch):
    import kvroute.demo as demo

    # a smaller grid for the test: two presses, four ratios, one instance per family
    monkeypatch.setattr(demo, "DEMO_PRESSES", DEMO_PRESSES[:1] + ("snapkv[window_size=16]",))
    monkeypatch.setattr(demo, "DEMO_RATIOS", (0.0, 0.5, 0.9, 0.98))
    monkeypatch.setattr(demo, "DEMO_LENGTHS", ((160, 1), (320, 1)))
    res = run_demo([str(tiny_folder)], tmp_path / "run", scale=0.01, tickets=1, report_boot=50)
    assert res.report.is_file()
    html = res.report.read_text()
    assert "fig-cliff" in html and "fig-survival" in html
    summary = json.loads((tmp_path / "run" / "report" / "summary.json").read_text())
    assert summary["n_records"] > 0 and summary["headline"]
    assert any("wall time" in line for line in res.findings)
    assert list((tmp_path / "run" / "masks").glob("*.npz"))
    again = run_demo([str(tiny_folder)], tmp_path / "run", scale=0.01, tickets=1, report_boot=50)
    assert again.summary["n_records"] == summary["n_records"]  # resumed: nothing recomputed or duplicated


def test_resumed_demo_does_not_search_tickets_again(tiny_folder, tmp_path, monkeypatch):
    import kvroute.demo as demo

    monkeypatch.setattr(demo, "DEMO_PRESSES", DEMO_PRESSES[:1])
    monkeypatch.setattr(demo, "DEMO_RATIOS", (0.0, 0.5))
    monkeypatch.setattr(demo, "DEMO_LENGTHS", ((160, 1),))
    monkeypatch.setattr(demo, "DEMO_FAMILIES", (("base", 1, 3),))
    calls = []

    def fake_run_tickets(run_dir, lm, instances, **kw):  # writes what the real search writes on success
        calls.append([i.id for i in instances])
        with (run_dir / "tickets.jsonl").open("a") as f:
            for i in instances:
                f.write(json.dumps({"model": lm.name, "target": "gold", "family": i.family, "instance_id": i.id,
                                    "entries": 1, "total_entries": 10, "fraction": 0.1}) + "\n")
        return len(instances)

    monkeypatch.setattr(demo, "run_tickets", fake_run_tickets)
    run_demo([str(tiny_folder)], tmp_path / "run", scale=1, tickets=1, report_boot=20)
    assert len(calls) == 1 and len(calls[0]) == 1
    run_demo([str(tiny_folder)], tmp_path / "run", scale=1, tickets=1, report_boot=20)
    assert len(calls) == 1  # the model already has its ticket: nothing searched again
    run_demo([str(tiny_folder)], tmp_path / "run", scale=1, tickets=2, report_boot=20)
    assert len(calls) == 2 and len(calls[1]) == 1 and calls[1][0] != calls[0][0]  # only the missing one
    lines = (tmp_path / "run" / "tickets.jsonl").read_text().splitlines()
    assert len(lines) == 2
