"""Keep masks that compress only some layers (Gemma 3's global layers, as kvpress does) and the metrics over them.

kvpress leaves a Gemma3ForConditionalGeneration's sliding-window layers whole and compresses each global layer by
the press's ratio. A KeepMask carries that subset (``layers``): the other rows are all True, and the keep-mask
metrics (kept fraction, GER, reachability) read the compressed layers only, so a ratio means what it means on the
layers it applies to. Hand-built masks with known values; each check fails if the metric reads every layer.
"""

from types import SimpleNamespace

import pytest
import torch

from kvroute.metrics.accessibility import Accessibility
from kvroute.metrics.base import CellContext, MetricSettings
from kvroute.metrics.retention import Retention
from kvroute.presses import KeepMask, build_press

L, HKV, T = 4, 2, 10
GLOBAL = (1, 3)  # the compressed layers; 0 and 2 slide (left whole)


def _ctx(mask, *, answer=(), evidence=(), attention=None):
    prompt = SimpleNamespace(n_context=T, answer_positions=list(answer), evidence_positions=list(evidence))
    out = SimpleNamespace(last_attention=attention, generated_mass={})
    return CellContext(SimpleNamespace(), prompt, mask, out, out, group_size=2, settings=MetricSettings())


def test_with_layers_leaves_the_other_layers_whole_and_counts_only_the_compressed():
    keep = torch.zeros(L, HKV, T, dtype=torch.bool)
    keep[..., :4] = True  # 4 of 10 kept in every layer
    mask = KeepMask(keep, "p", 0.6).with_layers(GLOBAL)
    assert mask.layers == GLOBAL and mask.left_whole == [0, 2]
    assert bool(mask.mask[[0, 2]].all()) and torch.equal(mask.mask[[1, 3]], keep[[1, 3]])
    assert torch.equal(mask.compressed, keep[[1, 3]])
    assert mask.kept_fraction == pytest.approx(0.4)  # over all four layers it would be 0.7
    assert mask.kept_per_head[0].tolist() == [T, T] and mask.kept_per_head[1].tolist() == [4, 4]
    assert KeepMask(keep).with_layers(None) is not None and KeepMask(keep).with_layers(None).layers is None
    assert KeepMask(keep).with_layers(tuple(range(L))).layers is None  # every layer compressed: no subset


def test_a_keep_mask_refuses_bad_layers_and_evictions_in_a_layer_it_leaves_whole():
    keep = torch.ones(L, HKV, T, dtype=torch.bool)
    with pytest.raises(ValueError, match="increasing indices"):
        KeepMask(keep, layers=(3, 1))
    with pytest.raises(ValueError, match="increasing indices"):
        KeepMask(keep, layers=(1, 4))
    keep[0, 0, 0] = False
    with pytest.raises(ValueError, match=r"evicts entries of layers \[0, 2\]"):
        KeepMask(keep, layers=GLOBAL)


@pytest.mark.parametrize("spec", ["knorm", "knorm+pyramid[window_size=2,beta=2]", "knorm+adakv"])
def test_a_press_selects_each_compressed_layer_as_over_every_layer(spec):
    """The selection decides every layer by its own index (a pyramid's budget is its depth's, as kvpress's per-layer
    hooks compute it), then the layers left whole are set to True: the compressed rows equal the all-layer mask's."""
    scores = torch.randn(L, HKV, T, generator=torch.Generator().manual_seed(0))
    press = build_press(spec)
    every = press.keep_mask(scores, 0.5)
    some = press.keep_mask(scores, 0.5, layers=GLOBAL)
    assert every.layers is None and some.layers == GLOBAL
    assert torch.equal(some.mask[[1, 3]], every.mask[[1, 3]]) and bool(some.mask[[0, 2]].all())


def test_retention_reads_the_compressed_layers():
    keep = torch.ones(L, HKV, T, dtype=torch.bool)
    keep[1, :, 5] = False  # answer token 5 evicted from every head of global layer 1, kept in layer 3
    keep[1, 0, 6] = False  # evidence token 6 evicted from one head of layer 1 only
    rec = Retention().compute(_ctx(KeepMask(keep, "p", 0.1, GLOBAL), answer=[5], evidence=[6]))
    assert rec["ger"] == pytest.approx(0.5)  # 1 of 2 compressed layers (over all 4 layers: 0.25)
    assert rec["ger_all_layers"] == 0.0 and rec["ger_evidence"] == 0.0
    assert rec["ger_layer"] == [0.0, 1.0, 0.0, 0.0]  # per layer by its index, a layer left whole at 0
    assert rec["answer_heads"] == 2  # layer 3's two heads (the sliding layers' four are not counted)
    assert rec["evidence_heads"] == 3
    assert rec["eviction_rate"] == pytest.approx(1 / (2 * T))
    assert rec["kept_fraction"] == pytest.approx(1 - 3 / (2 * HKV * T))


def test_evidence_reached_only_through_a_layer_left_whole_is_not_reachable():
    keep = torch.ones(L, HKV, T, dtype=torch.bool)
    keep[[1, 3], :, 2] = False  # the evidence is evicted from both global layers
    attention = torch.zeros(L, 2 * HKV, T + 2)
    attention[..., 0] = 1.0
    attention[0, :, 2] = 1.0  # only sliding layer 0 attends to it
    rec = Accessibility().compute(_ctx(KeepMask(keep, "p", 0.1, GLOBAL), evidence=[2], attention=attention))
    assert rec["reachable"] is False
    rec = Accessibility().compute(_ctx(KeepMask(keep, "p", 0.1), evidence=[2], attention=attention))
    assert rec["reachable"] is True  # read over every layer, the uncompressed layer 0 reaches it


@pytest.mark.parametrize("condition", ["answer", "evidence@layers:1-2", "answer@slots:3.1", "random@heads:0"])
def test_a_restoration_keeps_the_masks_compressed_layers(condition):
    from kvroute.presses.restore import Restore

    keep = torch.zeros(L, HKV, T, dtype=torch.bool)
    keep[..., :4] = True
    mask = KeepMask(keep, "p", 0.6).with_layers(GLOBAL)
    restored = Restore.parse(condition).apply(mask, answer=[6, 7], evidence=[5, 6, 7])
    assert restored.layers == GLOBAL and restored.left_whole == [0, 2]
    assert restored.kept_fraction > mask.kept_fraction  # still counted over the compressed layers only
    assert restored.kept_fraction == pytest.approx(float(restored.mask[list(GLOBAL)].float().mean()))
