"""Tiny random-initialised models of every architecture kvpress supports, built in-process from seeded configs.

They are the fixtures of kvroute's tests: no download, a few hundred KB to a few MB of weights, GQA,
and a real byte-level BPE tokenizer (trained here on a fixed corpus in milliseconds) with a ChatML
chat template and offset mappings, so prompt building and span alignment run on the same code paths
as with the embedded models.

:data:`TINY_ARCHITECTURES` is the registry: one entry per architecture (Llama, Llama 3, Mistral,
Qwen2, Qwen3, Phi-3, Gemma 3 as kvpress's Gemma3ForConditionalGeneration and as the text-only 1B), each with the
realistic traits of its family (RoPE scaling, biases, q/k norms, a fused qkv projection, sliding-window layers)
and the head sizes it is built at (:func:`tiny_variants`), so tests parametrise over all of them without a hand
list. ``"llama"`` and ``"qwen2"`` keep their original small shape (head size 16) as :func:`tiny_model`'s defaults.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from kvroute.errors import UnknownNameError

_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
_CORPUS = """
Context: the story of a small town by the river. Question: who lives in the old house? Answer briefly.
Alice Morgan was born in Ferravik in 1987 and works as a glassblower for the Northwind Company.
Her brother lives in Quenby; his manager is Tobias Vell, who was born on 12 March 1961.
The dragon named Orrin guards the Silver Bridge. The festival takes place every spring.
I don't know. The answer is not mentioned in the text. How many apples were sold? Seven, 42, 1999.
Who founded the organization? Where was the meeting held? When did the event happen? What is it?
"""


@functools.lru_cache(maxsize=1)
def tiny_tokenizer() -> Any:
    """A byte-level BPE (vocabulary 512) with ChatML specials; deterministic."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=512, special_tokens=_SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator([_CORPUS] * 4, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   bos_token=None, unk_token=None)
    fast.chat_template = _CHAT_TEMPLATE
    fast.model_max_length = 4096
    return fast


@dataclass(frozen=True)
class TinyArchitecture:
    """One architecture of the registry: how to build its config, its default shape, the head sizes it is built at.

    ``config(common, head_dim)`` returns the transformers config from the shape fields every architecture shares
    (``common``: vocabulary, sizes, token ids) and the head size. ``studied``: whether kvroute can study models of
    this architecture (else :func:`kvroute.models.loading.check_architecture` refuses them at load, in one line).
    """

    name: str
    family: str  # the real models it stands for
    config: Callable[[dict[str, Any], int], Any]
    heads: int
    kv_heads: int
    hidden: int
    head_dims: tuple[int, ...]  # the head sizes the registry builds it at (tiny_variants)
    layers: int = 3
    head_dim: int | None = None  # the default head size (None: hidden // heads, the original llama and qwen2's 16)
    studied: bool = True
    traits: tuple[str, ...] = field(default=())  # what of the family it has, in words
    # head sizes whose registry-parametrised tests run in the slow tier (for their seconds: every one is tested there)
    slow_head_dims: tuple[int, ...] = ()

    def sizes(self, head_dim: int) -> dict[str, int]:
        """:func:`tiny_model`'s size arguments for the registry's variant at ``head_dim``."""
        return {"layers": self.layers, "heads": self.heads, "kv_heads": self.kv_heads, "hidden": self.hidden,
                "head_dim": head_dim}


def _llama(common: dict[str, Any], head_dim: int) -> Any:
    from transformers import LlamaConfig

    return LlamaConfig(**common, head_dim=head_dim, rope_theta=10000.0)


def _llama3(common: dict[str, Any], head_dim: int) -> Any:
    from transformers import LlamaConfig

    rope: Any = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                 "high_freq_factor": 4.0, "original_max_position_embeddings": 1024}
    return LlamaConfig(**common, head_dim=head_dim, rope_parameters=rope)


def _mistral(common: dict[str, Any], head_dim: int) -> Any:
    from transformers import MistralConfig

    return MistralConfig(**common, head_dim=head_dim, rope_theta=1000000.0, sliding_window=None)


def _qwen2(common: dict[str, Any], head_dim: int) -> Any:
    from transformers import Qwen2Config

    return Qwen2Config(**common, head_dim=head_dim, rope_theta=10000.0, use_sliding_window=False)


