"""The engine's equivalences over every architecture and head size of the tiny-model registry.

:data:`kvroute.models.tiny.TINY_ARCHITECTURES` holds one tiny random model per architecture kvpress supports (Llama,
Llama 3, Mistral, Qwen2, Qwen3, Phi-3, Gemma 3); each test here runs over all of them (tiny_variants), so a new
architecture is checked by adding it to the registry. For each studied (architecture, head size): masked decoding
equals the pruned cache (kvpress's hooks) and an independent eager forward with 4D masks, batched equals one by one,
ratio 0 and restoring every entry equal the uncompressed answer, and a couple of presses equal kvpress's pipeline
token for token. Gemma 3 leaves the layers whole that kvpress leaves whole; a prompt past its window is refused.

The kept-entries kernel (kvroute.engine.attention.kept) is off here except in its own test: PyTorch's kernels give the
reference numbers, and the kernel is compared with them at the registry's head sizes where it is built.
"""

from functools import cache

import pytest
import torch

from kvroute.engine import Cell, DecodeSettings, Engine
from kvroute.engine.check import compare_prompt
from kvroute.engine.decode import decode_cells
from kvroute.engine.generate import greedy_generate
from kvroute.engine.prefill import prefill
from kvroute.engine.reference import kvpress_logits, kvpress_prompt_ids
from kvroute.errors import ModelLoadError
from kvroute.models import load_model
from kvroute.models.tiny import TINY_ARCHITECTURES, save_tiny_model, tiny_model, tiny_variants
from kvroute.presses import KeepMask
from kvroute.presses.scorers.kvpress_adapter import seeded_kvpress_layers
from tests.kvpress_prompt import Prompt
from tests.masked_reference import masked_reference_logits

CONTEXT = ("Alice Morgan was born in Ferravik in 1987 and works as a glassblower for the Northwind Company. "
           "Her brother lives in Quenby; his manager is Tobias Vell. ") * 2
QUESTION = "Question: where was Alice born? Answer briefly."
STUDIED = tiny_variants()
IDS = [f"{arch}-{d}" for arch, d in STUDIED]


@cache
def _setup(arch, head_dim):
    lm = tiny_model(arch, seed=0, **TINY_ARCHITECTURES[arch].sizes(head_dim))
    c, q = kvpress_prompt_ids(lm.tokenizer, CONTEXT, QUESTION)
    return lm, Prompt(c, q, CONTEXT, QUESTION)


@pytest.fixture(params=[pytest.param(v, marks=pytest.mark.slow) if v[1] in TINY_ARCHITECTURES[v[0]].slow_head_dims
                        else v for v in STUDIED], ids=IDS)
def setup(request, monkeypatch):
    monkeypatch.setattr("kvroute.engine.attention.kept.ENABLED", False)  # PyTorch's kernels: the reference numbers
    return _setup(*request.param)


def test_the_registry_covers_every_architecture_kvpress_supports():
    from kvpress.presses.base_press import SUPPORTED_MODELS

    built = {type(_build_only(a)).__name__.replace("ForCausalLM", "").replace("ForConditionalGeneration", "")
             for a in TINY_ARCHITECTURES}
    for cls in SUPPORTED_MODELS:
        family = cls.__name__.replace("ForCausalLM", "").replace("ForConditionalGeneration", "")
        assert family in built, f"kvpress supports {cls.__name__}; the tiny registry has no {family}"
    assert {d for _, d in tiny_variants(studied=None)} >= {64, 128, 256}


def _build_only(arch):
    from kvroute.models.tiny import _build

    return _build(arch, 0, torch.float32, "sdpa", layers=1)


