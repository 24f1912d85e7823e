"""Plain greedy answering without compression (the uncompressed reference path)."""

from __future__ import annotations

from typing import Any

import torch


@torch.inference_mode()
def greedy_answer(lm: Any, context: str, question: str, *, max_new_tokens: int = 32,
                  system_prompt: str | None = None) -> str:
    """Greedy answer of ``lm`` to ``question`` about ``context`` with the model's chat template."""
    tok = lm.tokenizer
    messages = []
    if system_prompt:
        messages.append({"role": "system", "content": system_prompt})
    messages.append({"role": "user", "content": f"{context}\n\n{question}"})
    enc = tok.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    ids = enc["input_ids"].to(lm.device)
    eos = lm.model.generation_config.eos_token_id
    eos_ids = set(eos if isinstance(eos, list) else [eos]) if eos is not None else set()
    out = lm.model(input_ids=ids, use_cache=True)
    cache = out.past_key_values
    generated: list[int] = []
    nxt = int(out.logits[0, -1].argmax())
    pos = ids.shape[1]
    for _ in range(max_new_tokens):
        generated.append(nxt)
        if nxt in eos_ids:
            break
        out = lm.model(input_ids=torch.tensor([[nxt]], device=lm.device), past_key_values=cache,
                       position_ids=torch.tensor([[pos]], device=lm.device), use_cache=True)
        pos += 1
        nxt = int(out.logits[0, -1].argmax())
    return tok.decode(generated, skip_special_tokens=True).strip()
