"""Causal restoration on a real model: its controls, and what restoring repairs.

A sweep of `base` instances (as mask_controls.py: ~320 tokens, 2 distractors, none unanswerable) with
`anti_oracle[base=knorm]` (evicts the evidence first) and `snapkv`, every compressed cell also run with
``restore = ["answer", "evidence", "random", "distractor"]`` (kvroute.presses.restore). Controls, among
instances whose full cache answers correctly:

- anti_oracle + restore=evidence gives back everything anti_oracle evicts first: it must recover the
  full cache's answer far more often than anti_oracle alone;
- restore=random (as many other tokens as the answer has) and restore=distractor (as many tokens of the
  distractor values: the same kind of token as the answer) are the nulls: each must recover no more than
  restore=answer (Wilson 95% intervals; "cannot decide" where they overlap).

Then the restoration table (kvroute.analysis.restoration) for both presses: the share of failures each
condition repairs, by failure class; and the retrieval-head comparison (kvroute.analysis.retrieval) on the
press's own cells. (Restoring into an uncompressed cell changes nothing by construction:
tests/integration/test_engine.py.)

    python benchmarks/restore_controls.py [--model smollm2-135m] [--n 32]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import pandas as pd
from common import environment, md_table, write

from kvroute.metrics import DEFAULT_METRICS

PRESSES = ("anti_oracle[base=knorm]", "snapkv")
RATIOS = (0.0, 0.25, 0.5, 0.75, 0.9)
RESTORE = ("answer", "evidence", "random", "distractor")


def config(model: str, n: int, seed: int) -> dict:
    return {"name": "restore-controls", "models": [model],
            "tasks": [{"family": "base", "difficulty": 1, "n": n, "seed": seed, "target_tokens": 320,
                       "distractors": 2, "unanswerable_share": 0.0}],
            "presses": list(PRESSES), "ratios": list(RATIOS), "restore": list(RESTORE), "regimes": ["agnostic"],
            "seeds": [seed], "metrics": [*DEFAULT_METRICS, "retrieval"],
            "decoding": {"max_new_tokens": 16, "answer_prefix": "Answer:"}}


def recovery(df: pd.DataFrame) -> pd.DataFrame:
    """Per (press, ratio, restore or 'none'): among instances whose full cache is correct, the share of cells that
    give the full cache's answer, with its Wilson interval."""
    from kvroute.analysis.common import wilson

    full = df[df["press"] == "none"].set_index("instance_id")
    right = full.index[full["outcome"] == "correct"]
    cells = df[(df["ratio"] > 0) & df["instance_id"].isin(right)].copy()
    cells["same"] = cells["answer"].to_numpy() == full.loc[cells["instance_id"], "answer"].to_numpy()
    cells["restore"] = cells["restore"].fillna("none")
    rows = []
    for (press, ratio, restore), g in cells.groupby(["press", "ratio", "restore"], sort=True):
        k, n = int(g["same"].sum()), len(g)
        lo, hi = wilson(k, n)
        rows.append({"press": press, "ratio": ratio, "restore": restore, "n": n, "same": k, "share": k / n,
                     "low": lo, "high": hi})
    return pd.DataFrame(rows)


def checks(rec: pd.DataFrame) -> list[tuple[str, bool | None]]:
    out: list[tuple[str, bool | None]] = []
    a = rec[rec["press"] == PRESSES[0]].set_index(["ratio", "restore"])
    for ratio in sorted({r for r, _ in a.index}):
        none, ev, ans = (a.loc[(ratio, c)] for c in ("none", "evidence", "answer"))
        ok = True if ev["low"] > none["high"] else (None if ev["share"] > none["share"] else False)
        out.append((f"anti_oracle α={ratio:g}: restore=evidence recovers the full answer {ev['share']:.2f} "
                    f"[{ev['low']:.2f}, {ev['high']:.2f}] against {none['share']:.2f} [{none['low']:.2f}, "
                    f"{none['high']:.2f}] without", ok))
        for null in ("random", "distractor"):
            if (ratio, null) not in a.index:
                continue
            rnd = a.loc[(ratio, null)]
            null_ok = True if rnd["high"] < ans["low"] else (None if rnd["share"] <= ans["share"] else False)
            out.append((f"anti_oracle α={ratio:g}: the null (restore={null}) {rnd['share']:.2f} [{rnd['low']:.2f}, "
                        f"{rnd['high']:.2f}] does not beat restore=answer {ans['share']:.2f} [{ans['low']:.2f}, "
                        f"{ans['high']:.2f}]", null_ok))
    return out


def _md(df: pd.DataFrame, cols: list[str]) -> list[str]:
    return md_table(df.to_dict("records"), [(c, c) for c in cols], digits=2)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--n", type=int, default=32, help="base instances (default 32)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--run-dir", type=Path, default=Path("/tmp/kvroute-restore-controls"))
    args = ap.parse_args()
    from kvroute.analysis.load import load_records
    from kvroute.analysis.restoration import restoration_table
    from kvroute.analysis.retrieval import retrieval_vs_ger
    from kvroute.sweep import run_sweep, sweep_config_from_mapping

    env = environment()
    cfg = sweep_config_from_mapping(config(args.model, args.n, args.seed), source="benchmarks/restore_controls.py")
    t0 = time.perf_counter()
    run_sweep(cfg, args.run_dir / args.model, resume=True)
    sweep_s = time.perf_counter() - t0
    df = load_records(args.run_dir / args.model, with_restored=True)
    rec = recovery(df)
    marks = {True: "✔", False: "✘", None: "? (cannot decide: the intervals overlap)"}
    table = restoration_table(df)
    table = table[table["class"] == "all"]
    n_right = int((df[df["press"] == "none"]["outcome"] == "correct").sum())
    lines = ["# Causal restoration on a real model: controls and repairs", "",
             f"`python benchmarks/restore_controls.py --model {args.model} --n {args.n}` — {env}; sweep "
             f"{sweep_s:.0f} s.", "",
             f"{args.n} `base` instances (~320 tokens, 2 distractors), presses {', '.join(PRESSES)}, ratios "
             f"{', '.join(f'{r:g}' for r in RATIOS if r)}, each compressed cell also restored with "
             f"{', '.join(RESTORE)}. The full cache answers {n_right} of {args.n} correctly; the controls use those "
             "instances.", "",
             "## Controls: share of cells giving the full cache's answer (Wilson 95%)", "",
             *_md(rec, ["press", "ratio", "restore", "n", "same", "share", "low", "high"]), "",
             *[f"- {marks[ok]} {text}" for text, ok in checks(rec)], "",
             "## Repairs: share of the failures compression caused (the full cache was correct) that each "
             "restore condition repairs (all failure classes; Wilson 95%)", "",
             *_md(table, ["press", "ratio", "restore", "failures", "repaired", "listed", "share", "low", "high"]), "",
             "## Retrieval heads: does the answer's survival in them predict hallucination within ratio?", "",
             "Metric 'retrieval' on the same cells (the press's own cells, restored ones left out): AUC for "
             "hallucination of 1 − retrieval survival against GER's, within ratio, with the difference's 95% "
             "instance-bootstrap interval.", "",
             *_md(retrieval_vs_ger(df[df["restore"].isna()], n_boot=1000),
                  ["model", "retrieval_heads", "events", "cells", "auc_retrieval", "auc_ger", "delta", "low", "high",
                   "verdict"])]
    print("\n".join(lines))
    write("restore_controls" if args.model == "smollm2-135m" else f"restore_controls_{args.model}", lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
