"""kvroute's masked engine vs the kvpress pipeline, answer for answer, on a real embedded model.

For every instance × press × ratio, kvroute decodes the cell from one shared prefill with a
KeepMask; kvpress's own `KVPressTextGenerationPipeline` runs the same press on the same prompt
(its own hooks, its own pruned or fake-key-masked cache). The greedy answers must agree token for
token: the generated token ids (read off the pipeline's final ``tokenizer.decode`` call) and the
text (the comparison is :mod:`kvroute.presses.check`'s, as in ``kvroute presses check``). Ends with
the line `agreement: X/Y`.

The presses are every scorer in the registry that wraps a kvpress press (with kvpress's defaults),
a few parameter variants that reach code paths the defaults skip on ~220-token contexts, and the
kvpress selection wrappers (AdaKV, ChunkPress) on two scorers. Random scorers (leverage,
compactor) are seeded per (seed, layer) on both sides (``seeded_kvpress_layers``).

    python benchmarks/equivalence.py [--model smollm2-135m] [--n 12] [--max-new-tokens 24]
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path

import torch

from kvroute.engine import Cell, DecodeSettings, Engine
from kvroute.engine.reference import kvpress_pipeline
from kvroute.models import load_model
from kvroute.presses.check import compare_prompt
from kvroute.tasks import TaskSpec, build_prompt, generate_tasks

# every registered kvpress scorer, then variants and selection wrappers (kvpress AdaKVPress / ChunkPress)
VARIANTS = ["lagkv[lag_size=32]", "compactor[chunk_size=64]", "non_causal_attention[chunk_size=64]"]
SELECTIONS = ["expected_attention+adakv", "snapkv+adakv", "expected_attention+chunk[chunk_length=48]",
              "knorm+chunk[chunk_length=48]"]


def registry_presses() -> list[str]:
    from kvroute.presses import SCORERS
    from kvroute.presses.scorers import KvpressScorer

    return [n for n, cls in SCORERS.items() if issubclass(cls, KvpressScorer)]


PRESSES = registry_presses() + VARIANTS + SELECTIONS
RATIOS = [0.25, 0.5, 0.75, 0.9]
SEED = 0
FAMILIES = ["base", "multi_entity", "hops", "knowledge", "coreference", "multi_presence"]


def instances(tokenizer, n: int) -> list:
    out = []
    per = -(-n // len(FAMILIES))
    for fam in FAMILIES:
        out += generate_tasks(TaskSpec(fam, n=per, seed=7, target_tokens=220), tokenizer)
    return out[:n]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--n", type=int, default=12)
    ap.add_argument("--max-new-tokens", type=int, default=24)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "equivalence.md"))
    args = ap.parse_args()
    torch.manual_seed(0)
    lm = load_model(args.model, dtype="float32")
    tasks = instances(lm.tokenizer, args.n)
    engine = Engine(lm, DecodeSettings(max_new_tokens=args.max_new_tokens))
    pipe = kvpress_pipeline(lm)
    cells = [Cell(p, r) for p in PRESSES for r in RATIOS]
    agree = total = 0
    per_press: dict[str, list[int]] = {p: [0, 0] for p in PRESSES}
    diffs = []
    t_ours = t_ref = 0.0
    for k, inst in enumerate(tasks):
        prompt = build_prompt(lm.tokenizer, inst)
        res = compare_prompt(engine, prompt, cells, seed=SEED, pipeline=pipe, prompt_id=inst.id)
        t_ours += res.seconds_kvroute
        t_ref += res.seconds_kvpress
        for c in res.cells:
            agree += c.agrees
            total += 1
            per_press[c.cell.press][0] += c.agrees
            per_press[c.cell.press][1] += 1
            if not c.agrees:
                diffs.append(c.describe())
        print(f"[{k + 1}/{len(tasks)}] {inst.family:<15} T={prompt.n_context:<4} agreement so far {agree}/{total}",
              flush=True)
    lines = [
        "# Equivalence with the kvpress pipeline",
        "",
        f"Command: `python benchmarks/equivalence.py --model {args.model} --n {args.n} "
        f"--max-new-tokens {args.max_new_tokens}`",
        f"Machine: {platform.machine()}, {torch.get_num_threads()} torch threads, torch {torch.__version__}; "
        f"date {time.strftime('%Y-%m-%d')}.",
        f"Model: {lm.name} (float32). Instances: {len(tasks)} ({', '.join(dict.fromkeys(t.family for t in tasks))}; "
        f"~220-token contexts), "
        f"question-agnostic, greedy, max_new_tokens={args.max_new_tokens}.",
        "",
        f"Presses: every kvpress scorer in the registry ({len(registry_presses())}, kvpress defaults), "
        f"{len(VARIANTS)} parameter variants, {len(SELECTIONS)} with kvpress selection wrappers; ratios "
        f"{', '.join(map(str, RATIOS))}. Agreement = equal generated token ids and text.",
        "",
        "| press | agreement |",
        "|---|---|",
        *[f"| `{p}` | {a}/{n} |" for p, (a, n) in per_press.items()],
        "",
        f"Wall time: kvroute {t_ours:.1f} s (one prefill per instance, all {len(cells)} cells batched), "
        f"kvpress pipeline {t_ref:.1f} s (one call per cell).",
        "",
    ]
    if diffs:
        lines += ["Disagreements:", ""] + [f"- {d}" for d in diffs]
    lines.append(f"agreement: {agree}/{total}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines[-(len(diffs) + 3):]))
    return 0 if agree == total else 1


if __name__ == "__main__":
    sys.exit(main())
