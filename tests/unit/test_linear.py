"""The decode forwards' linear layers through oneDNN (kvroute.engine.linear): equal to PyTorch's linear to float32
rounding, actually run, restored afterwards, and applied only where it qualifies."""

import pytest
import torch
from torch import nn

from kvroute.engine import linear
from kvroute.engine.linear import onednn_available, onednn_by_default, onednn_linear, switched

pytestmark = pytest.mark.skipif(not onednn_available(), reason="this PyTorch build has no oneDNN linear on the CPU")


class Scaled(nn.Linear):  # a subclass with its own forward: not switched
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return 2 * super().forward(x)


def model() -> nn.Module:
    torch.manual_seed(0)
    hooked = nn.Linear(8, 8)
    hooked.forward = lambda x: x  # a forward set on the instance (as hook libraries do): left alone
    return nn.Sequential(nn.Linear(16, 32), nn.Linear(32, 64, bias=False), Scaled(64, 8), hooked,
                         nn.Linear(8, 8).to(torch.bfloat16))


def ran_onednn(fn) -> bool:
    with torch.profiler.profile() as prof:
        fn()
    return any("_linear_pointwise" in e.name for e in prof.events())


@pytest.mark.parametrize("rows", [1, 3, 27, 200])
def test_onednn_linear_equals_the_default_and_runs(rows):
    m = model()
    x = torch.randn(rows, 1, 16)
    first, second = m[0], m[1]
    with torch.inference_mode():
        ref = second(first(x))
        with onednn_linear(m, enabled=True) as n:
            assert n == 2  # the two plain float32 layers; not the subclass, the hooked one or the bfloat16 one
            assert ran_onednn(lambda: first(x))
            got = second(first(x))
            assert m[2].forward.__func__ is Scaled.forward and m[3].forward(x) is x
            assert not ran_onednn(lambda: m[4](torch.randn(2, 8, dtype=torch.bfloat16)))  # (its own path)
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
        assert "forward" not in vars(first) and "forward" not in vars(second)  # restored
        assert not ran_onednn(lambda: first(x))
        assert torch.equal(second(first(x)), ref)


def test_onednn_linear_restores_on_error_and_can_be_off(monkeypatch):
    m = model()
    with pytest.raises(KeyError), onednn_linear(m):
        raise KeyError
    assert all("forward" not in vars(layer) for layer in (m[0], m[1]))
    with onednn_linear(m, enabled=False) as n:
        assert n == 0
    monkeypatch.setattr(linear, "ONEDNN", False)  # KVROUTE_ONEDNN_LINEAR=0
    with onednn_linear(m) as n:
        assert n == 0
    assert switched(m) == [m[0], m[1]]
    with torch.inference_mode(), onednn_linear(m, enabled=True):  # an empty batch falls back to the default
        assert m[0](torch.randn(0, 16)).shape == (0, 32)


def test_large_forwards_follow_the_cpu_vendor_unless_set(monkeypatch):
    """Forwards of more than LARGE_ROWS rows take oneDNN except on Intel's CPUs (their MKL is the faster there); the
    decode steps' small ones take it everywhere; KVROUTE_ONEDNN_LINEAR sets both, read when a block starts (never at
    import)."""
    assert not onednn_by_default("GenuineIntel")
    assert onednn_by_default("AuthenticAMD") and onednn_by_default("")
    for env, vendor, small, large in [("1", "GenuineIntel", True, True), ("0", "AuthenticAMD", False, False),
                                      (None, "GenuineIntel", True, False), (None, "AuthenticAMD", True, True)]:
        if env is None:
            monkeypatch.delenv("KVROUTE_ONEDNN_LINEAR", raising=False)
        else:
            monkeypatch.setenv("KVROUTE_ONEDNN_LINEAR", env)
        monkeypatch.setattr("kvroute.engine.linear.cpu_field", lambda name, v=vendor: v if name == "vendor_id" else "")
        try:
            assert linear.linear_rule() == (small, large)
        finally:
            monkeypatch.undo()
    m = model()
    monkeypatch.setattr(linear, "ONEDNN_LARGE", False)
    with torch.inference_mode(), onednn_linear(m, enabled=True):
        small_x, large_x = torch.randn(linear.LARGE_ROWS, 16), torch.randn(3, linear.LARGE_ROWS, 16)
        assert ran_onednn(lambda: m[0](small_x)) and not ran_onednn(lambda: m[0](large_x))
        torch.testing.assert_close(m[0](large_x), nn.functional.linear(large_x, m[0].weight, m[0].bias))
