"""Are two runs' records the same? Field by field, timings aside — the check that a refactor changed no reading.

    python benchmarks/compare_runs.py RUN_BEFORE RUN_AFTER [--rtol 1e-4] [--out results/compare_runs.md]

Records are matched by their cell key. For every other field the values must be equal: floats to
1e-9 relative (the same code on the same machine gives the same bits; the tolerance only absorbs a
different summation order in a library), everything else exactly (token ids, texts, lists, masks'
digests). Timing fields (``records.TIMING_FIELDS``) are left out. The report names each field that
differs, with how many records, the largest difference of its floats and one example; it ends with
`identical: yes` or `identical: no`. With ``--rtol R`` (a change of arithmetic that is equal only to
rounding, e.g. another order of a sum) it also says whether every difference is a float within R
relative (and 1e-6 absolute) of the other, everything else still exact: `equal to rounding: yes`. It
gives each run's sweep wall time from its manifest (started → finished).
"""

from __future__ import annotations

import argparse
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

from common import RESULTS

from kvroute.records import TIMING_FIELDS
from kvroute.sweep import read_records


def same(a: Any, b: Any, rtol: float = 1e-9, atol: float = 1e-12) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=rtol, abs_tol=atol)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(same(x, y, rtol, atol) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k], rtol, atol) for k in a)
    return a == b


def largest_difference(a: Any, b: Any) -> float:
    """The largest absolute difference between the floats of two values of the same shape (0 without floats)."""
    if isinstance(a, float) and isinstance(b, float):
        return 0.0 if (math.isnan(a) and math.isnan(b)) or a == b else abs(a - b)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple) and len(a) == len(b):
        return max((largest_difference(x, y) for x, y in zip(a, b, strict=True)), default=0.0)
    if isinstance(a, dict) and isinstance(b, dict) and a.keys() == b.keys():
        return max((largest_difference(a[k], b[k]) for k in a), default=0.0)
    return 0.0


def sweep_minutes(run: Path) -> str:
    """The sweep's wall time from its manifest (started → finished), in minutes."""
    import json
    from datetime import datetime

    try:
        m = json.loads((run / "manifest.json").read_text())
        dt = datetime.fromisoformat(m["finished"]) - datetime.fromisoformat(m["started"])
    except (OSError, ValueError, KeyError, TypeError):
        return "?"
    return f"{dt.total_seconds() / 60:.1f} min"


def commit(run: Path) -> str:
    import json

    try:
        git = json.loads((run / "manifest.json").read_text()).get("git") or {}
    except (OSError, ValueError):
        return "?"
    return f"{str(git.get('commit', '?'))[:7]}{' (uncommitted changes)' if git.get('dirty') else ''}"


def records(run: Path) -> dict[str, dict[str, Any]]:
    """A run's records by cell key."""
    return {r["key"]: r for r in read_records(run)}


def differences(a: dict[str, dict[str, Any]], b: dict[str, dict[str, Any]]) -> dict[str, list[str]]:
    """Per field that differs (:func:`same`; the timing fields aside), the keys of the records in both runs where it
    does, in key order."""
    diffs: dict[str, list[str]] = {}
    for key in sorted(set(a) & set(b)):
        ra, rb = a[key], b[key]
        for f in sorted((set(ra) | set(rb)) - set(TIMING_FIELDS)):
            if not same(ra.get(f), rb.get(f)):
                diffs.setdefault(f, []).append(key)
    return diffs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("before", type=Path)
    ap.add_argument("after", type=Path)
    ap.add_argument("--out", type=Path, default=RESULTS / "compare_runs.md")
    ap.add_argument("--rtol", type=float, default=None, help="also check equality to this relative rounding")
    args = ap.parse_args()
    a, b = records(args.before), records(args.after)
    only_a, only_b = sorted(set(a) - set(b)), sorted(set(b) - set(a))
    diffs = differences(a, b)
    largest = {f: max(largest_difference(a[k].get(f), b[k].get(f)) for k in keys) for f, keys in diffs.items()}
    # fields with a difference beyond --rtol (or not a float)
    beyond = {f for f, keys in diffs.items()
              if args.rtol is None or any(not same(a[k].get(f), b[k].get(f), args.rtol, 1e-6) for k in keys)}
    identical = not (only_a or only_b or diffs)
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    lines = ["# Two runs' records, field by field (timings aside)", "",
             f"`python benchmarks/compare_runs.py {args.before} {args.after}"
             + (f" --rtol {args.rtol:g}" if args.rtol is not None else "") + f"` (code at {head}).", "",
             f"- before: `{args.before}`, {len(a)} records, written by commit {commit(args.before)}, "
             f"sweep wall time {sweep_minutes(args.before)}",
             f"- after: `{args.after}`, {len(b)} records, written by commit {commit(args.after)}, "
             f"sweep wall time {sweep_minutes(args.after)}",
             f"- records in both: {len(set(a) & set(b))}; only before: {len(only_a)}; only after: {len(only_b)}",
             f"- fields compared: every field except the {len(TIMING_FIELDS)} timing fields "
             f"({', '.join(sorted(TIMING_FIELDS))})", ""]
    if diffs:
        lines += ["| field | records that differ | largest float difference | example (key: before → after) |",
                  "|---|---|---|---|"]
        for f, keys in sorted(diffs.items()):
            k = keys[0]
            ex = f"{k}: {str(a[k].get(f))[:60]!r} → {str(b[k].get(f))[:60]!r}"
            lines.append(f"| `{f}` | {len(keys)} | {largest[f]:.2g} | {ex} |")
        lines.append("")
    lines.append(f"identical: {'yes' if identical else 'no'}")
    rounding = not (only_a or only_b or beyond)
    if args.rtol is not None:
        lines.append(f"equal to rounding (floats within {args.rtol:g} relative or 1e-6 absolute, everything else "
                     f"exact): {'yes' if rounding else 'no'}"
                     + (f" (beyond it: {', '.join(sorted(beyond))})" if beyond else ""))
    print("\n".join(lines))
    args.out.write_text("\n".join(lines) + "\n")
    return 0 if identical or (args.rtol is not None and rounding) else 1


if __name__ == "__main__":
    sys.exit(main())
