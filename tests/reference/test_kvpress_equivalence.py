"""kvroute's masked engine against kvpress's own code paths, on tiny random models (fp32).

Both registries are read here. Every scorer registered through the kvpress adapter is checked with
its default selection (in the regime it needs: finch scores by the question, so its prompt holds
the question), and every selection strategy is checked on the press specs of ``SELECTION_CASES``
or declared kvroute's own (``OWN_SELECTIONS``). A scorer or selection registered later is in these
tests the moment it is registered, so it cannot land without answering as kvpress does.

The engine runs with draft verification on (the full cache's answer verified for every cell in one forward,
``DecodeSettings.draft``): its tokens must still be kvpress's.

Two ways kvpress applies a selection, two checks. Presses that prune (ScorerPress, ChunkPress,
ChunkKV, EntropyGatedChunkKV, Block, CriticalKV, Pyramid, Finch) must give the same generated token ids, text and
first-token logits as kvpress's pipeline. Presses that mask with kvpress's "fake keys" (AdaKV,
CriticalAdaKV, KVzip's global selection) must select exactly kvpress's masks, and decode exactly
under them (the independent masked reference); kvpress's fake keys only push a logit below zero, so
its own text leaks attention onto evicted entries and is no reference on random tiny models.
"""

import tempfile
from functools import cache
from pathlib import Path

import pytest
import torch
from transformers import DynamicCache

from kvroute.engine import Cell, DecodeSettings, Engine
from kvroute.engine.check import KVPRESS_FAILED, compare_prompt
from kvroute.engine.reference import _attn, kvpress_logits, kvpress_press, kvpress_prompt_ids
from kvroute.errors import EngineError
from kvroute.models import tiny_model
from kvroute.presses import SCORERS, SELECTIONS, build_press
from kvroute.presses.scorers import KvpressScorer
from kvroute.presses.scorers.kvpress_adapter import seeded_kvpress_layers
from kvroute.presses.scorers.local_weights import with_random_weights
from tests.kvpress_prompt import Prompt
from tests.masked_reference import masked_reference_logits

pytestmark = pytest.mark.reference

CONTEXT = ("Alice Morgan was born in Ferravik in 1987 and works as a glassblower for the Northwind Company. "
           "Her brother lives in Quenby; his manager is Tobias Vell, who was born on 12 March 1961. ") * 3
QUESTION = "Question: where was Alice born? Answer briefly."
RATIOS = (0.25, 0.5, 0.75, 0.9)
MAX_NEW_TOKENS = 8
SEED = 0  # the engine's default seed: random scorers draw from layer_seed(SEED, layer) on both sides

# Parameters a 128-token prompt needs; every other registered scorer runs with kvpress's defaults (and scorers
# with learned weights with random ones of the right shape, written by kvpress's class: see _with_weights).
TINY_PARAMS = {"snapkv": "window_size=16"}
# Variants reaching code paths the defaults skip on 128 tokens: LagKV's partitions (n_sink + 2·lag_size ≤ T),
# several attention tiles (one padded), a sketch narrower than head_dim 16 (so the random draw decides the
# scores), CUR's random projection and other leverage types, Compactor with a fixed blending (scored once).
VARIANTS = ("lagkv[lag_size=16]", "lagkv[lag_size=16,cross_scoring=true]", "leverage[sketch_dimension=8]",
            "cur[use_random_leverage=true]", "cur[leverage_type=kv_avg,use_local_approximation=false]",
            "non_causal_attention[chunk_size=48]", "compactor[chunk_size=32,sketch_dimension=8]",
            "compactor[blending=0.5,sink_size_end=0]", "cap[tau=1.0,n_future_positions=64]", "kvpress_random[seed=3]",
            "finch[normalize_scores=false]", "kvzip[chunk_size=40]", "kvzip[kvzip_plus_normalization=true]")
CHUNKED = ("expected_attention+chunk[chunk_length=64]", "snapkv[window_size=16]+chunk[chunk_length=80]",
           # random scorers under chunking: the chunks of a layer continue one stream, as in kvpress's ChunkPress
           "leverage[sketch_dimension=8]+chunk[chunk_length=48]",
           "compactor[chunk_size=16,sketch_dimension=8]+chunk[chunk_length=64]")