def _qwen3(common: dict[str, Any], head_dim: int) -> Any:
    from transformers import Qwen3Config

    return Qwen3Config(**common, head_dim=head_dim, rope_theta=1000000.0, use_sliding_window=False)


def _phi3(common: dict[str, Any], head_dim: int) -> Any:
    from transformers import Phi3Config

    return Phi3Config(**common, head_dim=head_dim,
                      rope_theta=10000.0, sliding_window=None, original_max_position_embeddings=4096)


def _gemma3_text(common: dict[str, Any], head_dim: int) -> Any:
    from transformers import Gemma3TextConfig

    # Gemma 3's pattern at a tiny scale: sliding-window layers beside global ones (every other layer global, where
    # Gemma 3 has one in six), a window of 512 tokens (Gemma 3 1B's), queries pre-scaled by query_pre_attn_scalar
    # (hidden // heads, as Gemma 3 27B's 168 with head size 128: not the head size, so a scale of D**-0.5 anywhere
    # shows), q/k norms
    layers = common["num_hidden_layers"]
    types = ["full_attention" if i % 2 else "sliding_attention" for i in range(layers)]
    scalar = common["hidden_size"] // common["num_attention_heads"]
    return Gemma3TextConfig(**common, head_dim=head_dim, query_pre_attn_scalar=scalar, sliding_window=512,
                            layer_types=types, attn_logit_softcapping=None, final_logit_softcapping=None)


def _gemma3(common: dict[str, Any], head_dim: int) -> Any:
    from transformers import Gemma3Config, SiglipVisionConfig

    # Gemma 3 4B-27B: the language model inside Gemma3ForConditionalGeneration, the class kvpress supports (and whose
    # sliding-window layers it leaves whole), with the smallest vision tower the config allows (never run here)
    vision = SiglipVisionConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                                image_size=28, patch_size=14)
    text = _gemma3_text(common, head_dim)
    return Gemma3Config(text_config=text.to_dict(), vision_config=vision.to_dict(), mm_tokens_per_image=4,
                        eos_token_id=common["eos_token_id"], pad_token_id=common["pad_token_id"],
                        tie_word_embeddings=False)


#: every architecture of the tiny test models, by name (see the module doc)
TINY_ARCHITECTURES: dict[str, TinyArchitecture] = {a.name: a for a in (
    TinyArchitecture("llama", "SmolLM2, Llama 2", _llama, 4, 2, 64, (64, 256), traits=("GQA 2:1",)),
    TinyArchitecture("llama3", "Llama 3 / 3.1 8B", _llama3, 8, 2, 256, (128, 64), head_dim=128,
                     traits=("llama3 RoPE scaling", "GQA 4:1")),
    TinyArchitecture("mistral", "Mistral 7B v0.3", _mistral, 8, 2, 256, (128, 64, 256), head_dim=128,
                     traits=("GQA 4:1",), slow_head_dims=(256,)),
    TinyArchitecture("qwen2", "Qwen2.5", _qwen2, 4, 2, 64, (64, 128), traits=("q/k/v biases", "GQA 2:1")),
    TinyArchitecture("qwen3", "Qwen3", _qwen3, 8, 2, 256, (128, 64), head_dim=128, traits=("q/k norms", "GQA 4:1")),
    TinyArchitecture("phi3", "Phi-3 mini / medium", _phi3, 4, 2, 256, (64, 128), head_dim=64,
                     traits=("fused qkv_proj", "GQA 2:1")),
    TinyArchitecture("gemma3", "Gemma 3 4B-27B", _gemma3, 4, 1, 256, (256, 128), layers=4, head_dim=256,
                     traits=("Gemma3ForConditionalGeneration", "sliding-window layers left whole",
                             "query_pre_attn_scalar", "q/k norms", "GQA 4:1"), slow_head_dims=(256,)),
    TinyArchitecture("gemma3_text", "Gemma 3 1B", _gemma3_text, 4, 1, 256, (256,), layers=4, head_dim=256,
                     traits=("Gemma3ForCausalLM", "sliding-window layers compressed", "query_pre_attn_scalar",
                             "q/k norms", "GQA 4:1"), slow_head_dims=(256,)),
)}


def tiny_variants(*, studied: bool | None = True) -> list[tuple[str, int]]:
    """Every (architecture, head size) the registry builds; ``studied``: only those kvroute can (True), cannot
    (False) study, or all (None). Test ids read as ``llama3-128``."""
    return [(a.name, d) for a in TINY_ARCHITECTURES.values() for d in a.head_dims
            if studied is None or a.studied == studied]


