"""Which RoPE base kvpress's scorers rotate a Gemma 3 sliding layer's query statistics with, and what it changes.

kvpress's hook hands every layer it compresses ``language_model.rotary_emb``: on the transformers kvpress 0.5.5 runs
Gemma 3 with (4.56-4.57) the global layers' RoPE (base ``rope_theta``, 1M); the sliding layers' (10k) is a separate
``rotary_emb_local`` it never reads. A ``Gemma3ForCausalLM`` (Gemma 3 1B) has its sliding layers compressed too, so
Expected Attention's averaged RoPE and CAP's anchor rotate a sliding layer's queries with the global base. This
scores the equivalence benchmark's instances on the tiny ``gemma3_text`` with kvpress's own ``score()`` twice per
layer, once with the global layers' rotary (kvpress's, and kvroute's: ``kvroute.models.layers.scorer_rotary``) and
once with the layer's own, and counts the positions whose keep decision differs (kept under one, evicted under the
other; one KV head) at each ratio. The global layers must show 0: there the two rotaries are one.

    python benchmarks/gemma3_rope_base.py [--n 4] [--tokens 120]
"""

from __future__ import annotations

import argparse
import functools
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from common import cpu_name
from equivalence import RATIOS, instances, tiny_folder

from kvroute.models import load_model
from kvroute.models.layers import base_model, decoder_layers
from kvroute.tasks import build_prompt

PRESSES = {"expected_attention": "ExpectedAttentionPress", "cap": "CapPress"}


@torch.inference_mode()
def layer_inputs(lm, ids: list[int]) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Per layer, what kvpress's hook gives ``score()``: the layer's hidden states ``[1, T, hidden]`` and its cached
    keys and values ``[1, Hkv, T, D]`` after a prefill of ``ids``."""
    from transformers import DynamicCache

    hidden: dict[int, torch.Tensor] = {}
    attns = [layer.self_attn for layer in decoder_layers(lm.model)]
    handles = [a.register_forward_hook(lambda m, a, kw, out: hidden.__setitem__(m.layer_idx, kw["hidden_states"]),
                                       with_kwargs=True) for a in attns]
    cache = DynamicCache(config=lm.model.config)
    try:
        base_model(lm.model)(input_ids=torch.tensor([ids]), past_key_values=cache)
    finally:
        for h in handles:
            h.remove()
    return [(hidden[i], cache.layers[i].keys, cache.layers[i].values) for i in range(len(attns))]


@torch.inference_mode()
def differing(lm, press, ids: list[int]) -> list[tuple[str, list[int]]]:
    """Per layer: its type and, per ratio, the positions kept under one rotary and evicted under the other."""
    from kvpress.utils import compute_n_kept

    rotary = base_model(lm.model).rotary_emb
    out = []
    for layer, (h, k, v) in zip(decoder_layers(lm.model), layer_inputs(lm, ids), strict=True):
        attn: Any = layer.self_attn
        scores = []  # [1, Hkv, T] under the global layers' rotary, then under the layer's own
        for layer_type in ("full_attention", attn.layer_type):
            attn.rotary_emb = functools.partial(rotary, layer_type=layer_type)
            try:
                scores.append(press.score(attn, h, k, v, None, {}))
            finally:
                del attn.rotary_emb
        counts = []
        for ratio in RATIOS:
            n = compute_n_kept(len(ids), ratio)
            kept = [torch.zeros_like(s, dtype=torch.bool).scatter_(-1, s.topk(n, -1).indices, True) for s in scores]
            counts.append(int((kept[0] & ~kept[1]).sum()))
        out.append((attn.layer_type, counts))
    return out


def main() -> int:
    import kvpress

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=120)
    args = ap.parse_args()
    torch.manual_seed(0)
    lm = load_model(tiny_folder("tiny-gemma3_text", Path(tempfile.mkdtemp(prefix="kvroute-rope-"))),
                    dtype="float32", device="cpu")
    tasks = instances(lm.tokenizer, args.n, args.tokens)
    lines = ["# The RoPE base of a Gemma 3 sliding layer's query statistics", "",
             f"Command: `python benchmarks/gemma3_rope_base.py --n {args.n} --tokens {args.tokens}`",
             f"Machine: {cpu_name()}, torch {torch.__version__}; date {time.strftime('%Y-%m-%d')}.",
             f"Model: tiny-gemma3_text (float32, layer types {', '.join(lm.model.config.layer_types)}); the "
             f"equivalence benchmark's instances, question-agnostic prompts; kvpress defaults.", "",
             "Positions kept with the global layers' rotary (kvpress's and kvroute's) and evicted with the layer's "
             f"own, per layer, at ratios {', '.join(map(str, RATIOS))}:", "",
             "| press | instance | tokens | " + " | ".join(f"layer {i} ({t})" for i, t in
                                                         enumerate(lm.model.config.layer_types)) + " |",
             "|---|---|---|" + "---|" * lm.info.num_layers]
    for name, cls in PRESSES.items():
        press = getattr(kvpress, cls)()
        for inst in tasks:
            ids = list(build_prompt(lm.tokenizer, inst, regime="agnostic").context_ids)
            row = differing(lm, press, ids)
            lines.append(f"| `{name}` | {inst.id} | {len(ids)} | " + " | ".join(
                ", ".join(map(str, counts)) for _, counts in row) + " |")
    out = Path(__file__).parent / "results" / "gemma3_rope_base.md"
    out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
