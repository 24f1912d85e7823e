"""KVzip's replay scored a block of query rows at a time gives kvpress's scores bit for bit (kvzip.BLOCK_BYTES)."""

from __future__ import annotations

import pytest
import torch

from kvroute.models import tiny_model
from kvroute.presses import build_press
from kvroute.presses.scorers import kvzip
from kvroute.presses.scorers.base import ModelScoreInputs

ARCHS = ("llama", "llama3", "mistral", "qwen2", "qwen3", "phi3")  # every tiny architecture kvpress's KVzip takes


def _scores(monkeypatch: pytest.MonkeyPatch, arch: str, spec: str, block: int | None,
            calls: list[int] | None = None) -> torch.Tensor:
    lm = tiny_model(arch)
    ids = torch.randint(5, lm.model.config.vocab_size, (1, 150), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        cache = lm.model(ids, use_cache=True).past_key_values
        scorer = build_press(spec).scorer
        scorer.setup(lm.model)
        scorer.setup_tokenizer(lm.tokenizer)
        monkeypatch.setattr(kvzip, "BLOCK_BYTES", block)
        if calls is not None:  # count the blocks: the whole map must not be one of them
            softmax = torch.nn.functional.softmax
            monkeypatch.setattr(torch.nn.functional, "softmax", lambda *a, **k: calls.append(1) or softmax(*a, **k))
        x = ModelScoreInputs(lm.model, ids, [layer.keys for layer in cache.layers],
                             [layer.values for layer in cache.layers])
        return scorer.score_model(x, 0.5).clone()


@pytest.mark.parametrize("spec", ["kvzip", "kvzip[chunk_size=40,n_sink=8]"])
@pytest.mark.parametrize("arch", ARCHS)
def test_blocks_of_rows_give_kvpress_scores_bit_for_bit(monkeypatch, arch, spec):
    whole = _scores(monkeypatch, arch, spec, None)  # kvpress's own score_kvzip: the whole map at once
    smallest, larger = [], []
    assert torch.equal(_scores(monkeypatch, arch, spec, 1, smallest), whole)  # blocks of kvzip.MIN_ROWS rows
    lm = tiny_model(arch)
    row = lm.model.config.num_attention_heads * 300 * 4  # a row's bytes over about 300 keys
    assert torch.equal(_scores(monkeypatch, arch, spec, 3 * kvzip.MIN_ROWS * row, larger), whole)
    layers = lm.model.config.num_hidden_layers
    assert len(smallest) > len(larger) > layers * (2 if "chunk_size=40" in spec else 1)  # several blocks a pass


def test_kvzip_plus_normalisation_runs_kvpress_own_scoring(monkeypatch):
    """KVzip+ (kvpress's normalised scores) is not made in blocks: its scores are kvpress's whatever BLOCK_BYTES."""
    spec = "kvzip[kvzip_plus_normalization=true]"
    assert torch.equal(_scores(monkeypatch, "qwen2", spec, 1), _scores(monkeypatch, "qwen2", spec, None))
    assert not torch.equal(_scores(monkeypatch, "qwen2", spec, None), _scores(monkeypatch, "qwen2", "kvzip", None))