def _architecture(arch: str) -> TinyArchitecture:
    spec = TINY_ARCHITECTURES.get(arch)
    if spec is None:
        raise UnknownNameError("tiny architecture", arch, list(TINY_ARCHITECTURES))
    return spec


def tiny_config(arch: str = "llama", *, layers: int | None = None, heads: int | None = None,
                kv_heads: int | None = None, hidden: int | None = None, head_dim: int | None = None,
                vocab_size: int | None = None, init_std: float = 0.1, max_positions: int = 4096) -> Any:
    """The transformers config of a tiny ``arch`` (a :data:`TINY_ARCHITECTURES` name); sizes left out take the
    architecture's defaults. ``head_dim`` left out: the architecture's default head size, or ``hidden // heads``
    where the caller gives ``heads`` or ``hidden`` (or the architecture has none: ``"llama"``, ``"qwen2"``)."""
    spec = _architecture(arch)
    tok = tiny_tokenizer()
    sized = heads is not None or hidden is not None  # a shape of the caller's: its head size is hidden // heads
    heads = heads or spec.heads
    hidden = hidden or spec.hidden
    common = dict(
        vocab_size=vocab_size or len(tok), hidden_size=hidden, intermediate_size=2 * hidden,
        num_hidden_layers=layers or spec.layers, num_attention_heads=heads,
        num_key_value_heads=kv_heads or spec.kv_heads, max_position_embeddings=max_positions,
        initializer_range=init_std, tie_word_embeddings=False, eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id, bos_token_id=None,
    )
    return spec.config(common, head_dim or (spec.head_dim if spec.head_dim and not sized else hidden // heads))


def _build(arch: str, seed: int, dtype: torch.dtype, attn_implementation: str, **sizes: Any) -> Any:
    """The random transformers model of ``arch`` (no check that kvroute can study it)."""
    from transformers import AutoModelForCausalLM

    cfg = tiny_config(arch, **sizes)
    cfg._attn_implementation = attn_implementation
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype, attn_implementation=attn_implementation)
    model.eval()
    model.requires_grad_(False)
    model.generation_config.eos_token_id = cfg.eos_token_id
    model.generation_config.pad_token_id = cfg.pad_token_id
    return model


def tiny_model(arch: str = "llama", *, seed: int = 0, layers: int | None = None, heads: int | None = None,
               kv_heads: int | None = None, hidden: int | None = None, head_dim: int | None = None,
               init_std: float = 0.1, dtype: torch.dtype = torch.float32, attn_implementation: str = "sdpa") -> Any:
    """A random ``arch`` model (a :data:`TINY_ARCHITECTURES` name) as a :class:`~kvroute.models.loading.LoadedModel`.

    An architecture kvroute cannot study is refused as :func:`~kvroute.models.loading.load_model` refuses it
    (:class:`~kvroute.errors.ModelLoadError`, one line); :func:`save_tiny_model` still writes it."""
    from kvroute.models.loading import LoadedModel, check_architecture, model_info

    model = _build(arch, seed, dtype, attn_implementation, layers=layers, heads=heads, kv_heads=kv_heads,
                   hidden=hidden, head_dim=head_dim, init_std=init_std)
    name = f"tiny-{arch}-s{seed}"
    check_architecture(model, name)
    return LoadedModel(model=model, tokenizer=tiny_tokenizer(), name=name, kind="tiny", path=name,
                       info=model_info(model), meta={"seed": seed})


def save_tiny_model(folder: str | Path, arch: str = "llama", *, seed: int = 0, **sizes: Any) -> Path:
    """Write :func:`tiny_model` as a local Hugging Face folder (safetensors + tokenizer) that ``load_model`` reads.

    ``sizes``: :func:`tiny_model`'s ``layers``, ``heads``, ``kv_heads``, ``hidden``, ``head_dim``. Written for
    every architecture of the registry, those kvroute cannot study included (their loading is what refuses them).
    """
    folder = Path(folder)
    model = _build(arch, seed, torch.float32, "sdpa", **sizes)
    model.save_pretrained(folder, safe_serialization=True)
    tiny_tokenizer().save_pretrained(folder)
    return folder
