"""Can the model tell the answer from its distractors at all? The full-cache binding check.

    python benchmarks/binding_check.py                          # SmolLM2-135M
    python benchmarks/binding_check.py --model qwen2.5-0.5b     # the model the identity orderings need

The answer-identity probe reads *which* of an instance's candidate values (the gold vs its
distractors) the hidden state favours. Under compression it can only fall from what the full cache
gives, so a model whose own full-cache likelihood picks the gold at chance cannot show any ordering of
presses by identity, however the probe is built. This script measures that ceiling: per task set,
the share of instances whose gold has the highest whole-sequence log-likelihood among the candidates
at the full cache (``lens_seq_identity_top1``; kvroute's sequence lens, last layer), its first-token
counterpart (``lens_identity_top1``; distractors sharing the gold's first token dropped), both with
95% instance-bootstrap intervals against chance (the mean of 1 / number of candidates), and the
model's exact-match accuracy. Writes results/binding_check[_MODEL].md.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np
from common import environment, write

#: task sets: (label, TaskSpec keyword arguments); contexts padded to ~320 tokens like the mask controls
TASK_SETS = (
    ("base d1, 1 distractor", dict(family="base", difficulty=1, distractors=1, target_tokens=320)),
    ("base d1, 2 distractors", dict(family="base", difficulty=1, distractors=2, target_tokens=320)),
    ("niah, 2 distractor needles", dict(family="niah", distractors=2, target_tokens=320)),
)


def bootstrap(v: np.ndarray, n_boot: int = 2000, seed: int = 0) -> tuple[float, float]:
    boot = np.random.default_rng(seed).choice(v, size=(n_boot, len(v))).mean(1)
    lo, hi = np.quantile(boot, [0.025, 0.975])
    return float(lo), float(hi)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--n", type=int, default=48, help="instances per task set (default 48)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-write-results", action="store_true")
    args = ap.parse_args()

    from kvroute.engine import Cell, Engine
    from kvroute.models import load_model
    from kvroute.runner import RunSettings, run_instance
    from kvroute.tasks import TaskSpec, generate_tasks

    env = environment()
    lm = load_model(args.model, device="cpu", dtype="float32")
    settings = RunSettings(max_new_tokens=16, answer_prefix="Answer:", metrics=("utilization", "representation"))
    engine = Engine(lm, settings.decode_settings())
    rows = []
    t0 = time.perf_counter()
    for label, kw in TASK_SETS:
        spec = TaskSpec(n=args.n, seed=args.seed, unanswerable_share=0.0, **kw)
        recs = [r for inst in generate_tasks(spec, lm.tokenizer)
                for r in run_instance(engine, inst, [Cell("none", 0.0)], settings=settings)]
        recs = [r for r in recs if r.get("status", "ok") == "ok" and r.get("lens_seq_identity_top1") is not None]
        seq = np.array([r["lens_seq_identity_top1"] for r in recs], float)
        first = np.array([r["lens_identity_top1"] for r in recs if r.get("lens_identity_top1") is not None], float)
        chance = float(np.mean([1 / r["lens_seq_n_candidates"] for r in recs]))
        lo, hi = bootstrap(seq)
        flo, fhi = bootstrap(first) if len(first) else (np.nan, np.nan)
        exact = float(np.mean([float(r.get("exact") or 0) for r in recs]))
        rows.append((label, len(recs), chance, seq.mean(), lo, hi, len(first), first.mean() if len(first) else np.nan,
                     flo, fhi, exact, "above chance" if lo > chance else "at chance"))
        print(rows[-1], flush=True)
    secs = time.perf_counter() - t0
    lines = ["# Full-cache binding check", "",
             f"`python benchmarks/binding_check.py --model {args.model} --n {args.n}` — {env}; {secs:.0f} s.", "",
             "Per task set (no unanswerable items, contexts padded to ~320 tokens, answer prefix `Answer:`): how often "
             "the full-cache model's own likelihood ranks the gold first among the instance's candidate values. "
             "`whole sequence` reads every distinct candidate's whole-sequence log-likelihood (the sequence lens, last "
             "layer); `first token` the first-token log-prob (distractors sharing the gold's first token dropped, so "
             "its item count can be lower). Intervals are 95% instance bootstraps; chance is the mean of 1 / "
             "candidates. A set read `at chance` cannot rank presses by answer identity on this model.", "",
             "| task set | items | chance | whole sequence | 95% CI | first-token items | first token | 95% CI "
             "| exact match | verdict |",
             "|---|---:|---:|---:|---|---:|---:|---|---:|---|"]
    for (label, n, ch, s, lo, hi, nf, f, flo, fhi, ex, verdict) in rows:
        lines.append(f"| {label} | {n} | {ch:.3f} | {s:.3f} | [{lo:.3f}, {hi:.3f}] | {nf} | {f:.3f} | "
                     f"[{flo:.3f}, {fhi:.3f}] | {ex:.3f} | {verdict} |")
    print("\n".join(lines))
    if not args.no_write_results:
        write("binding_check" if args.model == "smollm2-135m" else f"binding_check_{args.model}", lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
