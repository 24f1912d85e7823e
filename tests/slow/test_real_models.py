"""The engine against the kvpress pipeline on both embedded models (`make test-slow`, a few minutes).

The default run checks equivalence on tiny random models and benchmarks/equivalence.py checks 480
cells on SmolLM2; these tests keep a small real-model check, on both architectures, one command away.
"""

import pytest

from kvroute.engine import Cell, DecodeSettings, Engine
from kvroute.engine.reference import kvpress_answer, kvpress_pipeline
from kvroute.models import load_model
from kvroute.runner import RunSettings, run_instance
from kvroute.tasks import TaskSpec, build_prompt, generate_tasks

pytestmark = [pytest.mark.slow, pytest.mark.embedded]

CELLS = [Cell("snapkv", 0.5), Cell("expected_attention+adakv", 0.75), Cell("knorm+chunk[chunk_length=48]", 0.5),
         Cell("streaming_llm", 0.9), Cell("expected_attention", 0.25), Cell("tova", 0.75),
         Cell("observed_attention", 0.5)]


@pytest.fixture(scope="module", params=["smollm2-135m", "qwen2.5-0.5b"])
def lm(request):
    return load_model(request.param, device="cpu", dtype="float32")


def test_answers_equal_the_kvpress_pipeline(lm):
    tasks = generate_tasks(TaskSpec("base", n=2, seed=3), lm.tokenizer)
    tasks += generate_tasks(TaskSpec("multi_entity", n=1, seed=3), lm.tokenizer)
    engine = Engine(lm, DecodeSettings(max_new_tokens=12, capture=False))
    pipe = kvpress_pipeline(lm)
    for t in tasks:
        p = build_prompt(lm.tokenizer, t)
        ours = engine.run(p, CELLS, decode_full=False).outputs
        for cell, out in zip(CELLS, ours, strict=True):
            ref = kvpress_answer(lm, p.kvpress_context, p.kvpress_question, cell.press, cell.ratio,
                                 max_new_tokens=12, pipeline=pipe)
            assert out.text == ref, (lm.name, t.id, cell)


def test_oracle_keeps_evidence_and_ratio_zero_is_uncompressed(lm):
    inst = generate_tasks(TaskSpec("base", n=1, seed=4), lm.tokenizer)[0]
    settings = RunSettings(max_new_tokens=12)
    engine = Engine(lm, settings.decode_settings())
    recs = run_instance(engine, inst, [Cell("none", 0.0), Cell("oracle", 0.5), Cell("anti_oracle", 0.98),
                                       Cell("snapkv", 0.0)], settings=settings)
    full, oracle, anti, zero = recs
    assert oracle["ger"] == 0.0 and oracle["ger_all_layers"] == 0.0
    assert anti["ger"] == 1.0
    assert zero["answer"] == full["answer"] and zero["ger"] == 0.0
    assert zero["gold_logprob_delta"] == pytest.approx(0.0, abs=1e-5)
