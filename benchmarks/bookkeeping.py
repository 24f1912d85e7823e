"""Bookkeeping at scale: expand and schedule a 100,000-cell sweep grid and write its records to the store.

No model runs: records are fabricated with the fields and vector sizes of a real record (SmolLM2:
30 layers, 576-dim probe features by default). Measured, each on its own:

* validate the config, generate the task instances, expand the grid (one content-hash key per cell);
* schedule: open (lock) a fresh store, read its keys, filter the pending cells, cut Ray shards;
* write every unit's records in its own transaction (what a sweep does), fabricating excluded;
* plan a resume against the full store (read 100k keys, filter: nothing left to do);
* read every record back, decoded;
* encode the vectors of 10,000 records as JSON text vs float32 blobs (why the store uses blobs).

    python benchmarks/bookkeeping.py [--cells 100000] [--layers 30] [--hidden 576]

Prints its figures, ends with a one-line summary, writes benchmarks/results/bookkeeping.md.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

RESULTS = Path(__file__).parent / "results"
PRESSES = ["expected_attention", "snapkv", "knorm", "tova", "expected_attention+adakv"]
RATIOS = [0.0, 0.1, 0.25, 0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95, 0.98]
MODELS = ["smollm2-135m", "qwen2.5-0.5b"]


_POOL: dict[tuple[int, int], tuple[list, list]] = {}


def _pool(layers: int, hidden: int) -> tuple[list, list]:
    """64 per-layer vectors (float32 values) and 64 probe vectors (float16 values), as the metrics give them."""
    if (layers, hidden) not in _POOL:
        import numpy as np

        rng = np.random.default_rng(0)
        _POOL[layers, hidden] = ([rng.random(layers).astype(np.float32).astype(float).tolist() for _ in range(64)],
                                 [rng.standard_normal(hidden).astype(np.float16).astype(float).tolist()
                                  for _ in range(64)])
    return _POOL[layers, hidden]


def fake_record(key: str, unit, cell, layers: int, hidden: int, i: int) -> dict:
    """A record with a real record's fields, types, vector lengths and value precision."""
    vectors, probes = _pool(layers, hidden)
    v, probe = vectors[i % 64], probes[i % 64]
    return {
        "key": key, "model": unit.model, "instance_id": unit.instance.id, "press": cell.press, "ratio": cell.ratio,
        "regime": unit.regime, "seed": unit.seed, "settings": "0123456789abcdef", "family": "base",
        "answer_type": "Person", "question_type": "Standard", "unanswerable": False, "context_tokens": 512,
        "difficulty": 1, "gold": ["Maren Oskvold"], "scorer": cell.press.split("+")[0], "selection": "per_head",
        "kept_fraction": 1 - cell.ratio, "eviction_rate": 0.25, "ger": 0.125, "ger_all_layers": 0.0625,
        "ger_evidence": 0.5, "ger_evidence_all_layers": 0.25, "ger_layer": v,
        "evidence_attention_mass": 0.0625, "evidence_attention_mass_full": 0.125, "answer_attention_mass": 0.03125,
        "answer_attention_mass_full": 0.0625, "evidence_mass_layer": v, "evidence_mass_layer_full": v,
        "reachable": True, "generated_evidence_mass": 0.5, "routed_reachable": True, "routed_evidence_mass": 0.25,
        "consensus": v, "rho": v, "consensus_nosink": v, "rho_nosink": v, "consensus_mean": 0.5, "rho_mean": 0.25,
        "answer": "Maren Oskvold", "f1": 1.0, "exact": 1.0, "outcome": "correct", "hallucinated": False,
        "gold_logprob": -1.5, "gold_logprob_full": -1.25, "gold_logprob_delta": -0.25, "answer_tokens": 4,
        "hidden_cosine": v, "hidden_cosine_last": 0.875, "probe_features": probe, "probe_layer": 20,
        "seconds_prefill": 0.8, "seconds_decode": 1.6,
    }


