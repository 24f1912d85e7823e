"""The keep-mask survival heatmap: validated input, and what it shows."""

import numpy as np
import pytest

from kvroute.analysis.common import AnalysisError
from kvroute.report.heatmap import SurvivalExample, survival_heatmap
from kvroute.report.render import png_bytes


def test_heatmap_from_arrays_counts_heads_per_layer_and_token():
    keep = np.zeros((3, 2, 10), bool)  # [L, Hkv, T]
    keep[0, :, 4] = True  # token 4 kept by both heads of layer 0
    keep[1, 0, 4] = True  # by one head of layer 1; evicted everywhere in layer 2
    keep[:, 1, 5] = True  # token 5 kept by head 1 of every layer
    fig = survival_heatmap(keep, [4, 5], tokens=[f"w{i}" for i in range(10)], answer=[4], title="$x <i>")
    ax_a, ax_b = [ax for ax in fig.axes if ax.images]  # the two heatmaps (not their colour bars)
    np.testing.assert_array_equal(ax_b.images[0].get_array(), [[2, 1], [1, 1], [0, 1]])  # heads per (layer, token)
    # share per (layer, head)
    np.testing.assert_allclose(ax_a.images[0].get_array(), [[0.5, 1.0], [0.5, 0.5], [0.0, 0.5]])
    assert [t.get_text() for t in ax_b.get_xticklabels()] == ["★w4", "w5"]
    assert "GER on the answer tokens = 0.33" in fig.get_suptitle()  # token 4 gone from every head of 1 of 3 layers
    assert png_bytes(fig)[:4] == b"\x89PNG"


def test_bad_keep_masks_are_refused_with_a_clear_error():
    with pytest.raises(AnalysisError, match="layers, kv_heads, context_tokens"):
        SurvivalExample(np.zeros((3, 10), bool), [1])
    with pytest.raises(AnalysisError, match="outside the context"):
        SurvivalExample(np.zeros((3, 2, 10), bool), [1, 12])
    with pytest.raises(AnalysisError, match="at least one evidence position"):
        SurvivalExample(np.zeros((3, 2, 10), bool), [])
    with pytest.raises(AnalysisError, match="booleans"):
        SurvivalExample(np.full((3, 2, 10), 0.5), [1])
    with pytest.raises(AnalysisError, match="tokens must have"):
        SurvivalExample(np.zeros((3, 2, 10), bool), [1], tokens=["a", "b", "c"])
