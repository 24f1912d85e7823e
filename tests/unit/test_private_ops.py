"""PyTorch's private operators behind their version check (kvroute.engine.private_ops): equal to the public forms on
a checked PyTorch, and not used at all on a version outside the checked range."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F  # noqa: N812

from kvroute.engine import private_ops


@pytest.fixture
def fresh():
    private_ops.flash_attention_cpu.cache_clear()
    private_ops.onednn_linear.cache_clear()
    yield
    private_ops.flash_attention_cpu.cache_clear()
    private_ops.onednn_linear.cache_clear()


def test_versions_are_read_and_checked():
    assert private_ops.torch_version("2.13.0+cpu") == (2, 13)
    assert private_ops.torch_version("nightly") == (0, 0)
    assert private_ops.version_checked("2.4.1") and private_ops.version_checked("2.13.0")
    assert not private_ops.version_checked("2.3.0") and not private_ops.version_checked("3.0.0")


def test_the_fused_cpu_attention_equals_the_public_one_with_its_log_sum_exp(fresh):
    flash = private_ops.flash_attention_cpu()
    if flash is None:
        pytest.skip(f"PyTorch {torch.__version__} has no checked fused CPU attention operator")
    g = torch.Generator().manual_seed(1)
    q, k, v = torch.randn(2, 3, 7, 64, generator=g), torch.randn(2, 3, 11, 64, generator=g), torch.randn(
        2, 3, 11, 64, generator=g)
    mask = torch.zeros(2, 1, 7, 11).masked_fill_(torch.rand(2, 1, 7, 11, generator=g) < 0.3, float("-inf"))
    mask[..., 0] = 0.0  # every row keeps a key
    out, lse = flash(q, k, v, attn_mask=mask, scale=0.125)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.125),
                               atol=1e-5, rtol=0)
    torch.testing.assert_close(lse.reshape(2, 3, 7), (q @ k.transpose(-1, -2) * 0.125 + mask).logsumexp(-1),
                               atol=1e-5, rtol=0)


def test_the_onednn_linear_equals_the_public_one(fresh):
    op = private_ops.onednn_linear()
    if op is None:
        pytest.skip("this PyTorch build has no checked oneDNN linear")
    g = torch.Generator().manual_seed(2)
    x, w, b = torch.randn(5, 16, generator=g), torch.randn(8, 16, generator=g), torch.randn(8, generator=g)
    torch.testing.assert_close(op(x, w, b), F.linear(x, w, b), atol=1e-5, rtol=0)


def test_an_unchecked_pytorch_version_uses_the_public_forms(fresh, monkeypatch):
    """A PyTorch outside CHECKED gets neither private operator: the fused backend is unavailable (with its reason),
    the kept-entries and public backends are unaffected, and oneDNN's linear is off."""
    monkeypatch.setattr(torch, "__version__", "9.0.0")
    assert private_ops.flash_attention_cpu() is None and private_ops.onednn_linear() is None
    from kvroute.engine.attention import BACKENDS
    from kvroute.engine.linear import onednn_available

    assert not BACKENDS.get("fused").available().ok and "checked" in BACKENDS.get("fused").available().reason
    assert not onednn_available()
    assert BACKENDS.get("sdpa").available().ok
