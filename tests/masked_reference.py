"""An independent reference for masked decoding: one eager forward with per-layer, per-head 4D masks.

The prompt (context + question) goes through the model in ONE plain forward with eager attention;
a pre-hook on each attention module swaps in that layer's additive mask, in which question rows
see context token t in query head h iff ``keep[layer, h // G, t]`` and context rows are plain
causal (kvpress never compresses the prefill itself). No kvroute engine code is involved.
"""

import torch

from kvroute.engine.hooks import decoder_layers


def masked_reference_logits(lm, context_ids, question_ids, keep: torch.Tensor) -> torch.Tensor:
    """Logits ``[Q, V]`` at the question positions under ``keep`` (bool ``[L, Hkv, T]``)."""
    T, Q = len(context_ids), len(question_ids)
    H, G = lm.info.num_heads, lm.info.group_size
    base = torch.ones(T + Q, T + Q, dtype=torch.bool).tril()
    masks = []
    for layer in range(keep.shape[0]):
        allowed = base.unsqueeze(0).repeat(H, 1, 1)  # [H, T+Q, T+Q]
        allowed[:, T:, :T] &= keep[layer].repeat_interleave(G, dim=0)[:, None, :]  # query head h -> KV head h // G
        masks.append(torch.zeros(1, H, T + Q, T + Q).masked_fill(~allowed.unsqueeze(0), float("-inf")))

    def swap(module, args, kwargs):
        kwargs["attention_mask"] = masks[module.layer_idx]
        return args, kwargs

    cfg = lm.model.config
    prev = cfg._attn_implementation
    cfg._attn_implementation = "eager"
    handles = [layer.self_attn.register_forward_pre_hook(swap, with_kwargs=True) for layer in decoder_layers(lm.model)]
    try:
        with torch.inference_mode():
            out = lm.model(input_ids=torch.tensor([list(context_ids) + list(question_ids)]))
    finally:
        for h in handles:
            h.remove()
        cfg._attn_implementation = prev
    return out.logits[0, T:].float()