def environment() -> str:
    from kvroute import __version__

    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return (f"{time.strftime('%Y-%m-%d')}, {os.cpu_count()} CPU cores ({platform.machine()}, load average "
            f"{load:.1f} at the start), Python {platform.python_version()}, SQLite "
            f"{__import__('sqlite3').sqlite_version}, kvroute {__version__}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cells", type=int, default=100_000)
    ap.add_argument("--layers", type=int, default=30)
    ap.add_argument("--hidden", type=int, default=576)
    ap.add_argument("--no-write-results", action="store_true",
                    help="Only print (do not rewrite results/bookkeeping.md).")
    args = ap.parse_args(argv)
    env = environment()

    from kvroute.sweep.config import sweep_config_from_mapping
    from kvroute.sweep.grid import count_cells, expand, pending, shards
    from kvroute.sweep.store import Store, encode_list, iter_records
    from kvroute.sweep.tasks import resolve_tasks

    per_unit = 1 + len(PRESSES) * (len(RATIOS) - 1)
    n = math.ceil(args.cells / (per_unit * len(MODELS)))
    figures: list[tuple[str, float, str]] = []

    def step(name: str, t0: float, note: str = "") -> float:
        dt = time.perf_counter() - t0
        figures.append((name, dt, note))
        print(f"{name:<42} {dt:8.2f} s  {note}", flush=True)
        return dt

    t0 = time.perf_counter()
    cfg = sweep_config_from_mapping({"models": MODELS, "presses": PRESSES, "ratios": RATIOS,
                                     "tasks": [{"family": "base", "n": n}]})
    step("validate config", t0)
    t0 = time.perf_counter()
    tasks, _ = resolve_tasks(cfg)
    step("generate task instances", t0, f"{n} base instances")
    t0 = time.perf_counter()
    units = expand(cfg, tasks)
    cells = count_cells(units)
    t_expand = step("expand grid + cell keys", t0, f"{cells:,} cells, {len(units):,} units of {per_unit}")

    tmp = Path(tempfile.mkdtemp(prefix="kvroute-bookkeeping-"))
    try:
        t0 = time.perf_counter()
        store = Store.open(tmp)
        todo = pending(units, store.keys())
        sh = shards(todo, 4)
        t_sched = step("schedule (lock, keys, pending, shards)", t0,
                       f"{count_cells(todo):,} pending, {len(sh):,} shards")

        write_s, i = 0.0, 0
        for u in todo:
            recs = []
            for key, cell in zip(u.keys, u.cells, strict=True):
                recs.append(fake_record(key, u, cell, args.layers, args.hidden, i))
                i += 1
            t1 = time.perf_counter()
            store.write(recs)
            write_s += time.perf_counter() - t1
        figures.append(("write records (1 transaction per unit)", write_s, f"{i:,} records"))
        print(f"{'write records (1 transaction per unit)':<42} {write_s:8.2f} s  {i / write_s:,.0f} records/s",
              flush=True)
        store.close()
        size = sum(f.stat().st_size for f in tmp.iterdir() if f.is_file()) / 1e6

        t0 = time.perf_counter()
        with Store.open(tmp) as s:
            left = pending(units, s.keys())
        t_resume = step("plan a resume of the full store", t0, f"{count_cells(left)} cells left")
        t0 = time.perf_counter()
        n_back, last = 0, None
        for rec in iter_records(tmp):
            n_back, last = n_back + 1, rec
        step("read all records back (decoded)", t0, f"{n_back:,} records, store {size:,.0f} MB")
        want = fake_record("", units[0], units[0].cells[0], args.layers, args.hidden, i - 1)["probe_features"]
        assert n_back == cells and last is not None and last["probe_features"] == want
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    sample = [fake_record("k", units[0], units[0].cells[1], args.layers, args.hidden, j) for j in range(10_000)]
    vec_fields = [k for k, v in sample[0].items() if isinstance(v, list) and v and isinstance(v[0], float)]
    t0 = time.perf_counter()
    for r in sample:
        for k in vec_fields:
            json.dumps(r[k])
    t_json = (time.perf_counter() - t0) * cells / len(sample)
    t0 = time.perf_counter()
    for r in sample:
        for k in vec_fields:
            encode_list(r[k])
    t_blob = (time.perf_counter() - t0) * cells / len(sample)
    print(f"{'vector encoding per ' + format(cells, ',') + ' records':<42} JSON {t_json:.1f} s, float32 blobs "
          f"{t_blob:.1f} s (from 10,000)", flush=True)

    total = t_expand + t_sched + write_s + t_resume
    summary = (f"bookkeeping: {cells:,} cells — expand {t_expand:.1f} s, schedule {t_sched:.1f} s, write "
               f"{write_s:.1f} s ({cells / write_s:,.0f} records/s, {size:,.0f} MB), resume plan {t_resume:.1f} s; "
               f"total {total:.1f} s")
    if not args.no_write_results:
        RESULTS.mkdir(parents=True, exist_ok=True)
        lines = ["# Bookkeeping at scale (sweep grid, scheduling, store)", "",
                 f"`python benchmarks/bookkeeping.py` — {env}.", "",
                 f"A grid of {cells:,} cells ({len(MODELS)} models × {n} instances × (1 baseline + {len(PRESSES)} "
                 f"presses × {len(RATIOS) - 1} ratios)), records fabricated with a real record's fields and "
                 f"vector sizes ({args.layers} layers, {args.hidden}-dim probe features); no model runs. "
                 "Writes are one transaction per unit (one prefill's cells), as in a sweep.", "",
                 "| step | seconds | note |", "|---|---:|---|"]
        lines += [f"| {name} | {dt:.2f} | {note} |" for name, dt, note in figures]
        lines += [f"| vector encoding, JSON text (est. for all records) | {t_json:.1f} | measured on 10,000 |",
                  f"| vector encoding, float32 blobs (est. for all records) | {t_blob:.1f} | measured on 10,000 |",
                  "", f"Summary: {summary}.", ""]
        (RESULTS / "bookkeeping.md").write_text("\n".join(lines))
    print(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
