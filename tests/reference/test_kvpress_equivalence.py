"""kvroute's masked engine against kvpress's own code paths, on tiny random models (fp32).

Every scorer registered through the kvpress adapter is checked here, read from the registry: a
kvpress scorer registered later is in this test the moment it is registered, so it cannot land
without answering token for token as kvpress's pipeline does at every ratio below.
"""

from dataclasses import dataclass

import pytest
import torch

from kvroute.engine import Cell, DecodeSettings, Engine
from kvroute.engine.reference import kvpress_logits, kvpress_press, kvpress_prompt_ids
from kvroute.models import tiny_model
from kvroute.presses import SCORERS, build_press
from kvroute.presses.check import compare_prompt
from kvroute.presses.scorers import KvpressScorer
from kvroute.presses.scorers.kvpress_adapter import seeded_kvpress_layers
from tests.masked_reference import masked_reference_logits

pytestmark = pytest.mark.reference

CONTEXT = ("Alice Morgan was born in Ferravik in 1987 and works as a glassblower for the Northwind Company. "
           "Her brother lives in Quenby; his manager is Tobias Vell, who was born on 12 March 1961. ") * 3
QUESTION = "Question: where was Alice born? Answer briefly."
RATIOS = (0.25, 0.5, 0.75, 0.9)
MAX_NEW_TOKENS = 8
SEED = 0  # the engine's default seed: random scorers draw from layer_seed(SEED, layer) on both sides

# Parameters a 128-token prompt needs; every other registered scorer runs with kvpress's defaults.
TINY_PARAMS = {"snapkv": "window_size=16"}
# Variants reaching code paths the defaults skip on 128 tokens: LagKV's partitions (n_sink + 2·lag_size ≤ T),
# several attention tiles (one padded), a sketch narrower than head_dim 16 (so the random draw decides the
# scores), CUR's random projection and other leverage types, Compactor with a fixed blending (scored once).
VARIANTS = ("lagkv[lag_size=16]", "lagkv[lag_size=16,cross_scoring=true]", "leverage[sketch_dimension=8]",
            "cur[use_random_leverage=true]", "cur[leverage_type=kv_avg,use_local_approximation=false]",
            "non_causal_attention[chunk_size=48]", "compactor[chunk_size=32,sketch_dimension=8]",
            "compactor[blending=0.5,sink_size_end=0]", "cap[tau=1.0,n_future_positions=64]", "kvpress_random[seed=3]")
CHUNKED = ("expected_attention+chunk[chunk_length=64]", "snapkv[window_size=16]+chunk[chunk_length=80]",
           # random scorers under chunking: the chunks of a layer continue one stream, as in kvpress's ChunkPress
           "leverage[sketch_dimension=8]+chunk[chunk_length=48]",
           "compactor[chunk_size=16,sketch_dimension=8]+chunk[chunk_length=64]")
# kvroute's own scorers: no kvpress reference (checked by their own control tests, tests/integration).
OWN_SCORERS = {"random", "oracle", "anti_oracle"}


def kvpress_scorers() -> list[str]:
    """Every scorer in the registry that wraps a kvpress press."""
    return sorted(n for n, cls in SCORERS.items() if issubclass(cls, KvpressScorer))


def registry_presses() -> list[str]:
    return [f"{n}[{TINY_PARAMS[n]}]" if n in TINY_PARAMS else n for n in kvpress_scorers()]


@dataclass
class Prompt:
    context_ids: list[int]
    question_ids: list[int]
    kvpress_context: str = CONTEXT
    kvpress_question: str = QUESTION
    answer_prefix: str = ""


_MODELS: dict[str, object] = {}


def _model(arch):
    if arch not in _MODELS:
        _MODELS[arch] = tiny_model(arch, seed=0)
    return _MODELS[arch]


def _run(lm, presses, ratios=RATIOS):
    c, q = kvpress_prompt_ids(lm.tokenizer, CONTEXT, QUESTION)
    cells = [Cell(p, r) for p in presses for r in ratios]
    res = Engine(lm, DecodeSettings(max_new_tokens=MAX_NEW_TOKENS, keep_logits=True)).run(Prompt(c, q), cells,
                                                                                           seed=SEED)
    return c, q, cells, res


def _assert_matches_kvpress(arch, presses):
    lm = _model(arch)
    c, q = kvpress_prompt_ids(lm.tokenizer, CONTEXT, QUESTION)
    cells = [Cell(p, r) for p in presses for r in RATIOS]
    engine = Engine(lm, DecodeSettings(max_new_tokens=MAX_NEW_TOKENS, keep_logits=True))
    res = compare_prompt(engine, Prompt(c, q), cells, seed=SEED)  # the comparison of `kvroute presses check`
    for cmp in res.cells:
        with seeded_kvpress_layers(lm.model, SEED):
            ref = kvpress_logits(lm, c, q, cmp.cell.press, cmp.cell.ratio)
        torch.testing.assert_close(cmp.ours.logits[0], ref[-1], atol=1e-4, rtol=0,
                                   msg=lambda m, cell=cmp.cell: f"{cell}: {m}")
        assert cmp.agrees, cmp.describe()


