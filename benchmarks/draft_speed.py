"""Draft-verified decoding against plain step-by-step decoding, side by side: time, tokens, and how much of the
draft the cells accept.

The grid_speed grid (snapkv, expected_attention, streaming_llm × 9 ratios; answers only) on `base` instances,
with ``DecodeSettings.draft`` off and on in alternating repeats; with drafting on, the full cache is decoded
first (one row) and its answer verified for all cells in one forward. Reports the median decode time of
each, whether every cell's tokens are equal, and the share of generated tokens inside the cells' agreed
prefix with the full answer (what the draft can save at most).

    python benchmarks/draft_speed.py [--model smollm2-135m] [--instances 2] [--tokens 512] [--repeats 3]
"""

from __future__ import annotations

import statistics
import sys
import time

import torch
from common import environment, median_spread, write
from grid_speed import PRESSES, RATIOS, grid_args, result_name


def agreed(tokens: list[int], full: list[int]) -> int:
    n = 0
    while n < min(len(tokens), len(full)) and tokens[n] == full[n]:
        n += 1
    return n


def main() -> int:
    args = grid_args(__doc__.splitlines()[0])
    from kvroute.engine import Cell, DecodeSettings, Engine
    from kvroute.models import load_model
    from kvroute.tasks import TaskSpec, build_prompt, generate_tasks

    lm = load_model(args.model, dtype="float32")
    tasks = generate_tasks(TaskSpec("base", n=args.instances, seed=11, target_tokens=args.tokens), lm.tokenizer)
    prompts = [build_prompt(lm.tokenizer, t) for t in tasks]
    cells = [Cell(p, r) for p in PRESSES for r in RATIOS]
    engines = {d: Engine(lm, DecodeSettings(max_new_tokens=args.max_new_tokens, capture=False, draft=d))
               for d in (False, True)}
    engines[True].run(prompts[0], cells[:2]).raise_for_errors()  # warm-up
    times: dict[bool, list[float]] = {False: [], True: []}
    outs: dict[bool, list] = {}
    for _ in range(args.repeats):
        for d in (False, True):
            t0 = time.perf_counter()
            outs[d] = [engines[d].run(p, cells).raise_for_errors() for p in prompts]  # the full cache decoded both ways
            times[d].append(time.perf_counter() - t0)
    same = all(a.tokens == b.tokens for ra, rb in zip(outs[False], outs[True], strict=True)
               for a, b in zip(ra.outputs, rb.outputs, strict=True))
    inside = total = 0
    for r in outs[False]:
        assert r.full is not None
        for o in r.outputs:
            inside += agreed(o.tokens, r.full.tokens)
            total += len(o.tokens)
    ratio = statistics.median(times[True]) / statistics.median(times[False])
    lines = [
        "# Draft verification: the full cache's answer verified in one forward vs step-by-step decoding",
        "",
        f"Command: `python benchmarks/draft_speed.py --model {args.model} --instances {args.instances} "
        f"--tokens {args.tokens} --repeats {args.repeats} --max-new-tokens {args.max_new_tokens}`",
        f"Environment: {environment()}",
        f"{len(cells)} cells + the full cache per instance, {args.instances} `base` instances of "
        f"{', '.join(str(p.n_context) for p in prompts)} context tokens, answers only, greedy, "
        f"max_new_tokens={args.max_new_tokens}.",
        "",
        "| decoding | engine.run s, all instances (median, range) |",
        "|---|---|",
        f"| step by step (draft off, the default) | {median_spread(times[False])} |",
        f"| draft verified (draft on) | {median_spread(times[True])} |",
        "",
        f"Tokens equal in every cell: {'yes' if same else 'NO'}. Generated tokens inside the cell's agreed prefix with "
        f"the full answer (the most the draft can take over): {inside}/{total} ({inside / max(total, 1):.0%}).",
        f"Draft on / off: {ratio:.2f}× the time.",
    ]
    write(result_name("draft_speed", args), lines)
    print("\n".join(lines))
    return 0 if same else 1


if __name__ == "__main__":
    torch.set_grad_enabled(False)
    sys.exit(main())