# Every selection: the presses that check it against kvpress (pruning presses first; see the module doc).
SELECTION_CASES = {
    "per_head": ("knorm+per_head", "snapkv[window_size=16]+per_head"),
    "chunk": CHUNKED + ("finch+chunk[chunk_length=160,rescore=false]",),
    "chunkkv": ("knorm+chunkkv", "expected_attention+chunkkv[chunk_length=7]", "snapkv[window_size=16]+chunkkv"),
    "block": ("knorm+block[block_size=16]", "expected_attention+block[block_size=40]",
              "snapkv[window_size=16]+block[block_size=32]"),
    "criticalkv": ("expected_attention+criticalkv", "snapkv[window_size=16]+criticalkv[first_stage_ratio=0.2]",
                   "knorm+criticalkv[first_stage_ratio=0,epsilon=0.01]"),
    "entropy_chunkkv": ("knorm+entropy_chunkkv", "snapkv[window_size=16]+entropy_chunkkv[chunk_length=7]",
                        "expected_attention+entropy_chunkkv[chunk_length=16,low_entropy_chunk_length=2]"),
    "pyramid": ("snapkv[window_size=16]+pyramid[window_size=16]",
                "snapkv[window_size=8]+pyramid[window_size=8,beta=4]"),
    "adakv": ("expected_attention+adakv", "knorm+adakv[alpha_safeguard=0.5]", "snapkv[window_size=16]+adakv"),
    "critical_adakv": ("expected_attention+critical_adakv", "knorm+critical_adakv[alpha_safeguard=0.5]",
                       "snapkv[window_size=16]+critical_adakv[first_stage_ratio=0.3]"),
    "global": ("kvzip", "kvzip+global[per_layer=true]", "kvzip[n_sink=8,chunk_size=50]+global"),
}
MASKED_BY_KVPRESS = {"adakv", "critical_adakv", "global"}  # kvpress applies them with fake keys (kvpress_fake_keys)
OWN_SELECTIONS = {"routes", "shared"}  # kvroute's own: no kvpress press selects this way (tests/unit checks them)
# kvroute's own scorers: no kvpress reference (checked by their own control tests, tests/integration).
OWN_SCORERS = {"random", "oracle", "anti_oracle"}


def kvpress_scorers() -> list[str]:
    """Every scorer in the registry that wraps a kvpress press."""
    return sorted(n for n, cls in SCORERS.items() if issubclass(cls, KvpressScorer))


def registry_presses() -> list[str]:
    return [f"{n}[{TINY_PARAMS[n]}]" if n in TINY_PARAMS else n for n in kvpress_scorers()]


@cache
def _model(arch, big=False):
    """A tiny model; ``big``: head_dim 64, where kvpress's fake keys exist. Its tokenizer is saved where
    ``config.name_or_path`` says, as kvpress's KVzip loads it from there."""
    import tempfile

    lm = tiny_model(arch, seed=0, **({"hidden": 256, "heads": 4, "kv_heads": 2} if big else {}))
    folder = tempfile.mkdtemp(prefix="kvroute-tiny-tok-")
    lm.tokenizer.save_pretrained(folder)
    lm.model.config.name_or_path = folder
    return lm


def _with_weights(lm, spec):
    """``spec`` with random weights for ``lm`` when its scorer reads learned weights (qfilter, kvzap, ...)."""
    if id(lm) not in _WEIGHTS:
        _WEIGHTS[id(lm)] = Path(tempfile.mkdtemp(prefix="kvroute-weights-"))
    return with_random_weights(spec, lm.model, _WEIGHTS[id(lm)])


_WEIGHTS: dict = {}  # id of a cached tiny model -> the folder of its random weights


def _prompt(lm, spec):
    """The prompt both sides run: the question inside the context for presses that score by it (finch)."""
    if build_press(spec).scorer.needs_question_window:
        c, q = kvpress_prompt_ids(lm.tokenizer, CONTEXT + QUESTION, "")
        window = len(lm.tokenizer.encode(QUESTION, add_special_tokens=False))
        return Prompt(c, q, CONTEXT + QUESTION, "", "", window)
    c, q = kvpress_prompt_ids(lm.tokenizer, CONTEXT, QUESTION)
    return Prompt(c, q, CONTEXT, QUESTION)


