"""Routing metrics on the real embedded SmolLM2 over a task file (marked embedded; CI runs it).

- oracle at any ratio whose budget covers the evidence: GER is 0 for every instance;
- anti_oracle once the budget is smaller than the non-evidence tokens: GER is 1;
- at ratio 0 every metric equals its uncompressed value.
"""

import math

import pytest

from kvroute.engine import Cell, Engine
from kvroute.models import load_model
from kvroute.runner import RunSettings, run_instance
from kvroute.tasks import TaskSpec, build_prompt, generate_tasks

pytestmark = pytest.mark.embedded


@pytest.fixture(scope="module")
def setup():
    lm = load_model("smollm2-135m", device="cpu")
    tasks = generate_tasks(TaskSpec("base", n=3, seed=4)) + generate_tasks(TaskSpec("multi_entity", n=2, seed=4))
    settings = RunSettings(max_new_tokens=8)
    return lm, tasks, settings, Engine(lm, settings.decode_settings())


def test_oracle_and_anti_oracle_bound_ger(setup):
    lm, tasks, settings, engine = setup
    for inst in tasks:
        p = build_prompt(lm.tokenizer, inst)
        T = p.n_context
        n_ev = len([q for q in p.evidence_positions if q < T])
        covers = [r for r in (0.25, 0.5, 0.7, 0.8, 0.9) if int(T * (1 - r)) >= n_ev]
        starves = [r for r in (0.25, 0.5, 0.7, 0.8, 0.9) if int(T * (1 - r)) < T - n_ev]
        assert covers and starves
        cells = [Cell(f"oracle[base=knorm]+{s}", r) for s in ("per_head", "adakv") for r in covers]
        cells += [Cell("anti_oracle[base=knorm]", r) for r in starves]
        recs = run_instance(engine, inst, cells, settings=settings)
        for rec in recs:
            if rec["press"].startswith("oracle"):
                assert rec["ger"] == 0 and rec["ger_evidence"] == 0, (inst.id, rec["press"], rec["ratio"])
            else:
                assert rec["ger"] == 1 and rec["ger_evidence_all_layers"] == 1, (inst.id, rec["ratio"])
                assert rec["reachable"] is False


def test_ratio_zero_equals_the_uncompressed_cache(setup):
    lm, tasks, settings, engine = setup
    for inst in tasks[:3]:
        recs = run_instance(engine, inst, [Cell("expected_attention+adakv", 0.0), Cell("snapkv", 0.0)],
                            settings=settings)
        full = run_instance(engine, inst, [Cell("none", 0.0)], settings=settings)[0]
        for rec in recs:
            assert rec["answer"] == full["answer"]
            assert rec["ger"] == 0 and rec["eviction_rate"] == 0 and rec["kept_fraction"] == 1
            assert math.isclose(rec["evidence_attention_mass"], rec["evidence_attention_mass_full"], abs_tol=1e-6)
            assert rec["gold_logprob_delta"] == pytest.approx(0, abs=1e-5)
            assert min(rec["hidden_cosine"]) == pytest.approx(1, abs=1e-5)
            for c in ("consensus_nosink", "rho_nosink", "consensus_group_nosink", "consensus_withsink"):
                assert rec[c] == full[c], c
            assert rec["outcome"] == full["outcome"] and rec["f1"] == full["f1"]
