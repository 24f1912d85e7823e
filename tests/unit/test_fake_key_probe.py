"""kvpress's fake keys on planted logits: where they are exact, where they leak, and the exact-mask rerun.

The reference wrapper (:func:`kvroute.engine.reference._aligned_mask`) is run around kvpress's own
``attention_patch`` and transformers' sdpa attention, as in the equivalence check. Known answers:
with real logits near zero the fake keys take no weight; with every real logit below the fake
keys' (≈ −1e5·scaling) they take all of it; masked exactly, the output is attention over the kept
entries alone.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("kvpress")

from kvpress.attention_patch import attention_patch  # noqa: E402
from transformers.integrations.sdpa_attention import sdpa_attention_forward  # noqa: E402

from kvroute.engine.reference import FakeKeyProbe, _aligned_mask  # noqa: E402

D, T, MASKED = 8, 6, [1, 2]


class Attn(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.scaling = D ** -0.5
        self.is_causal = True
        self.num_key_value_groups = 2
        self.layer_idx = 3
        self.masked_key_indices = (torch.zeros(2, dtype=torch.long), torch.zeros(2, dtype=torch.long),
                                   torch.tensor(MASKED))


def tensors(key_scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    q = torch.zeros(1, 2, 1, D)
    q[..., 0] = 1.0  # both query heads along e0
    k = torch.randn(1, 1, T, D, generator=g)
    k[..., 0] = key_scale  # every real logit = key_scale · scaling
    v = torch.randn(1, 1, T, D, generator=g)
    return q, k, v


def kept_only(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    keep = [t for t in range(T) if t not in MASKED]
    return torch.nn.functional.scaled_dot_product_attention(
        q, k[:, :, keep].expand(1, 2, -1, D), v[:, :, keep].expand(1, 2, -1, D)).transpose(1, 2)


def run(q, k, v, *, exact: bool) -> tuple[torch.Tensor, FakeKeyProbe]:
    forward = _aligned_mask(attention_patch(sdpa_attention_forward))
    with FakeKeyProbe(exact=exact) as probe:
        out, _ = forward(Attn(), q, k.clone(), v, None, 0.0)
    return out, probe


def test_fake_keys_take_no_weight_when_real_logits_are_near_zero():
    q, k, v = tensors(0.5)
    out, probe = run(q, k, v, exact=False)
    assert probe.leak < 1e-6 and probe.forwards == 1 and probe.layer == 3
    torch.testing.assert_close(out, kept_only(q, k, v), rtol=1e-5, atol=1e-6)
    exact, _ = run(q, k, v, exact=True)
    torch.testing.assert_close(exact, out, rtol=1e-5, atol=1e-6)


def test_fake_keys_take_all_the_weight_when_real_logits_are_lower_still_and_exact_masking_restores_pruning():
    q, k, v = tensors(-3e5)  # real logits ≈ −1.06e5, below the fake keys' ≈ −3.5e4
    out, probe = run(q, k, v, exact=False)
    assert probe.leak > 0.999 and probe.layer == 3
    # the output is the masked entries' values (the fake keys keep them), not the kept entries'
    masked_mean = v[:, :, MASKED].mean(2, keepdim=True).expand(1, 2, 1, D).transpose(1, 2)
    torch.testing.assert_close(out, masked_mean, rtol=1e-4, atol=1e-5)
    exact, probe_exact = run(q, k, v, exact=True)
    assert probe_exact.leak > 0.999  # the leak is still measured (with the fake keys) ...
    torch.testing.assert_close(exact, kept_only(q, k, v), rtol=1e-5, atol=1e-6)  # ... but no longer used


def test_without_a_probe_the_wrapper_passes_kvpress_through():
    q, k, v = tensors(-3e5)
    forward = _aligned_mask(attention_patch(sdpa_attention_forward))
    out, _ = forward(Attn(), q, k.clone(), v, None, 0.0)
    plain, _ = attention_patch(sdpa_attention_forward)(Attn(), q, k.clone(), v, None, 0.0)
    assert torch.equal(out, plain)