def _run(lm, presses, ratios=RATIOS):
    c, q = kvpress_prompt_ids(lm.tokenizer, CONTEXT, QUESTION)
    cells = [Cell(p, r) for p in presses for r in ratios]
    res = Engine(lm, DecodeSettings(max_new_tokens=MAX_NEW_TOKENS, keep_logits=True, draft=True)).run(
        Prompt(c, q, CONTEXT, QUESTION), cells, seed=SEED)
    return c, q, cells, res


def _masked_by_kvpress(spec):
    return build_press(_with_weights(_model("llama"), spec)).selection.kvpress_fake_keys


def _assert_matches_kvpress(arch, press, big=False):
    """Tokens, text and first-token logits equal to kvpress's pipeline; masks for fake-key presses (module doc).
    ``big``: on the head_dim-64 model (where the kept-entries attention kernel runs)."""
    if _masked_by_kvpress(press):
        return _assert_selects_as_kvpress(arch, press)
    lm = _model(arch, big=big)
    press = _with_weights(lm, press)
    prompt = _prompt(lm, press)
    cells = [Cell(press, r) for r in RATIOS]
    engine = Engine(lm, DecodeSettings(max_new_tokens=MAX_NEW_TOKENS, keep_logits=True, draft=True))
    res = compare_prompt(engine, prompt, cells, seed=SEED)  # the comparison of `kvroute presses check`
    compared = 0
    for cmp in res.cells:
        if not cmp.comparable:  # only a precondition kvpress states (finch's chunk length), never kvpress failing
            assert "kvpress" in (cmp.no_reference or "") and not cmp.no_reference.startswith(KVPRESS_FAILED), \
                cmp.describe()
            continue
        compared += 1
        with seeded_kvpress_layers(lm.model, SEED):
            ref = kvpress_logits(lm, prompt.context_ids, prompt.question_ids, cmp.cell.press, cmp.cell.ratio,
                                 prompt.question_window)
        torch.testing.assert_close(cmp.ours.logits[0], ref[-1], atol=1e-4, rtol=0,
                                   msg=lambda m, cell=cmp.cell: f"{cell}: {m}")
        assert cmp.agrees, cmp.describe()
    assert compared >= 2, f"{press}: kvpress ran only {compared} of {len(RATIOS)} ratios"


def _kvpress_masks(lm, c, spec, ratio):
    """The keep masks kvpress decides for a fake-key press, read from the indices it leaves on each module."""
    press = kvpress_press(spec, ratio)
    with torch.inference_mode(), _attn(lm, spec), press(lm.model):
        lm.model.model(input_ids=torch.tensor([c]), past_key_values=DynamicCache(config=lm.model.config))
    masks = []
    for layer in lm.model.model.layers:
        b, h, t = layer.self_attn.masked_key_indices
        keep = torch.ones(lm.info.num_kv_heads, len(c), dtype=torch.bool)
        keep[h, t] = False
        masks.append(keep)
        layer.self_attn.masked_key_indices = None
    return torch.stack(masks)


def _assert_selects_as_kvpress(arch, press):
    lm = _model(arch, big=True)
    c, q, cells, res = _run(lm, [_with_weights(lm, press)])
    for cell, out, mask in zip(cells, res.outputs, res.masks, strict=True):
        assert torch.equal(mask.mask, _kvpress_masks(lm, c, cell.press, cell.ratio)), cell
        ref = masked_reference_logits(lm, c, q, mask.mask)
        torch.testing.assert_close(out.logits[0], ref[-1], atol=1e-4, rtol=0, msg=lambda m, cell=cell: f"{cell}: {m}")


@pytest.mark.parametrize("press", registry_presses())
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_every_registered_kvpress_scorer_matches_kvpress(arch, press):
    """Each scorer with its default selection: as kvpress's pipeline at ratios 0.25/0.5/0.75/0.9."""
    _assert_matches_kvpress(arch, press)


