"""Compress once, ask many: three questions over one compressed context, by turn, and the time of a turn.

    python benchmarks/multi_turn.py                            # SmolLM2-135M, 32 contexts × 3 questions
    python benchmarks/multi_turn.py --model qwen2.5-0.5b       # the demo's model

A chat server compresses a shared context once and answers several turns on it, each turn's question and
answer appended to the cache uncompressed. The script sweeps the multi-question form of the ``base`` family
(``TaskSpec(questions=3)``: three drafts about different people in one context, padded to ~480 tokens)
with ``decoding.history`` set (``gold`` by default: every cell's cache holds the earlier questions with
their gold answers, so each turn measures what the compressed context loses; ``own``: each cell's own
answers, as a chat server holds them — errors then compound), two presses over the demo's ratios and three
below them. The
records are read back through ``kvroute.analysis.turns`` (each later turn against turn 1, paired on
conversations; H and the GER of each turn's own evidence per ratio; α* by turn) and written to
results/multi_turn[_MODEL].md with the finding sentences the analysis writes.

Then the time of a turn: for the first ``--timed`` conversations, turns 2 and 3 decoded on turn 1's prefill
(what the sweep does) against the same engine run re-prefilling the context, the same cells and tokens
(the script checks the tokens are equal), side by side in one process: medians and their ratio.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from common import RESULTS, environment, md_table

#: two presses of different kinds (question-agnostic statistics of the queries; the last window's attention): each
#: turn re-decodes every cell, so the grid is kept to what the 2-core reference machine runs in an hour per model
PRESSES = ("expected_attention", "snapkv[window_size=16]")
#: the demo's ratios (kvroute.demo.DEMO_RATIOS) and three below them: on these 480-token contexts Qwen2.5-0.5B's
#: cliff lies below the demo's first ratio (H 0.19 at α = 0, 0.72 at 0.5 on the first run), where no α* can be placed
RATIOS = (0.0, 0.1, 0.25, 0.4, 0.5, 0.7, 0.8, 0.85, 0.9, 0.95)
QUESTIONS = 3
TARGET_TOKENS = 480


def config(model: str, n: int, seed: int, history: str) -> dict:
    return {"name": "multi-turn", "models": [model],
            "tasks": [{"family": "base", "difficulty": 1, "n": n, "seed": seed, "target_tokens": TARGET_TOKENS,
                       "distractors": 1, "questions": QUESTIONS}],
            "presses": list(PRESSES), "ratios": list(RATIOS), "regimes": ["agnostic"], "seeds": [0],
            # what the section reads: the answer (hallucination) and retention (the GER of each turn's evidence)
            "metrics": ["retention", "utilization"],
            "decoding": {"max_new_tokens": 16, "batch_size": 64, "answer_prefix": "Answer:", "history": history}}


def sweep(model: str, n: int, seed: int, history: str, run_dir: Path) -> str:
    from kvroute.sweep import run_sweep, sweep_config_from_mapping

    cfg = sweep_config_from_mapping(config(model, n, seed, history), source="benchmarks/multi_turn.py")
    t0 = time.perf_counter()
    outcome = run_sweep(cfg, run_dir, resume=True)
    s = time.perf_counter() - t0
    return f"sweep {s:.0f} s" + ("" if not outcome.already_done else
                                 f" ({outcome.computed} of {outcome.total_cells} cells computed now)")


def turn_times(model: str, n: int, seed: int) -> list[dict]:
    """Per timed conversation and later turn: seconds on turn 1's prefill and re-prefilling, same cells and tokens."""
    from kvroute.engine import Cell, Engine
    from kvroute.models import load_model
    from kvroute.settings import RunSettings
    from kvroute.tasks import TaskSpec, generate_tasks
    from kvroute.tasks.conversation import conversation_prompt, conversations

    lm = load_model(model)
    s = RunSettings(max_new_tokens=16, batch_size=64, answer_prefix="Answer:", metrics=("utilization",))
    engine = Engine(lm, s.decode_settings())
    cells = [Cell("none", 0.0)] + [Cell(p, r) for p in PRESSES for r in RATIOS if r > 0]
    spec = TaskSpec("base", difficulty=1, n=n, seed=seed, target_tokens=TARGET_TOKENS, distractors=1,
                    questions=QUESTIONS)
    rows = []
    for conv in conversations(generate_tasks(spec, lm.tokenizer)):
        first = engine.run(conversation_prompt(lm.tokenizer, conv[:1], [], answer_prefix="Answer:"), cells)
        first.raise_for_errors()
        for k in range(1, len(conv)):
            gold = [t.answers[0] for t in conv[:k]]
            p = conversation_prompt(lm.tokenizer, conv[:k + 1], gold, answer_prefix="Answer:")
            t0 = time.perf_counter()
            shared = engine.run(p, cells, prefilled=first.prefill).raise_for_errors()
            t1 = time.perf_counter()
            fresh = engine.run(p, cells).raise_for_errors()
            t2 = time.perf_counter()
            same = all(a is not None and b is not None and a.tokens == b.tokens
                       for a, b in zip(shared.outputs, fresh.outputs, strict=True))
            rows.append({"conversation": conv[0].meta["conversation"], "turn": k + 1, "context": p.n_context,
                         "suffix": len(p.question_ids), "cells": len(cells), "shared_s": t1 - t0,
                         "reprefill_s": t2 - t1, "prefill_s": fresh.seconds["prefill"], "same_tokens": same})
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--n", type=int, default=32, help="contexts (default 32), each with 3 questions")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--history", default="gold", choices=("gold", "own"))
    ap.add_argument("--timed", type=int, default=4, help="conversations timed against re-prefilling (default 4)")
    ap.add_argument("--run-dir", type=Path, default=Path("/tmp/kvroute-multi-turn"))
    ap.add_argument("--n-boot", type=int, default=1000)
    ap.add_argument("--no-write-results", action="store_true")
    args = ap.parse_args()
    env = environment()
    run_dir = args.run_dir / args.model / args.history
    sweep_text = sweep(args.model, args.n, args.seed, args.history, run_dir)
    from kvroute.analysis.load import load_records
    from kvroute.analysis.turns import turn_cliffs, turn_curves, turn_pairs
    from kvroute.errors import AnalysisError
    from kvroute.report.turns import turns_markdown

    df = load_records(run_dir)
    df = df[df["press"].isin(["none", *PRESSES]) & df["ratio"].isin(RATIOS)]  # a store kept from a larger grid
    tables, missing = {}, []
    for name, fn in (("turn_pairs", turn_pairs), ("turn_curves", turn_curves), ("turn_cliffs", turn_cliffs)):
        try:
            tables[name] = fn(df, n_boot=args.n_boot, seed=args.seed)
        except AnalysisError as e:
            missing.append(f"{name}: {e}")
    times = turn_times(args.model, args.timed, args.seed) if args.timed else []
    cmd = (f"python benchmarks/multi_turn.py --model {args.model} --n {args.n}"
           + (f" --history {args.history}" if args.history != "gold" else ""))
    lines = ["# Compress once, ask many: three questions over one compressed context", "",
             f"`{cmd}` — {env}; {sweep_text}.", "",
             f"{df['conversation'].nunique()} contexts of the `base` family's multi-question form ({QUESTIONS} "
             f"questions about different people, padded to ~{TARGET_TOKENS} tokens, 1 distractor each), agnostic "
             f"regime, answer prefix `Answer:`, history `{args.history}` ("
             + ("every cell's cache holds the earlier questions with their gold answers" if args.history == "gold"
                else "every cell's cache holds its own earlier answers, as a chat server would")
             + f"), ratios {', '.join(str(r) for r in RATIOS)}. Presses: " + ", ".join(f"`{p}`" for p in PRESSES)
             + ". One prefill per context; each turn's question after the compressed context.", "",
             *turns_markdown(tables), *(f"Not computed — {m}" for m in missing), ""]
    if times:
        shared = statistics.median(r["shared_s"] for r in times)
        fresh = statistics.median(r["reprefill_s"] for r in times)
        ratios = sorted(r["reprefill_s"] / r["shared_s"] for r in times)
        lines += ["## The time of a turn: on turn 1's prefill against re-prefilling the context", "",
                  f"{len(times)} later turns of {args.timed} conversations, {times[0]['cells']} cells each (the full "
                  "cache and every press × ratio above), gold history; the same engine run with and without turn "
                  "1's prefill, back to back in one process. Tokens equal in "
                  f"{sum(r['same_tokens'] for r in times)}/{len(times)} turns. Median seconds per turn: "
                  f"{shared:.2f} on the shared prefill, {fresh:.2f} re-prefilling; per turn, re-prefilling takes "
                  f"{statistics.median(ratios):.2f}× the shared-prefill time (median of the {len(ratios)} paired "
                  f"ratios, range {ratios[0]:.2f}–{ratios[-1]:.2f}; the prefill alone "
                  f"{statistics.median(r['prefill_s'] for r in times):.2f} s).", "",
                  *md_table(times, [(c, c) for c in ("conversation", "turn", "context", "suffix", "shared_s",
                                                      "reprefill_s", "prefill_s", "same_tokens")], digits=2), ""]
    text = "\n".join(lines) + "\n"
    print(text)
    if not args.no_write_results:
        stem = "multi_turn" if args.model == "smollm2-135m" else f"multi_turn_{args.model}"
        (RESULTS / (stem + ("" if args.history == "gold" else f"_{args.history}") + ".md")).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
