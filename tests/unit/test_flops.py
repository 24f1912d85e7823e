"""benchmarks/flops.py: the FLOP count behind grid_speed's `ratio to ceiling`, on numbers worked by hand."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from flops import CellWork, Shape, ceiling, cell_flops, grid_flops, prefill_flops, replay_flops  # noqa: E402

# 1 layer of 10 parameters, 1 head of dim 2, hidden 3, vocabulary 5: attention costs 4·1·2·1 = 8 per pair
S = Shape(layer_params=10, layers=1, heads=1, head_dim=2, hidden=3, vocab=5)


def test_prefill_and_cell_by_hand():
    assert prefill_flops(S, 4) == 2 * 10 * 4 + 8 * (4 * 5 // 2)  # 80 + 8·10 causal pairs = 160
    # 2 question tokens + 3 generated (2 fed back): q = 4 tokens over 6 kept entries, 10 causal suffix pairs;
    # logits at the last question token and each of the 3 generated: 4 · 2·3·5
    assert cell_flops(S, kept=6, Q=2, answer=3) == 2 * 10 * 4 + 8 * (4 * 6 + 10) + 2 * 3 * 5 * 4


def test_grid_counts_one_prefill_against_one_per_cell():
    cells = [CellWork(0.5, 3), CellWork(0.75, 1)]
    ours, theirs = grid_flops(S, 8, 2, cells)
    per_cell = cell_flops(S, 4, 2, 3) + cell_flops(S, 2, 2, 1)
    assert ours == prefill_flops(S, 8) + per_cell and theirs == 2 * prefill_flops(S, 8) + per_cell
    assert ceiling(S, [(8, 2, cells)]) == pytest.approx(theirs / ours)


def test_the_ceiling_tends_to_the_number_of_cells_for_long_contexts():
    cells = [CellWork(0.5, 4)] * 27
    assert 20 < ceiling(S, [(100_000, 20, cells)]) <= 27  # prefill dominates: one against 27
    assert ceiling(S, [(16, 20, cells)]) < 5  # short contexts: the cells' own tokens dominate


def test_kvzip_replay_by_hand():
    # one pass of 4 replay tokens over 6 context entries (24 pairs) and themselves (10 causal pairs), reconstructing
    # the chunk [1, 5): kvpress projects the 4 queries again (hidden 3 × H·D 2) and scores them against 1 sink (only
    # one entry precedes the chunk), the chunk's 4 entries and the 4 replay tokens: 9 keys at 2·H·D = 4 per pair
    assert replay_flops(S, 6, [(4, 1, 5)], n_sink=4) == 2 * 10 * 4 + 8 * (4 * 6 + 10) + 2 * 4 * 2 * (3 + 9)
    # a second pass counts its own sinks (all 4 now precede its chunk) and its own tokens
    assert replay_flops(S, 6, [(4, 1, 5), (3, 5, 6)], n_sink=4) == (
        replay_flops(S, 6, [(4, 1, 5)], n_sink=4) + 2 * 10 * 3 + 8 * (3 * 6 + 6) + 2 * 3 * 2 * (3 + 4 + 1 + 3))