@pytest.mark.parametrize("press", VARIANTS)
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_scorer_variants_match_kvpress(arch, press):
    _assert_matches_kvpress(arch, press)


@pytest.mark.parametrize("press", [p for cases in SELECTION_CASES.values() for p in cases])
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_every_registered_selection_matches_kvpress(arch, press):
    _assert_matches_kvpress(arch, press)


@pytest.mark.parametrize("press", ["snapkv[window_size=16]", "expected_attention", "streaming_llm", "knorm+per_head",
                                   "tova", "snapkv[window_size=16]+pyramid[window_size=16]"])
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_answers_through_the_kept_entries_kernel_match_kvpress(arch, press, monkeypatch):
    """On the head_dim-64 model the masked attention's forwards run through the kept-entries kernel
    (kvroute.engine.attention.kept) where it is built: the answers are still kvpress's. Under CI=true the kernel must
    run."""
    import os

    from kvroute.engine.attention import kept

    calls = []
    real = kept.kept_context
    monkeypatch.setattr("kvroute.engine.attention.kept.kept_context",
                        lambda *a, **kw: calls.append(1) or real(*a, **kw))
    _assert_matches_kvpress(arch, press, big=True)
    assert calls or (kept.kernel() is None and os.environ.get("CI") != "true"), "the kept-entries kernel did not run"


def registry_gaps() -> list[str]:
    """What the registries hold that this module does not check: each entry is one problem, in words."""
    gaps = []
    scorers, own = set(kvpress_scorers()), set(SCORERS.names()) - set(kvpress_scorers())
    if stale := set(TINY_PARAMS) - scorers:
        gaps.append(f"TINY_PARAMS names no registered kvpress scorer: {sorted(stale)}")
    if unchecked := own - OWN_SCORERS:
        gaps.append(f"scorers {sorted(unchecked)} wrap no kvpress press, so nothing here checks them: register kvpress "
                    "presses through register_kvpress, or declare a kvroute scorer in OWN_SCORERS with its own control "
                    "test")
    if gone := OWN_SCORERS - own:
        gaps.append(f"OWN_SCORERS names scorers that are not registered (or now wrap kvpress): {sorted(gone)}")
    selections = set(SELECTIONS.names())
    if unchecked := selections - set(SELECTION_CASES) - OWN_SELECTIONS:
        gaps.append(f"selections {sorted(unchecked)} have no kvpress cases: add them to SELECTION_CASES, or declare "
                    "them kvroute's own (OWN_SELECTIONS, with their own tests)")
    if (fake := {n for n, cls in SELECTIONS.items() if cls.kvpress_fake_keys}) != MASKED_BY_KVPRESS:
        gaps.append(f"selections marked kvpress_fake_keys {sorted(fake)} are not kvpress's fake-key presses "
                    f"{sorted(MASKED_BY_KVPRESS)}")
    if stale := (set(SELECTION_CASES) | OWN_SELECTIONS) - selections:
        gaps.append(f"SELECTION_CASES / OWN_SELECTIONS name unregistered selections: {sorted(stale)}")
    return gaps


def test_the_registry_is_what_is_checked():
    """Stale or misspelt entries here fail; a scorer outside the kvpress adapter must be declared kvroute's own,
    and a selection must have kvpress cases or be declared kvroute's own."""
    assert not registry_gaps(), registry_gaps()
    for spec in VARIANTS:
        assert isinstance(build_press(spec).scorer, KvpressScorer), spec
    for name in kvpress_scorers():  # each is buildable with the parameters this test gives it
        build_press(_with_weights(_model("llama"), dict(zip(kvpress_scorers(), registry_presses(), strict=True))[name]))
    assert not set(SELECTION_CASES) & OWN_SELECTIONS
    for name, cases in SELECTION_CASES.items():
        for spec in cases:
            assert build_press(spec).selection.name == name, spec
            kvpress_press(spec, 0.5, question_window=1)  # has a kvpress counterpart
    for name in OWN_SELECTIONS:
        with pytest.raises(EngineError):
            kvpress_press(f"knorm+{name}", 0.5)


