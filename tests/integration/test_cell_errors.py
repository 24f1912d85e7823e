"""Per-cell errors (a failing cell is recorded, the rest of the run goes on) and the gold answer's
natural tokenisation, on tiny in-process models."""

import json

import pytest
import torch
from typer.testing import CliRunner

from kvroute.analysis.load import load_records
from kvroute.analysis.summary import run_analysis
from kvroute.cli import app
from kvroute.engine import Cell, Engine
from kvroute.metrics.hallucination import Utilization
from kvroute.models import save_tiny_model
from kvroute.models.tiny import tiny_model
from kvroute.runner import RunSettings, gold_ids, run_instance
from kvroute.sweep import load_sweep_config, read_records, run_sweep
from kvroute.sweep.manifest import read_manifest
from kvroute.tasks import TaskSpec, generate_tasks, save_tasks
from kvroute.tasks.prompt import build_prompt


@pytest.fixture(scope="module")
def lm():
    return tiny_model("qwen2", seed=0)


@pytest.fixture(scope="module")
def unanswerable():
    """Coreference items whose referent is absent: no evidence positions, so oracle cannot run on them."""
    insts = [i for i in generate_tasks(TaskSpec("coreference", n=8, seed=0)) if i.unanswerable]
    assert insts
    return insts


# -- gold log-probability ---------------------------------------------------------------------------

def _teacher_forced(lm, prompt, ids):
    """log p(ids | prompt) with the full cache, by one plain forward of the whole sequence."""
    full = torch.tensor([prompt.input_ids + ids])
    with torch.no_grad():
        logits = lm.model(input_ids=full).logits[0].float()
    n = len(prompt.input_ids)
    logp = torch.log_softmax(logits[n - 1 : n - 1 + len(ids)], dim=-1)
    return float(logp.gather(-1, torch.tensor(ids).view(-1, 1)).sum())


@pytest.mark.parametrize("kw", [{}, {"answer_prefix": "Answer:", "system_prompt": "Be brief."}])
def test_gold_ids_are_the_space_prefixed_continuation(lm, kw):
    inst = generate_tasks(TaskSpec("base", n=1, seed=0))[0]
    tok = lm.tokenizer
    prompt = build_prompt(tok, inst, **kw)
    ids = gold_ids(tok, inst, prompt)
    assert tok.convert_ids_to_tokens(ids)[0].startswith("Ġ")
    assert tok.decode(ids) == " " + inst.answers[0]
    # the tokens the model would produce: the prompt followed by them tokenises as the joined text
    joined = tok(prompt.question_text + " " + inst.answers[0], add_special_tokens=False)["input_ids"]
    assert joined == prompt.question_ids + ids


def test_gold_ids_after_a_prefix_ending_in_a_space(lm):
    """An answer prefix ending in a space: no second space, and the prompt's tokens are never re-merged."""
    inst = generate_tasks(TaskSpec("base", n=1, seed=0))[0]
    tok = lm.tokenizer
    prompt = build_prompt(tok, inst, answer_prefix="Answer: ")
    ids = gold_ids(tok, inst, prompt)
    assert tok.decode(prompt.question_ids + ids).endswith("Answer: " + inst.answers[0])
    assert not tok.decode(ids).startswith("  ")


@pytest.mark.parametrize("kw", [{}, {"answer_prefix": "Answer:", "system_prompt": "Be brief."}])
def test_gold_logprob_is_the_natural_continuation(lm, kw):
    insts = generate_tasks(TaskSpec("base", n=2, seed=1)) + generate_tasks(TaskSpec("coreference", n=4, seed=0))
    settings = RunSettings(max_new_tokens=2, metrics=("utilization",), **kw)
    engine = Engine(lm, settings.decode_settings())
    tok = lm.tokenizer
    for inst in insts:
        rec = run_instance(engine, inst, [Cell("none", 0.0)], settings=settings)[0]
        prompt = build_prompt(tok, inst, **kw)
        gold = "I don't know" if inst.unanswerable else inst.answers[0]
        natural = tok(prompt.question_text + " " + gold,
                      add_special_tokens=False)["input_ids"][len(prompt.question_ids):]
        assert rec["gold_logprob"] == pytest.approx(_teacher_forced(lm, prompt, natural), abs=1e-3)