@pytest.mark.parametrize("press", registry_presses())
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_every_registered_kvpress_scorer_matches_kvpress(arch, press):
    """Token ids, text and first-token logits equal to kvpress's pipeline at ratios 0.25/0.5/0.75/0.9."""
    _assert_matches_kvpress(arch, [press])


@pytest.mark.parametrize("press", VARIANTS + CHUNKED)
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_scorer_variants_and_chunk_match_kvpress(arch, press):
    _assert_matches_kvpress(arch, [press])


def test_the_registry_is_what_is_checked():
    """Stale or misspelt entries here fail; a scorer outside the kvpress adapter must be declared kvroute's own."""
    registered = set(SCORERS.names())
    assert set(TINY_PARAMS) <= set(kvpress_scorers())
    for spec in VARIANTS + CHUNKED:
        assert isinstance(build_press(spec).scorer, KvpressScorer), spec
    assert registered - set(kvpress_scorers()) == OWN_SCORERS, (
        "a scorer that does not wrap a kvpress press has no reference here: register kvpress presses through "
        "register_kvpress, or declare a kvroute scorer in OWN_SCORERS with its own control test")
    for name in kvpress_scorers():  # each is buildable with the parameters this test gives it
        build_press(dict(zip(kvpress_scorers(), registry_presses(), strict=True))[name])


def test_random_scorers_depend_on_the_seed_and_only_on_it():
    """The seeding is what makes random presses comparable: without it kvpress's own run differs."""
    lm = _model("llama")
    c, q, cells, res = _run(lm, ["leverage[sketch_dimension=8]"], ratios=(0.5,))
    ours = res.outputs[0].logits[0]
    again = _run(lm, ["leverage[sketch_dimension=8]"], ratios=(0.5,))[3].outputs[0].logits[0]
    torch.testing.assert_close(ours, again, atol=0, rtol=0)  # same seed, same scores
    torch.manual_seed(1234)  # kvpress unseeded: its own draw
    unseeded = kvpress_logits(lm, c, q, "leverage[sketch_dimension=8]", 0.5)[-1]
    assert (ours - unseeded).abs().max() > 1e-3


def test_compactor_scores_depend_on_the_ratio():
    """blending = compression_ratio by default: scoring once for all ratios would change the masks."""
    lm = _model("llama")
    c, q, cells, res = _run(lm, ["compactor"], ratios=(0.25, 0.75))
    frozen = _run(lm, ["compactor[blending=0.25]"], ratios=(0.75,))[3].masks[0].mask
    assert build_press("compactor").scorer.ratio_dependent
    assert not build_press("compactor[blending=0.25]").scorer.ratio_dependent
    assert not torch.equal(res.masks[1].mask, frozen)


def _kvpress_adakv_masks(lm, c, spec, ratio):
    """The keep masks kvpress's AdaKVPress decides, read from the indices it stores on each module."""
    press = kvpress_press(spec, ratio)
    masks = []
    original = press.compress

    def recording(module, *args):
        out = original(module, *args)
        b, h, t = module.masked_key_indices
        keep = torch.ones(lm.info.num_kv_heads, len(c), dtype=torch.bool)
        keep[h, t] = False
        masks.append(keep)
        module.masked_key_indices = None
        return out

    press.compress = recording
    from transformers import DynamicCache

    with torch.inference_mode(), press(lm.model):
        lm.model.model(input_ids=torch.tensor([c]), past_key_values=DynamicCache(config=lm.model.config))
    return torch.stack(masks)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_adakv_selects_exactly_what_kvpress_selects(arch):
    lm = tiny_model(arch, seed=0, hidden=256, heads=4, kv_heads=2)  # head_dim 64: kvpress's fake keys exist
    presses = ["expected_attention+adakv", "knorm+adakv[alpha_safeguard=0.5]", "snapkv[window_size=16]+adakv"]
    c, q, cells, res = _run(lm, presses)
    for cell, out, mask in zip(cells, res.outputs, res.masks, strict=True):
        assert torch.equal(mask.mask, _kvpress_adakv_masks(lm, c, cell.press, cell.ratio)), cell
        # kvpress applies AdaKV's masks by overwriting evicted keys with a "fake key" whose logit is only
        # pushed below zero (on the tiny Llama it reaches about -3.5), so its attention leaks onto evicted
        # entries. kvroute masks exactly; its logits equal the independent exact-mask reference. kvpress's
        # generated text is therefore no reference here: on a random tiny model, whose next-token logits are
        # nearly tied, the leak alone can flip the first token (it does on the tiny Llama at ratio 0.9).
        ref = masked_reference_logits(lm, c, q, mask.mask)
        torch.testing.assert_close(out.logits[0], ref[-1], atol=1e-4, rtol=0)
