"""Plain greedy decoding without compression (the uncompressed reference path)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from kvroute.config import DEFAULT_MAX_NEW_TOKENS, check_max_new_tokens
from kvroute.engine.decode import stop_ids

if TYPE_CHECKING:
    from kvroute.models.loading import LoadedModel


@torch.inference_mode()
def greedy_generate(lm: LoadedModel, input_ids: Sequence[int], *,
                    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS) -> list[int]:
    """Greedy continuation of ``input_ids`` (full cache), stopping after an EOS token (included)."""
    ids = torch.tensor([list(input_ids)], device=lm.device)
    stop = stop_ids(lm.model, lm.tokenizer)
    out = lm.model(input_ids=ids, use_cache=True)
    cache = out.past_key_values
    generated: list[int] = []
    nxt = int(out.logits[0, -1].argmax())
    pos = ids.shape[1]
    for _ in range(max_new_tokens):
        generated.append(nxt)
        if nxt in stop or len(generated) == max_new_tokens:
            break
        out = lm.model(input_ids=torch.tensor([[nxt]], device=lm.device), past_key_values=cache,
                       position_ids=torch.tensor([[pos]], device=lm.device), use_cache=True)
        pos += 1
        nxt = int(out.logits[0, -1].argmax())
    return generated


def greedy_answer(lm: LoadedModel, context: str, question: str, *, max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
                  system_prompt: str | None = None) -> str:
    """Greedy answer of ``lm`` to ``question`` about ``context`` with the model's chat template.

    The prompt goes through the checks a run makes (:mod:`kvroute.engine.window`): a non-empty context
    and question, ``max_new_tokens >= 1``, the character bound before tokenising and the window after.
    """
    from kvroute.engine.window import check_chars, check_tokens
    from kvroute.errors import ConfigError

    for name, text in (("context", context), ("question", question)):
        if not text.strip():
            raise ConfigError(f"the {name} is empty; give some text (or @FILE)")
    check_max_new_tokens(max_new_tokens)
    check_chars(lm, len(context) + len(question) + len(system_prompt or ""), max_new_tokens)
    messages = []
    if system_prompt:
        messages.append({"role": "system", "content": system_prompt})
    messages.append({"role": "user", "content": f"{context}\n\n{question}"})
    text = lm.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    ids = lm.tokenizer.encode(text, add_special_tokens=False)
    check_tokens(lm, len(ids), max_new_tokens)
    out = greedy_generate(lm, ids, max_new_tokens=max_new_tokens)
    return lm.tokenizer.decode(out, skip_special_tokens=True).strip()
