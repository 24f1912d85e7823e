"""Full-cache (uncompressed) calibration of the task families on the embedded models.

For every model × family × difficulty it generates ``--n`` instances (seeded; ``long_context``
lengths measured with the model's own tokenizer), answers them greedily with the full cache
(question-agnostic prompt, exactly kvpress's layout) and scores token F1 against the gold answers;
on unanswerable items an abstention ("I don't know", "not mentioned", ...) scores 1, anything else 0.

    python benchmarks/calibrate_tasks.py                       # both models, all families, levels 1-3
    python benchmarks/calibrate_tasks.py --models qwen2.5-0.5b --families base hops --n 10

Prints a Markdown table and writes it to ``benchmarks/CALIBRATION.md`` (``--out``); every answer
goes to ``--answers`` (JSONL) for inspection. Re-runnable: same seeds, same instances.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

from kvroute.engine.generate import greedy_generate
from kvroute.metrics.abstention import is_abstention
from kvroute.metrics.utilization import f1_score
from kvroute.models import load_model
from kvroute.tasks import FAMILIES, TaskSpec, build_prompt, generate_tasks, get_family

MODELS = ("smollm2-135m", "qwen2.5-0.5b")
SEVEN = ("base", "knowledge", "multi_presence", "multi_entity", "coreference", "long_context", "hops")
THRESHOLDS = {"qwen2.5-0.5b": 0.7, "smollm2-135m": 0.5}  # the bar each model must reach at some level


def score(prediction: str, instance) -> float:  # noqa: ANN001 - TaskInstance
    if instance.unanswerable:
        return float(is_abstention(prediction))
    return f1_score(prediction, instance.answers)


def answer_text(tokenizer, ids: list[int]) -> str:  # noqa: ANN001
    """The decoded answer's first line (small models sometimes ramble on after it)."""
    text = tokenizer.decode(ids, skip_special_tokens=True)
    return text.strip().split("\n")[0].strip()


def run(args: argparse.Namespace) -> dict[tuple[str, str, int], tuple[float, int, float]]:
    results: dict[tuple[str, str, int], tuple[float, int, float]] = {}
    args.split = {}  # (model, family, level) -> (answerable F1, n answerable, abstention rate, n unanswerable)
    answers_f = open(args.answers, "w", encoding="utf-8") if args.answers else None
    if args.threads:
        torch.set_num_threads(args.threads)
    for model_name in args.models:
        lm = load_model(model_name, device="cpu", dtype=args.dtype)
        for family in args.families:
            for level in args.levels:
                if level not in get_family(family).levels:
                    continue
                spec = TaskSpec(family, n=args.n, seed=args.seed, difficulty=level)
                tasks = generate_tasks(spec, lm.tokenizer)
                t0 = time.perf_counter()
                scores = []
                ans: list[float] = []
                una: list[float] = []
                for inst in tasks:
                    prompt = build_prompt(lm.tokenizer, inst, regime="agnostic", answer_prefix=args.answer_prefix,
                                          system_prompt=args.system_prompt or None)
                    out = greedy_generate(lm, prompt.input_ids, max_new_tokens=args.max_new_tokens)
                    pred = answer_text(lm.tokenizer, out)
                    s = score(pred, inst)
                    scores.append(s)
                    (una if inst.unanswerable else ans).append(s)
                    if answers_f:
                        answers_f.write(json.dumps({
                            "model": model_name, "family": family, "difficulty": level, "id": inst.id,
                            "question_type": inst.question_type, "answer_type": inst.answer_type,
                            "unanswerable": inst.unanswerable, "gold": list(inst.answers), "prediction": pred,
                            "score": round(s, 4), "context_tokens": prompt.n_context}, ensure_ascii=False) + "\n")
                        answers_f.flush()
                dt = time.perf_counter() - t0
                mean = sum(scores) / len(scores)
                results[(model_name, family, level)] = (mean, len(scores), dt)
                if una:
                    args.split[(model_name, family, level)] = (sum(ans) / max(len(ans), 1), len(ans),
                                                               sum(una) / len(una), len(una))
                print(f"{model_name:14s} {family:15s} level {level}: F1 {mean:.3f} (n={len(scores)}, {dt:.0f} s)",
                      file=sys.stderr, flush=True)
        del lm
    if answers_f:
        answers_f.close()
    return results