# -- per-cell errors in run_instance -------------------------------------------------------------------

def test_a_cell_that_cannot_run_is_recorded_and_the_others_go_on(lm, unanswerable):
    settings = RunSettings(max_new_tokens=2)
    engine = Engine(lm, settings.decode_settings())
    cells = [Cell("none", 0.0), Cell("oracle", 0.0), Cell("oracle", 0.5), Cell("knorm", 0.5), Cell("oracle+adakv", 0.9)]
    recs = run_instance(engine, unanswerable[0], cells, settings=settings)
    assert [r["status"] for r in recs] == ["ok", "ok", "error", "ok", "error"]
    for r in recs:
        if r["status"] == "error":
            assert r["error"].startswith("EngineError: ") and "evidence" in r["error"] and "\n" not in r["error"]
            assert "f1" not in r and "ger" not in r and "answer" not in r
            assert r["instance_id"] == unanswerable[0].id and r["scorer"] == "oracle"
        else:
            assert r.get("error") is None and "f1" in r


def test_a_metric_error_fails_only_its_cell(lm, monkeypatch):
    inst = generate_tasks(TaskSpec("base", n=1, seed=0))[0]
    real = Utilization.compute

    def flaky(self, ctx):
        if ctx.mask.press.startswith("knorm"):
            raise ValueError("no answer\nsecond line")
        return real(self, ctx)

    monkeypatch.setattr(Utilization, "compute", flaky)
    settings = RunSettings(max_new_tokens=2)
    recs = run_instance(Engine(lm, settings.decode_settings()), inst, [Cell("knorm", 0.5), Cell("snapkv", 0.5)],
                        settings=settings)
    assert recs[0]["status"] == "error" and recs[0]["error"] == "ValueError: no answer second line"
    assert "ger" not in recs[0]  # metrics computed before the failing one are dropped too
    assert recs[1]["status"] == "ok" and "f1" in recs[1]


@pytest.mark.parametrize("exc", [RuntimeError("CUDA out of memory"), KeyboardInterrupt()])
def test_unexpected_errors_are_not_swallowed(lm, monkeypatch, exc):
    from kvroute.presses.press import Press

    def boom(self, scores, ratio, aux=None, layers=None):
        raise exc

    monkeypatch.setattr(Press, "keep_mask", boom)
    inst = generate_tasks(TaskSpec("base", n=1, seed=0))[0]
    settings = RunSettings(max_new_tokens=2)
    with pytest.raises(type(exc)):
        run_instance(Engine(lm, settings.decode_settings()), inst, [Cell("knorm", 0.5)], settings=settings)


# -- the CLI and the sweep ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("tiny-qwen2-errors"), "qwen2", seed=0)


def test_cli_run_with_oracle_on_an_unanswerable_item_finishes(tiny_folder, tmp_path, unanswerable):
    tasks = tmp_path / "tasks.jsonl"
    base = generate_tasks(TaskSpec("base", n=2, seed=0))
    save_tasks([base[0], unanswerable[0], base[1]], tasks)  # the bad item in the middle
    out = tmp_path / "out.jsonl"
    res = CliRunner().invoke(app, ["run", "--model", str(tiny_folder), "--tasks", str(tasks), "--press", "oracle",
                                   "--press", "knorm", "--ratio", "0.5", "--max-new-tokens", "3", "--out", str(out)])
    assert res.exit_code == 0, res.output + repr(res.exception)
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(recs) == 3 * 2
    bad = [r for r in recs if r["status"] == "error"]
    assert [(r["id"], r["press"]) for r in bad] == [(unanswerable[0].id, "oracle")]
    assert "evidence" in bad[0]["error"] and "f1" not in bad[0]
    assert all("f1" in r for r in recs if r["status"] == "ok")
    assert "1 of 6 cells errored" in " ".join(res.output.split())
    assert "EngineError" in res.output