def test_the_tiny_models_have_their_architectures_traits():
    from kvroute.models.tiny import _build

    def build(arch):
        return _build(arch, 0, torch.float32, "sdpa")

    llama3 = build("llama3")
    assert llama3.config.rope_parameters["rope_type"] == "llama3"
    assert llama3.config.head_dim == 128 and llama3.config.num_attention_heads // llama3.config.num_key_value_heads == 4
    assert build("qwen2").model.layers[0].self_attn.q_proj.bias is not None
    assert hasattr(build("qwen3").model.layers[0].self_attn, "q_norm")
    phi = build("phi3").model.layers[0].self_attn
    assert hasattr(phi, "qkv_proj") and not hasattr(phi, "q_proj")
    gemma = build("gemma3")
    assert type(gemma).__name__ == "Gemma3ForConditionalGeneration"  # the class whose sliding layers kvpress skips
    text = gemma.config.text_config
    assert text.head_dim == 256 and text.query_pre_attn_scalar == 64  # queries scaled by 1/8, not 256**-0.5
    assert gemma.model.language_model.layers[0].self_attn.scaling == 64**-0.5
    assert {"sliding_attention", "full_attention"} == set(text.layer_types)
    assert type(build("gemma3_text")).__name__ == "Gemma3ForCausalLM"


def test_ratio_zero_and_restoring_everything_equal_the_uncompressed_answer(setup):
    lm, prompt = setup
    T = len(prompt.context_ids)
    eng = Engine(lm, DecodeSettings(max_new_tokens=6))
    res = eng.run(prompt, [Cell("knorm", 0.0), Cell("snapkv[window_size=8]", 0.0), Cell("knorm", 0.9, "answer"),
                           Cell("expected_attention", 0.75, "answer")], answer=list(range(T)))
    ref = greedy_generate(lm, prompt.context_ids + prompt.question_ids, max_new_tokens=6)
    assert res.full.tokens == ref
    for out, m in zip(res.outputs, res.masks, strict=True):
        assert bool(m.mask.all()) and out.tokens == ref