def table(results: dict[tuple[str, str, int], tuple[float, int, float]], args: argparse.Namespace) -> str:
    levels = sorted({k[2] for k in results})
    by: dict[tuple[str, str], dict[int, float]] = defaultdict(dict)
    for (m, f, lv), (mean, _n, _dt) in results.items():
        by[(f, m)][lv] = mean
    head = "| family | model | " + " | ".join(f"level {lv}" for lv in levels) + " | best | bar |"
    lines = [head, "|" + "---|" * (len(levels) + 4)]
    for f in args.families:
        for m in args.models:
            cells = by.get((f, m), {})
            if not cells:
                continue
            best = max(cells.values())
            bar = THRESHOLDS.get(m) if (m == "qwen2.5-0.5b" or f == "base") else None
            verdict = "—" if bar is None else (f"≥ {bar} ✓" if best >= bar else f"< {bar} ✗")
            row = [f"{cells[lv]:.2f}" if lv in cells else "" for lv in levels]
            lines.append(f"| `{f}` | {m} | " + " | ".join(row) + f" | {best:.2f} | {verdict} |")
    if args.split:
        lines += ["", "Items with unanswerable questions, split: F1 on answerable items / share of unanswerable items "
                      "answered with an abstention (n answerable / n unanswerable).", "",
                  "| family | model | level | answerable F1 | abstained when unanswerable |", "|---|---|---|---|---|"]
        for (m, f, lv), (fa, na, ab, nu) in sorted(args.split.items(), key=lambda kv: (kv[0][1], kv[0][0], kv[0][2])):
            lines.append(f"| `{f}` | {m} | {lv} | {fa:.2f} (n={na}) | {ab:.2f} (n={nu}) |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", default=list(MODELS))
    p.add_argument("--families", nargs="+", default=None, help="default: all registered families")
    p.add_argument("--levels", nargs="+", type=int, default=[1, 2, 3, 4], help="levels a family lacks are skipped")
    p.add_argument("--n", type=int, default=24, help="instances per family and level")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-new-tokens", type=int, default=20)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--answer-prefix", default="Answer:",
                   help="appended after the chat template (kvpress's answer_prefix); keeps small models terse")
    p.add_argument("--system-prompt", default="", help="a system message before the user message (default: none, "
                   "i.e. the chat template's own default, as kvpress)")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    p.add_argument("--out", default=str(Path(__file__).with_name("CALIBRATION.md")))
    p.add_argument("--answers", default="", help="write every answer to this JSONL file")
    args = p.parse_args()
    get_family("base")  # registers the families
    args.families = args.families or [f for f in FAMILIES.names() if f in SEVEN]
    logging.basicConfig(level=logging.WARNING)
    t0 = time.perf_counter()
    results = run(args)
    md = table(results, args)
    cmd = "python benchmarks/calibrate_tasks.py " + " ".join(sys.argv[1:])
    versions = ", ".join(f"{f} v{get_family(f).VERSION}" for f in args.families)
    doc = (f"# Task calibration: full-cache F1 per family and level\n\n"
           f"Produced by `{cmd.strip()}` ({args.n} instances per cell, seed {args.seed}, {args.dtype}, greedy, "
           f"max {args.max_new_tokens} new tokens, question-agnostic prompt, answer prefix {args.answer_prefix!r}, "
           f"{'system prompt ' + repr(args.system_prompt) + ', ' if args.system_prompt else ''}"
           f"CPU; family versions {versions}; "
           f"{(time.perf_counter() - t0) / 60:.0f} min). Unanswerable items score 1 for an abstention.\n\n"
           f"{md}\n")
    print(md)
    if args.out:
        Path(args.out).write_text(doc, encoding="utf-8")


if __name__ == "__main__":
    main()
