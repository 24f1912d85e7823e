"""kvpress's press parameters, for the pinned kvpress version, without importing kvpress.

The init fields (less ``compression_ratio`` and private ones) of every kvpress press a built-in scorer
wraps, with their defaults: what :meth:`KvpressScorer.press_fields` reads, so that ``kvroute presses
list`` and ``kvroute sweep --dry-run`` can show and check a press's parameters without importing
kvpress (which imports transformers' model code and patches its attention functions: seconds).
tests/unit/test_kvpress_fields.py holds this table equal to kvpress's own dataclass fields; after a
kvpress upgrade, ``python -m kvroute.presses.scorers.kvpress_fields`` prints the table to paste here (name a
new press's class after it to add its row).
"""

from __future__ import annotations

import dataclasses
from typing import Any

KVPRESS_VERSION = "0.5.5"

KVPRESS_FIELDS: dict[str, dict[str, Any]] = {
    'CURPress': {
        'num_sinks': 4,
        'leverage_type': 'kv_product',
        'use_random_leverage': False,
        'use_local_approximation': True,
        'local_window_size': 16,
    },
    'CapPress': {'tau': 5.0, 'n_future_positions': 512, 'n_sink': 4, 'epsilon': 1e-06},
    'CompactorPress': {
        'sink_size_start': 8,
        'sink_size_end': 4,
        'chunk_size': 256,
        'sketch_dimension': 48,
        'blending': None,
    },
    'ExpectedAttentionPress': {
        'n_future_positions': 512,
        'n_sink': 4,
        'use_covariance': True,
        'use_vnorm': True,
        'epsilon': 0.0,
    },
    'ExpectedAttentionStatsPress': {
        'n_future_positions': 512,
        'n_sink': 4,
        'use_covariance': True,
        'use_vnorm': True,
        'epsilon': 0.0,
        'sample_seq_len': 1000,
        'num_samples': 100,
        'dataset_name': 'kmfoda/booksum',
        'stats_folder': None,
    },
    'FinchPress': {'chunk_length': None, 'normalize_scores': True, 'rerotate_keys': True},
    'KVzapPress': {'model_type': 'mlp'},
    'KVzipPress': {'layerwise': False, 'n_sink': 4, 'kvzip_plus_normalization': False, 'chunk_size': 2048},
    'KeyDiffPress': {},
    'KnormPress': {},
    'LagKVPress': {'n_sink': 4, 'lag_size': 128, 'cross_scoring': False},
    'LeverageScorePress': {'sketch_dimension': 48},
    'NonCausalAttnPress': {'chunk_size': 256},
    'ObservedAttentionPress': {},
    'QFilterPress': {},
    'RandomPress': {'seed': None},
    'SnapKVPress': {'window_size': 64, 'kernel_size': 5},
    'StreamingLLMPress': {'n_sink': 4},
    'TOVAPress': {},
}


def live_fields(press_cls: type) -> dict[str, Any]:
    """A kvpress press class's parameters and defaults, read from its dataclass fields."""
    out = {}
    for f in dataclasses.fields(press_cls):
        if f.name == "compression_ratio" or f.name.startswith("_") or not f.init:
            continue
        out[f.name] = f.default if f.default is not dataclasses.MISSING else None
    return out


def format_table(table: dict[str, dict[str, Any]]) -> str:
    """``table`` as the Python source of :data:`KVPRESS_FIELDS` (lines within 120 characters)."""
    out = ["KVPRESS_FIELDS: dict[str, dict[str, Any]] = {"]
    for name in sorted(table):
        line = f"    {name!r}: {table[name]!r},"
        if len(line) <= 116:
            out.append(line)
            continue
        out.append(f"    {name!r}: {{")
        out.extend(f"        {k!r}: {v!r}," for k, v in table[name].items())
        out.append("    },")
    return "\n".join([*out, "}"])


def main(argv: list[str] | None = None) -> None:
    """Print the table for the installed kvpress: the presses listed now, plus any kvpress class names given
    (``python -m kvroute.presses.scorers.kvpress_fields [NewPress ...]``), to paste above."""
    import sys
    from importlib.metadata import version

    import kvpress

    names = sorted({*KVPRESS_FIELDS, *(sys.argv[1:] if argv is None else argv)})
    print(f'KVPRESS_VERSION = "{version("kvpress")}"\n')
    print(format_table({name: live_fields(getattr(kvpress, name)) for name in names}))


if __name__ == "__main__":
    main()