def test_a_scorer_or_selection_registered_without_its_checks_fails_the_run():
    """Register a dummy scorer and a dummy selection, as a contributor would without adding their checks: the
    registry check above names each (and a kvpress press registered the usual way is checked automatically)."""
    from kvpress import KnormPress

    from kvroute.presses.scorers import register_kvpress
    from kvroute.presses.scorers.base import Scorer
    from kvroute.presses.selection.base import Selection

    class Dummy(Scorer):
        name = "dummy_scorer"

        def score(self, x, ratio):
            return x.keys.norm(dim=-1)

    class DummySelection(Selection):
        name = "dummy_selection"

        def select(self, scores, ratio):
            return scores >= scores.median()

    SCORERS.register("dummy_scorer", Dummy)
    SELECTIONS.register("dummy_selection", DummySelection)
    try:
        gaps = registry_gaps()
        assert len(gaps) == 2 and "dummy_scorer" in gaps[0] and "dummy_selection" in gaps[1], gaps
    finally:
        SCORERS._items.pop("dummy_scorer")
        SELECTIONS._items.pop("dummy_selection")
    register_kvpress("dummy_kvpress", KnormPress, "a kvpress press registered the usual way")
    try:
        assert not registry_gaps() and "dummy_kvpress" in registry_presses()  # in the equivalence test at once
    finally:
        SCORERS._items.pop("dummy_kvpress")
    assert not registry_gaps()


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


# Serving constraints (kvroute.presses.constraints): kvpress has a counterpart for per_head+paged[block=B]+uniform
# (mean over the block, sum over heads), ChunkKVPress at chunk_length=B, where the ratio keeps whole chunks;
# the others are kvroute's own, checked on hand-built scores (tests/unit/test_constraints.py).
CONSTRAINT_CASES = {"paged": ("knorm", "snapkv[window_size=16]"), "uniform": ("knorm", "snapkv[window_size=16]")}
OWN_CONSTRAINTS = {"layer_budget"}


def test_every_constraint_is_checked_or_declared_own():
    from kvroute.presses.constraints import CONSTRAINTS

    assert set(CONSTRAINT_CASES) | OWN_CONSTRAINTS == set(CONSTRAINTS.names())
    assert not set(CONSTRAINT_CASES) & OWN_CONSTRAINTS


@pytest.mark.parametrize("scorer", sorted({s for cases in CONSTRAINT_CASES.values() for s in cases}))
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_paged_uniform_is_kvpress_chunkkv_where_the_ratio_keeps_whole_chunks(arch, scorer):
    """On a context cut to 4 whole blocks, at 0.25/0.5/0.75 (int(T·(1 − α)) = whole chunks), the answers and
    first-token logits equal kvpress's ChunkKVPress pipeline; at 0.9 the two keep different counts (kvpress one
    whole chunk, kvroute int(T·0.1) tokens), so kvpress is no reference there."""
    lm = _model(arch)
    c, q = kvpress_prompt_ids(lm.tokenizer, CONTEXT, QUESTION)
    block = len(c) // 4
    c = c[: 4 * block]  # [T] with T = 4 · block: every chunk whole
    press = f"{scorer}+paged[block={block}]+uniform"
    counterpart = build_press(press)
    for ratio in (0.25, 0.5, 0.75):
        ref_press = counterpart.selection.kvpress_counterpart(counterpart.scorer, ratio)
        assert type(ref_press).__name__ == "ChunkKVPress" and ref_press.chunk_length == block
        engine = Engine(lm, DecodeSettings(max_new_tokens=MAX_NEW_TOKENS, keep_logits=True))
        res = engine.run(Prompt(c, q, CONTEXT, QUESTION), [Cell(press, ratio)], seed=SEED)
        assert res.masks[0].mask.sum(-1).unique().tolist() == [int(len(c) * (1 - ratio))]
        with seeded_kvpress_layers(lm.model, SEED):
            ref = kvpress_logits(lm, c, q, press, ratio)  # the constraint's own counterpart: ChunkKVPress
        torch.testing.assert_close(res.outputs[0].logits[0], ref[-1], atol=1e-4, rtol=0,
                                   msg=lambda m, r=ratio: f"{press} at {r}: {m}")