def test_masked_decoding_equals_the_pruned_cache_and_the_4d_mask_reference(setup):
    """The press's cells equal kvpress pruning the cache (its hooks, then a plain forward); random per-layer, per-KV
    head masks equal one eager forward with 4D masks."""
    lm, prompt = setup
    c, q = prompt.context_ids, prompt.question_ids
    eng = Engine(lm, DecodeSettings(max_new_tokens=1, keep_logits=True))
    cells = [Cell("knorm", 0.5), Cell("snapkv[window_size=8]", 0.75)]
    res = eng.run(prompt, cells)
    for cell, out in zip(cells, res.outputs, strict=True):
        ref = kvpress_logits(lm, c, q, cell.press, cell.ratio)
        torch.testing.assert_close(out.logits[0], ref[-1], atol=1e-4, rtol=0, msg=lambda m, cell=cell: f"{cell}: {m}")
    L, Hkv, T = lm.info.num_layers, lm.info.num_kv_heads, len(c)
    keep = torch.rand(L, Hkv, T, generator=torch.Generator().manual_seed(0)) < 0.5
    keep[0, 0, : T // 2] = False
    ours = decode_cells(lm.model, lm.tokenizer, prefill(lm.model, c), q[:-1], [KeepMask(keep, "hand", 0.5)],
                        gold_ids=q[-1:], settings=DecodeSettings(max_new_tokens=1, keep_logits=True))[0]
    ref = masked_reference_logits(lm, c, q, keep)
    torch.testing.assert_close(ours.logits[0], ref[-2], atol=1e-4, rtol=0)
    torch.testing.assert_close(ours.logits[1], ref[-1], atol=1e-4, rtol=0)


def test_batched_equals_one_by_one(setup):
    lm, prompt = setup
    cells = [Cell(p, r) for p in ("knorm", "snapkv[window_size=8]+adakv") for r in (0.5, 0.9)]
    batched = Engine(lm, DecodeSettings(max_new_tokens=4, keep_logits=True)).run(prompt, cells)
    single = Engine(lm, DecodeSettings(max_new_tokens=4, keep_logits=True, batch_size=1)).run(prompt, cells)
    for a, b in zip(batched.outputs, single.outputs, strict=True):
        assert a.tokens == b.tokens
        torch.testing.assert_close(a.logits, b.logits, atol=1e-5, rtol=0)


def _assert_equals_kvpress(lm, prompt, press):
    cells = [Cell(press, r) for r in (0.25, 0.75)]
    res = compare_prompt(Engine(lm, DecodeSettings(max_new_tokens=6, keep_logits=True, draft=True)), prompt, cells)
    for cmp in res.cells:
        assert cmp.comparable, cmp.describe()
        with seeded_kvpress_layers(lm.model, 0):
            ref = kvpress_logits(lm, prompt.context_ids, prompt.question_ids, cmp.cell.press, cmp.cell.ratio)
        torch.testing.assert_close(cmp.ours.logits[0], ref[-1], atol=1e-4, rtol=0)
        assert cmp.agrees, cmp.describe()


@pytest.mark.reference
@pytest.mark.parametrize("press", ["snapkv[window_size=8]", pytest.param("expected_attention", marks=pytest.mark.slow)])
def test_presses_equal_kvpress_token_for_token(setup, press):
    """kvpress's pipeline and kvroute's masked cells give the same tokens (``kvroute presses check``'s comparison)
    and first-token logits."""
    _assert_equals_kvpress(*setup, press)


@pytest.mark.reference
@pytest.mark.parametrize("arch", ["phi3", "qwen3"])
def test_scorers_read_the_queries_as_kvpress_does(arch, monkeypatch):
    """ExpectedAttention reads each layer's queries (kvpress's get_prerope_query_states): from Phi-3's fused
    qkv_proj and after Qwen3's q norm, as kvpress does; observed_attention builds the attention map from them."""
    monkeypatch.setattr("kvroute.engine.attention.kept.ENABLED", False)
    lm, prompt = _setup(arch, 64)
    _assert_equals_kvpress(lm, prompt, "expected_attention")
    eng = Engine(lm, DecodeSettings(max_new_tokens=1, keep_logits=True))
    out = eng.run(prompt, [Cell("observed_attention", 0.5)]).outputs[0]
    ref = kvpress_logits(lm, prompt.context_ids, prompt.question_ids, "observed_attention", 0.5)
    torch.testing.assert_close(out.logits[0], ref[-1], atol=1e-4, rtol=0)


@pytest.mark.parametrize("arch,head_dim,compressed", [("gemma3", 128, (1, 3)), ("gemma3_text", 256, None)])
def test_gemma3_compresses_the_layers_kvpress_compresses(arch, head_dim, compressed):
    """kvpress hooks only the global layers of a Gemma3ForConditionalGeneration (Gemma 3 4B-27B) and every layer of
    any other model (the text-only Gemma 3 1B included): the keep masks leave the same layers whole (all True), each
    compressed layer keeps what kvpress's pruned cache keeps, and the kept fraction counts the compressed layers."""
    from transformers import DynamicCache

    from kvroute.engine.reference import kvpress_press

    lm, prompt = _setup(arch, head_dim)
    assert lm.info.compressed_layers == compressed
    res = Engine(lm, DecodeSettings(max_new_tokens=1)).run(prompt, [Cell("knorm", 0.5)])
    mask = res.masks[0]
    assert mask.layers == compressed
    cache = DynamicCache(config=lm.model.config)
    with torch.inference_mode(), kvpress_press("knorm", 0.5, 0)(lm.model):
        lm.model.model(input_ids=torch.tensor([prompt.context_ids]), past_key_values=cache)
    T = len(prompt.context_ids)
    for layer in range(lm.info.num_layers):
        kept = int(cache.layers[layer].keys.shape[2])
        assert mask.kept_per_head[layer].tolist() == [kept] * lm.info.num_kv_heads, layer
        assert (kept == T) == (compressed is not None and layer not in compressed), layer
    assert mask.kept_fraction == pytest.approx(int(T * 0.5) / T)


@pytest.mark.reference
def test_gemma3_text_scores_sliding_layers_with_kvpress_rotary_whatever_ran_before():
    """kvpress's hook gives every layer it compresses the model's ``rotary_emb``: Gemma 3's global layers' (base 1M),
    also on the sliding layers (base 10k) that Gemma3ForCausalLM compresses, and leaves it on the attention modules.
    Expected Attention averages its query statistics over that RoPE, so kvroute's keep masks (AdaKV: kvpress's own
    masks to compare) equal kvpress's on a fresh model and after kvpress ran on it, and kvpress's leftover is put
    back."""
    from kvroute.engine.check import kvpress_keep_masks
    from kvroute.models.layers import decoder_layers

    lm = tiny_model("gemma3_text", seed=0, **TINY_ARCHITECTURES["gemma3_text"].sizes(256))  # fresh: kvpress never ran
    c, q = kvpress_prompt_ids(lm.tokenizer, CONTEXT, QUESTION)
    prompt = Prompt(c, q, CONTEXT, QUESTION)
    engine, cell = Engine(lm, DecodeSettings(max_new_tokens=1)), Cell("expected_attention+adakv", 0.5)
    attns = [layer.self_attn for layer in decoder_layers(lm.model)]
    assert not any(hasattr(a, "rotary_emb") for a in attns)
    before = engine.run(prompt, [cell]).masks[0].mask.cpu()  # [L, Hkv, T]
    theirs = kvpress_keep_masks(lm, prompt, cell.press, cell.ratio)
    assert theirs is not None and not theirs[0].all()  # a sliding layer compressed
    left = [a.rotary_emb for a in attns]  # kvpress's, left behind
    after = engine.run(prompt, [cell]).masks[0].mask.cpu()
    for layer in range(lm.info.num_layers):
        assert torch.equal(before[layer], theirs[layer]), layer
        assert torch.equal(after[layer], theirs[layer]), layer
    assert all(a.rotary_emb is r for a, r in zip(attns, left, strict=True))


def test_gemma3_past_its_sliding_window_is_refused_in_one_line(tmp_path):
    """Inside its sliding window a Gemma 3 sliding layer is full attention; a prompt and answer past it are refused
    before any cell, in one line naming the window (the context window is the sliding window)."""
    import json

    from kvroute.errors import PromptTooLongError

    folder = save_tiny_model(tmp_path / "gemma3", "gemma3", **TINY_ARCHITECTURES["gemma3"].sizes(128))
    config = json.loads((folder / "config.json").read_text())
    config["text_config"]["sliding_window"] = 48
    (folder / "config.json").write_text(json.dumps(config))
    lm = load_model(str(folder))
    assert lm.info.context_window == 48
    c, q = kvpress_prompt_ids(lm.tokenizer, CONTEXT, QUESTION)
    with pytest.raises(PromptTooLongError) as e:
        Engine(lm, DecodeSettings(max_new_tokens=4)).run(Prompt(c, q, CONTEXT, QUESTION), [Cell("knorm", 0.5)])
    assert "context window of 48" in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("arch", [a for a, spec in TINY_ARCHITECTURES.items() if spec.studied])
def test_a_folder_of_each_architecture_loads_as_the_tiny_model(arch, tmp_path):
    spec = TINY_ARCHITECTURES[arch]
    folder = save_tiny_model(tmp_path / arch, arch, **spec.sizes(spec.head_dims[0]))
    lm = load_model(str(folder))
    tiny = tiny_model(arch, **spec.sizes(spec.head_dims[0]))
    assert lm.info == tiny.info
    ids = torch.tensor([[5, 6, 7, 8]])
    torch.testing.assert_close(lm.model(ids).logits, tiny.model(ids).logits)


def test_one_sliding_window_over_every_layer_is_the_context_window():
    """Phi-3 mini and Mistral v0.1 slide one window over all layers: inside it that is full attention, and the
    window is the model's context window (prompts past it are refused as too long); so is Qwen2's
    use_sliding_window, windows beside full layers (kvpress compresses every layer of it)."""
    from kvroute.models.loading import architecture_problem, model_info
    from kvroute.models.tiny import _build

    model = _build("mistral", 0, torch.float32, "sdpa", layers=2)
    model.config.sliding_window = 64
    assert model_info(model).context_window == 64 and architecture_problem(model) is None
    qwen = _build("qwen2", 0, torch.float32, "sdpa", layers=3)
    qwen.config.layer_types = ["full_attention", "sliding_attention", "sliding_attention"]
    qwen.config.sliding_window = 32
    assert architecture_problem(qwen) is None
    assert model_info(qwen).context_window == 32 and model_info(qwen).compressed_layers is None


@pytest.mark.slow
@pytest.mark.parametrize("arch,head_dim", [("llama3", 128), ("llama", 256), ("phi3", 128)],
                         ids=["llama3-128", "llama-256", "phi3-128"])
def test_the_kept_entries_kernel_equals_the_reference_at_the_registry_head_sizes(arch, head_dim, monkeypatch):
    from kvroute.engine.attention import kept

    if not kept.kept_applies(torch.device("cpu"), torch.float32, head_dim) or kept.kernel() is None:
        pytest.skip("the kept-entries kernel does not run here (no AVX-512, no compiler or not built)")
    lm, prompt = _setup(arch, head_dim)
    calls = []
    real = kept.kept_context
    monkeypatch.setattr("kvroute.engine.attention.kept.kept_context",
                        lambda *a, **kw: calls.append(1) or real(*a, **kw))
    c, q = prompt.context_ids, prompt.question_ids
    L, Hkv, T = lm.info.num_layers, lm.info.num_kv_heads, len(c)
    keep = torch.rand(L, Hkv, T, generator=torch.Generator().manual_seed(1)) < 0.3
    ours = decode_cells(lm.model, lm.tokenizer, prefill(lm.model, c), q[:-1], [KeepMask(keep, "hand", 0.7)],
                        gold_ids=q[-1:], settings=DecodeSettings(max_new_tokens=1, keep_logits=True))[0]
    ref = masked_reference_logits(lm, c, q, keep)
    assert calls, "the kept-entries kernel did not run"
    torch.testing.assert_close(ours.logits[1], ref[-1], atol=1e-4, rtol=0)


def test_soft_capped_logits_and_a_missing_query_projection_are_named_at_load():
    from kvroute.models.loading import architecture_problem, check_architecture
    from kvroute.models.tiny import _build

    capped = _build("llama", 0, torch.float32, "sdpa", layers=1)
    capped.config.attn_logit_softcapping = 50.0
    assert "soft-capped (attn_logit_softcapping=50.0)" in architecture_problem(capped)
    bare = _build("llama", 0, torch.float32, "sdpa", layers=1)
    del bare.model.layers[0].self_attn.q_proj
    with pytest.raises(ModelLoadError, match=r"^kvroute cannot study bare \(llama\) yet: its attention "
                       r"\(LlamaAttention\) has neither a q_proj nor a fused qkv_proj"):
        check_architecture(bare, "bare")


def test_a_kvpress_press_failing_on_a_model_fails_its_cells_not_the_run(tmp_path, monkeypatch, capsys):
    """Phi-3 with a partial rotary (Phi-4-mini style): kvpress's SnapKV and Expected Attention raise a shape error on
    it inside their own score(); that is their cells' error, named, while knorm's cells are computed."""
    import json

    from kvroute.cli import main
    from kvroute.tasks import TaskSpec, generate_tasks, save_tasks

    monkeypatch.setenv("KVROUTE_KEPT_KERNEL", "0")
    folder = save_tiny_model(tmp_path / "phi3-partial", "phi3", seed=0)

    def partial(d):
        for k, v in d.items():
            if k == "partial_rotary_factor":
                d[k] = 0.5
            elif isinstance(v, dict):
                partial(v)

    config = json.loads((folder / "config.json").read_text())
    partial(config)
    (folder / "config.json").write_text(json.dumps(config))
    tasks = tmp_path / "t.jsonl"
    save_tasks(generate_tasks(TaskSpec("base", n=2, seed=0)), tasks)
    out = tmp_path / "o.jsonl"
    try:
        main(["run", "--model", str(folder), "--tasks", str(tasks), "--press", "snapkv", "--press", "knorm",
              "--ratio", "0.5", "--max-new-tokens", "4", "--out", str(out)])
    except SystemExit as e:
        assert not e.code, capsys.readouterr().err
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(records) == 4
    for r in records:
        if r["press"] == "knorm":
            assert r["status"] == "ok"
        else:
            assert r["status"] == "error"
            assert "kvpress's SnapKVPress raised RuntimeError in score()" in r["error"]
