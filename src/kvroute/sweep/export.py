"""``kvroute export``: a run store as one Parquet or CSV file.

Parquet keeps vectors as list columns; CSV writes lists as JSON text (which
:func:`kvroute.analysis.load.load_records` reads back). Rows are ordered by (model, regime, seed,
instance, press, ratio), so two runs of the same grid export byte-identical data columns
(timings aside). The default file is ``RUN_DIR/records.<format>``, where the analysis looks too.
"""

from __future__ import annotations

import json
from pathlib import Path

from kvroute.errors import ConfigError, StoreError
from kvroute.sweep.store import read_records

FORMATS = ("parquet", "csv")
ORDER = "model, regime, seed, instance_id, press != 'none', press, ratio"


def export_records(run_dir: str | Path, fmt: str = "parquet", out: str | Path | None = None) -> tuple[Path, int]:
    """Write the store's records to ``out`` (default ``RUN_DIR/records.<fmt>``); returns (path, rows)."""
    import pandas as pd

    if fmt not in FORMATS:
        raise ConfigError(f"unknown export format {fmt!r}; use one of {', '.join(FORMATS)}")
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise StoreError(f"no such run directory: {run_dir}")
    try:
        records = read_records(run_dir, order=ORDER)
    except StoreError as e:  # a store that has no records yet lacks the key columns
        if "no such column" not in str(e):
            raise
        records = read_records(run_dir)
    path = Path(out) if out is not None else run_dir / f"records.{fmt}"
    path.parent.mkdir(parents=True, exist_ok=True)
    df = pd.DataFrame.from_records(records)
    if fmt == "csv":
        for col in df.columns:
            if df[col].map(lambda v: isinstance(v, list | dict)).any():
                df[col] = [json.dumps(v, ensure_ascii=False) if isinstance(v, list | dict) else v for v in df[col]]
        df.to_csv(path, index=False)
    else:
        df.to_parquet(path, index=False)
    return path, len(df)