SWEEP = """
name = "errors"
models = ["{model}"]
presses = ["oracle", "knorm"]
ratios = [0, 0.5]

[[tasks]]
family = "coreference"
n = 4

[decoding]
max_new_tokens = 3
"""


@pytest.fixture(scope="module")
def sweep_run(tiny_folder, tmp_path_factory):
    d = tmp_path_factory.mktemp("sweep-errors")
    (d / "sweep.toml").write_text(SWEEP.format(model=tiny_folder))
    cfg = load_sweep_config(d / "sweep.toml")
    return cfg, d / "run", run_sweep(cfg, d / "run")


def test_a_sweep_with_oracle_and_coreference_finishes_and_counts_its_errors(sweep_run):
    cfg, run_dir, res = sweep_run
    recs = read_records(run_dir)
    assert res.computed == res.total_cells == len(recs)
    errored = [r for r in recs if r["status"] == "error"]
    assert errored and {(r["press"], r["ratio"]) for r in errored} == {("oracle", 0.5)}
    assert all(r["status"] == "ok" for r in recs if r["press"] != "oracle" or r["ratio"] == 0)
    by_press = {(r["press"], r["ratio"]): r for r in res.summary}
    assert by_press[("oracle", 0.5)]["errors"] == len(errored)
    assert all(r["errors"] == 0 for k, r in by_press.items() if k != ("oracle", 0.5))
    assert res.errored == len(errored)
    assert read_manifest(run_dir)["sessions"][-1]["cells_errored"] == len(errored)
    # the analysis leaves them out of every estimate and says how many there were, by press and reason
    df = load_records(run_dir)
    assert len(df) == len(recs) - len(errored) and "error" not in set(df.get("status", []))
    s = run_analysis(df).summary
    assert s["n_records"] == len(recs) - len(errored)
    assert s["cell_errors"]["n"] == len(errored)
    (group,) = s["cell_errors"]["groups"]
    assert group["press"] == "oracle" and group["n"] == len(errored) and "evidence" in group["error"]
    assert "cell_errors" in s["notes"] and str(len(errored)) in s["notes"]["cell_errors"]


def test_a_resumed_sweep_does_not_recompute_errored_cells(sweep_run):
    cfg, run_dir, res = sweep_run
    before = {r["key"]: r for r in read_records(run_dir)}
    again = run_sweep(cfg, run_dir, resume=True)
    assert again.computed == 0 and again.already_done == res.total_cells
    assert {r["key"]: r for r in read_records(run_dir)} == before
    # asked to, a resume computes the errored cells again (and, deterministic, they error again)
    retry = run_sweep(cfg, run_dir, resume=True, retry_errors=True)
    assert retry.computed == res.errored and retry.errored == res.errored
    assert len(read_records(run_dir)) == res.total_cells


def test_an_engine_built_for_other_settings_is_refused_before_any_cell(lm):
    """Not a per-cell error and not a bare TypeError deep in a metric: the mismatch itself, in one line."""
    from kvroute.errors import ConfigError

    inst = generate_tasks(TaskSpec("base", n=1, seed=0))[0]
    bare = Engine(lm, RunSettings(max_new_tokens=2, metrics=("utilization",)).decode_settings())
    with pytest.raises(ConfigError, match="capture") as err:
        run_instance(bare, inst, [Cell("knorm", 0.5)], settings=RunSettings(max_new_tokens=2))
    assert "\n" not in str(err.value)
    settings = RunSettings(max_new_tokens=2)
    with pytest.raises(ConfigError, match="decodes 2 new tokens, the engine 5"):
        run_instance(Engine(lm, RunSettings(max_new_tokens=5).decode_settings()), inst, [Cell("knorm", 0.5)],
                     settings=settings)
    assert run_instance(Engine(lm, settings.decode_settings()), inst, [Cell("knorm", 0.5)],
                        settings=settings)[0]["status"] == "ok"
