"""Tiny random-initialised Llama and Qwen2 models, built in-process from seeded configs.

They are the fixtures of kvroute's tests: no download, a few hundred KB of weights, GQA with two
KV heads, and a real byte-level BPE tokenizer (trained here on a fixed corpus in milliseconds)
with a ChatML chat template and offset mappings, so prompt building and span alignment run on the
same code paths as with the embedded models.
"""

from __future__ import annotations

import functools
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


def tiny_config(arch: str = "llama", *, layers: int = 3, heads: int = 4, kv_heads: int = 2, hidden: int = 64,
                vocab_size: int | None = None, init_std: float = 0.1, max_positions: int = 4096) -> Any:
    from transformers import LlamaConfig, Qwen2Config

    tok = tiny_tokenizer()
    common = dict(
        vocab_size=vocab_size or len(tok), hidden_size=hidden, intermediate_size=2 * hidden,
        num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
        head_dim=hidden // heads, max_position_embeddings=max_positions, initializer_range=init_std,
        tie_word_embeddings=False, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
        bos_token_id=None,
    )
    if arch == "llama":
        return LlamaConfig(**common, rope_theta=10000.0)
    if arch == "qwen2":
        return Qwen2Config(**common, rope_theta=10000.0, use_sliding_window=False)
    raise UnknownNameError("tiny architecture", arch, ["llama", "qwen2"])


def tiny_model(arch: str = "llama", *, seed: int = 0, layers: int = 3, heads: int = 4, kv_heads: int = 2,
               hidden: int = 64, init_std: float = 0.1, dtype: torch.dtype = torch.float32,
               attn_implementation: str = "sdpa") -> Any:
    """A random ``arch`` model ("llama" or "qwen2") as a :class:`~kvroute.models.loading.LoadedModel`."""
    from transformers import AutoModelForCausalLM

    from kvroute.models.loading import LoadedModel, model_info

    cfg = tiny_config(arch, layers=layers, heads=heads, kv_heads=kv_heads, hidden=hidden, init_std=init_std)
    cfg._attn_implementation = attn_implementation
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype, attn_implementation=attn_implementation)
    model.eval()
    model.requires_grad_(False)
    model.generation_config.eos_token_id = cfg.eos_token_id
    model.generation_config.pad_token_id = cfg.pad_token_id
    name = f"tiny-{arch}-s{seed}"
    return LoadedModel(model=model, tokenizer=tiny_tokenizer(), name=name, kind="tiny", path=name,
                       info=model_info(model), meta={"seed": seed})


def save_tiny_model(folder: str | Path, arch: str = "llama", *, seed: int = 0, **sizes: Any) -> Path:
    """Write :func:`tiny_model` as a local Hugging Face folder (safetensors + tokenizer) that ``load_model`` reads.

    ``sizes``: :func:`tiny_model`'s ``layers``, ``heads``, ``kv_heads``, ``hidden``.
    """
    folder = Path(folder)
    lm = tiny_model(arch, seed=seed, **sizes)
    lm.model.save_pretrained(folder, safe_serialization=True)
    lm.tokenizer.save_pretrained(folder)
    return folder
