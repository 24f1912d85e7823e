"""Draft-verified decoding on the embedded models: the full cache's answer verified for every cell in one forward
gives the tokens of plain greedy decoding, and real models accept long stretches of it (marked embedded; Qwen2.5
also slow)."""

import pytest

from kvroute.engine import Cell, DecodeSettings, Engine
from kvroute.models import load_model
from kvroute.tasks import TaskSpec, build_prompt, generate_tasks

pytestmark = pytest.mark.embedded

PRESSES = ("snapkv", "expected_attention+adakv", "streaming_llm", "knorm")


@pytest.mark.parametrize("name", ["smollm2-135m", pytest.param("qwen2.5-0.5b", marks=pytest.mark.slow)])
def test_draft_verification_gives_greedy_tokens_on_the_embedded_models(name):
    lm = load_model(name, device="cpu")
    cells = [Cell(p, r) for p in PRESSES for r in (0.1, 0.3, 0.6, 0.9)]
    accepted = 0
    for task in generate_tasks(TaskSpec("base", n=2, seed=4)):
        prompt = build_prompt(lm.tokenizer, task)
        plain = Engine(lm, DecodeSettings(max_new_tokens=16, draft=False)).run(prompt, cells)
        drafted = Engine(lm, DecodeSettings(max_new_tokens=16, draft=True)).run(prompt, cells)
        assert drafted.full.tokens == plain.full.tokens
        for cell, a, b in zip(cells, plain.outputs, drafted.outputs, strict=True):
            assert a.tokens == b.tokens, cell
            common = next((i for i, (x, y) in enumerate(zip(a.tokens, plain.full.tokens, strict=False)) if x != y),
                          min(len(a.tokens), len(plain.full.tokens)))
            accepted += common
    assert accepted >= 20  # the accept path ran on real agreement, not only rejections at the first token
