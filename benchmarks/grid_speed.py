"""A grid of (press, ratio) cells: kvroute's engine vs a loop over the kvpress pipeline, side by side.

(a) kvroute: one prefill per instance, every cell a KeepMask, all cells decoded in one batch.
(b) kvpress: `KVPressTextGenerationPipeline` called once per (instance, press, ratio) — how its
    own evaluation script runs a sweep.
Both answer the same prompts with the same model (float32, sdpa, greedy). Repeats alternate a and b;
the last lines are `speedup: X`, the median wall time of b over a for the largest grid, and `ratio to
ceiling: Y`, that speedup over the FLOP ceiling of the same grid (benchmarks/flops.py: what counting
forward FLOPs allows a masked engine whose cells attend their kept entries only). kvroute's FLOPs of the largest grid
over its median time are also set beside a float32 ``torch.mm`` peak measured in the same run (`fraction of peak: X`).

With ``--attention-backend NAME`` kvroute's engine runs that masked-attention backend (``decoding.attention_backend``;
default ``auto``); with ``--attention-backend each`` the largest grid runs once per available backend in the same
process (kvroute only, no kvpress loop), and the table gives each backend's time, fraction of peak, and whether its
answers equal ``auto``'s.

    python benchmarks/grid_speed.py [--model smollm2-135m] [--instances 2] [--tokens 512] [--repeats 3]
                                    [--attention-backend auto|NAME|each]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable

import torch
from common import environment, matmul_peak, median_spread, peak_fraction, write
from flops import CellWork, Shape, ceiling, grid_flops

PRESSES = ["snapkv", "expected_attention", "streaming_llm"]
RATIOS = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9]
GRIDS = [(1, [0.5]), (1, [0.25, 0.5, 0.75]), (3, [0.25, 0.5, 0.75]), (3, RATIOS)]


def grid_args(description: str, *, repeats: int = 3,
              more: Callable[[argparse.ArgumentParser], None] | None = None) -> argparse.Namespace:
    """The command line shared by grid_speed and profile_grid (they measure the same workload); ``more`` adds a
    script's own options."""
    ap = argparse.ArgumentParser(description=description)
    if more is not None:
        more(ap)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--instances", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=repeats)
    ap.add_argument("--max-new-tokens", type=int, default=24)
    ap.add_argument("--largest-only", action="store_true", help="only the 27-cell grid (long contexts: the kvpress "
                    "loop's time grows with every cell)")
    ap.add_argument("--no-study", action="store_true", help="skip the full-study timing (every metric on)")
    ap.add_argument("--attention-backend", default="auto", help='the masked attention\'s backend ("auto", a name of '
                    'kvroute.engine.attention.BACKENDS, or "each": the largest grid once per backend, as a table)')
    return ap.parse_args()


def is_default(args: argparse.Namespace, *, tokens: int = 512) -> bool:
    """Whether this is a benchmark's default run (SmolLM2 at ``tokens`` context tokens)."""
    return args.model == "smollm2-135m" and args.tokens == tokens


def result_name(name: str, args: argparse.Namespace, *, tokens: int = 512) -> str:
    """The results file of a run: ``name`` for the default one, else ``name_MODEL_TOKENS``."""
    return name if is_default(args, tokens=tokens) else f"{name}_{args.model}_{args.tokens}"


def grid_setup(args: argparse.Namespace, *, reference: bool = True):  # noqa: ANN201 - (lm, tasks, prompts, engine, pipeline)
    """Model, `base` instances and prompts, an answers-only engine and the kvpress pipeline, both warmed up
    (``reference=False``: no pipeline, None in its place)."""
    from kvroute.engine import Cell, DecodeSettings, Engine
    from kvroute.engine.reference import kvpress_answer, kvpress_pipeline
    from kvroute.models import load_model
    from kvroute.tasks import TaskSpec, build_prompt, generate_tasks

    lm = load_model(args.model, dtype="float32")
    tasks = generate_tasks(TaskSpec("base", n=args.instances, seed=11, target_tokens=args.tokens), lm.tokenizer)
    prompts = [build_prompt(lm.tokenizer, t) for t in tasks]
    backend = getattr(args, "attention_backend", "auto")
    engine = Engine(lm, DecodeSettings(max_new_tokens=args.max_new_tokens, capture=False,
                                       attention_backend="auto" if backend == "each" else backend))
    # warm-up both paths once
    engine.run(prompts[0], [Cell("snapkv", 0.5)], decode_full=False).raise_for_errors()
    if not reference:
        return lm, tasks, prompts, engine, None
    pipe = kvpress_pipeline(lm)
    kvpress_answer(lm, prompts[0].kvpress_context, prompts[0].kvpress_question, "snapkv", 0.5, max_new_tokens=4,
                   pipeline=pipe)
    return lm, tasks, prompts, engine, pipe


def kvroute_flops(lm, work: list) -> float:  # noqa: ANN001 - a loaded model
    """kvroute's forward FLOPs of one pass over ``work`` (per instance: T, Q, cells), benchmarks/flops.py."""
    shape = Shape.of(lm.model)
    return sum(grid_flops(shape, T, Q, cells)[0] for T, Q, cells in work)


def each_backend(args: argparse.Namespace) -> int:
    """The largest grid with every available attention backend in one process: a table."""
    from kvroute.engine import Cell, DecodeSettings, Engine
    from kvroute.engine.attention import BACKENDS, ran, ran_since

    lm, _tasks, prompts, _engine, _ = grid_setup(args, reference=False)
    peak = matmul_peak()
    cells = [Cell(p, r) for p in PRESSES for r in RATIOS]
    names = ["auto", *(n for n in BACKENDS.names() if BACKENDS.get(n).available().ok)]
    skipped = [f"{n} ({BACKENDS.get(n).available().reason})" for n in BACKENDS.names()
               if not BACKENDS.get(n).available().ok]
    engines = {n: Engine(lm, DecodeSettings(max_new_tokens=args.max_new_tokens, capture=False, attention_backend=n))
               for n in names}
    times: dict[str, list[float]] = {n: [] for n in names}
    answers: dict[str, list] = {}
    forwards: dict[str, dict[str, int]] = {}
    work: list = []
    for n in names:  # warm-up: builds, first calls
        engines[n].run(prompts[0], cells[:2], decode_full=False).raise_for_errors()
    print(f"peak {peak / 1e9:.1f} GFLOP/s; backends {', '.join(names)}", flush=True)
    for rep in range(args.repeats):
        for n in names:  # interleaved, so that a slower minute of the machine falls on every backend alike
            before = ran()
            t0 = time.perf_counter()
            outs = [engines[n].run(p, cells, decode_full=False).raise_for_errors().outputs for p in prompts]
            times[n].append(time.perf_counter() - t0)
            print(f"{n}: {times[n][-1]:.2f} s", flush=True)
            if rep == 0:
                answers[n] = [[o.tokens for o in row] for row in outs]
                forwards[n] = ran_since(before)
                work = work or [(p.n_context, len(p.question_ids), [CellWork(c.ratio, len(o.tokens)) for c, o in
                                                                    zip(cells, row, strict=True)])
                                for p, row in zip(prompts, outs, strict=True)]
    peak = max(peak, matmul_peak())
    flops = kvroute_flops(lm, work)
    lines = [
        f"# Grid speed per attention backend ({lm.name}, {args.tokens} context tokens)", "",
        f"Command: `python benchmarks/grid_speed.py --model {args.model} --instances {args.instances} "
        f"--tokens {args.tokens} --repeats {args.repeats} --max-new-tokens {args.max_new_tokens} "
        "--attention-backend each`",
        f"Environment: {environment()}",
        f"The largest grid ({len(cells)} cells × {args.instances} `base` instances, captures off), kvroute only, each "
        "backend named by `decoding.attention_backend` (it runs every forward it serves; the `auto` rule the rest), "
        f"repeats interleaved. Forward FLOPs counted: {flops / 1e12:.3f} TFLOP; float32 torch.mm peak measured in "
        f"this run: {peak / 1e9:.1f} GFLOP/s." + (f" Not available here: {'; '.join(skipped)}." if skipped else ""),
        "",
        "| backend | seconds (median, range) | GFLOP/s | fraction of peak | answers = auto's | forwards per backend |",
        "|---|---|---|---|---|---|",
    ]
    for n in names:
        med = statistics.median(times[n])
        ran_str = ", ".join(f"{k} {v}" for k, v in forwards[n].items())
        lines.append(f"| {n} | {median_spread(times[n])} | {flops / med / 1e9:.1f} | {flops / med / peak:.2f} "
                     f"| {'yes' if answers[n] == answers['auto'] else 'no'} | {ran_str} |")
    write(result_name("grid_speed_backends", args), lines)
    print("\n".join(lines))
    return 0


def main() -> int:
    args = grid_args(__doc__.splitlines()[0])
    if args.attention_backend == "each":
        return each_backend(args)

    from kvroute.engine import Cell, Engine
    from kvroute.engine.reference import kvpress_answer
    from kvroute.runner import RunSettings, run_instance

    lm, tasks, prompts, engine, pipe = grid_setup(args)
    peak = matmul_peak()

    from kvroute.engine.attention import ran, ran_since, resolve_backend
    from kvroute.engine.attention.kept import kernel

    rows = []
    agree = total = 0
    work: list = []  # the largest grid's (T, Q, cells) per instance, for the FLOP ceiling
    forwards: dict[str, int] = {}  # the largest grid's layer forwards per attention backend (first repeat)
    for n_press, ratios in GRIDS[-1:] if args.largest_only else GRIDS:
        cells = [Cell(p, r) for p in PRESSES[:n_press] for r in ratios]
        ta, tb = [], []
        for rep in range(args.repeats):
            before = ran()
            t0 = time.perf_counter()
            ours = [engine.run(p, cells, decode_full=False).raise_for_errors().outputs for p in prompts]
            ta.append(time.perf_counter() - t0)
            forwards = ran_since(before) if rep == 0 else forwards
            t0 = time.perf_counter()
            ref = [[kvpress_answer(lm, p.kvpress_context, p.kvpress_question, c.press, c.ratio,
                                   max_new_tokens=args.max_new_tokens, pipeline=pipe) for c in cells] for p in prompts]
            tb.append(time.perf_counter() - t0)
            if rep == 0:
                work = [(p.n_context, len(p.question_ids),
                         [CellWork(c.ratio, len(o.tokens)) for c, o in zip(cells, o_row, strict=True)])
                        for p, o_row in zip(prompts, ours, strict=True)]
                for o_row, r_row in zip(ours, ref, strict=True):
                    for o, r in zip(o_row, r_row, strict=True):
                        agree += o.text == r
                        total += 1
        rows.append((len(cells), ta, tb))
        print(f"{len(cells):>3} cells: kvroute {statistics.median(ta):.2f} s, kvpress {statistics.median(tb):.2f} s, "
              f"speedup {statistics.median(tb) / statistics.median(ta):.1f}x", flush=True)

    # the full study path (metrics on) for the largest grid, for the record
    tm: list[float] = []
    settings = RunSettings(max_new_tokens=args.max_new_tokens)
    full_engine = Engine(lm, settings.decode_settings())
    cells = [Cell(p, r) for p in PRESSES for r in RATIOS]
    for _ in range(0 if args.no_study else args.repeats):
        t0 = time.perf_counter()
        for t in tasks:
            run_instance(full_engine, t, cells, settings=settings)
        tm.append(time.perf_counter() - t0)

    n_big, ta_big, tb_big = rows[-1]
    speedup = statistics.median(tb_big) / statistics.median(ta_big)
    bound = ceiling(Shape.of(lm.model), work)
    peak = max(peak, matmul_peak())  # the better of before and after: a busy minute of the machine counts against it
    fraction = peak_fraction(kvroute_flops(lm, work), statistics.median(ta_big), peak)
    default = is_default(args)
    lines = [
        "# Grid speed: kvroute engine vs the kvpress pipeline" + ("" if default else f" ({args.model}, {args.tokens} "
                                                                 "context tokens)"),
        "",
        f"Command: `python benchmarks/grid_speed.py --model {args.model} --instances {args.instances} "
        f"--tokens {args.tokens} --repeats {args.repeats} --max-new-tokens {args.max_new_tokens}"
        + (f" --attention-backend {args.attention_backend}" if args.attention_backend != "auto" else "")
        + (" --largest-only" if args.largest_only else "") + (" --no-study" if args.no_study else "") + "`",
        f"Environment: {environment()}",
        f"Model {lm.name} (float32, sdpa), {args.instances} `base` instances of ~{args.tokens} context tokens "
        f"(measured: {', '.join(str(p.n_context) for p in prompts)}), greedy, max_new_tokens={args.max_new_tokens}; "
        f"presses {', '.join(PRESSES)}.",
        f"Masked attention: `{args.attention_backend}`; layer forwards per backend on the largest grid: "
        + (", ".join(f"{n} {k}" for n, k in forwards.items()) or "none")
        + "; the kept-entries kernel " + ("switched off (KVROUTE_KEPT_KERNEL=0)" if not resolve_backend().kept else
                                          "built" if kernel() is not None else "not built") + " here.",
        "",
        "| cells per instance | kvroute s (median, range) | kvpress loop s (median, range) | speedup |",
        "|---|---|---|---|",
        *[f"| {n} | {median_spread(a)} | {median_spread(b)} | {statistics.median(b) / statistics.median(a):.1f}× |"
          for n, a, b in rows],
        "",
        (f"With every routing metric and capture on (`run_instance`, {n_big} cells): {median_spread(tm)} s "
         f"for the same {args.instances} instances." if tm else "The full-study timing was skipped (--no-study)."),
        f"Answers agree on {agree}/{total} (instance, cell) pairs.",
        "",
        "Goal: at least 10× at 27 cells. " + (f"Met ({speedup:.1f}×)." if speedup >= 10 else
            f"Missed by {100 * (1 - speedup / 10):.0f}% ({speedup:.1f}× of 10×); "
            "profile_grid shows where the time goes."),
        "",
        f"FLOP ceiling at {n_big} cells: {bound:.1f}× (benchmarks/flops.py: the context prefilled once against once "
        "per cell, each cell's question and answer attending its kept entries only); kvroute reaches "
        f"{speedup / bound:.3f} of it (goal ≥ 0.9: {'met' if speedup / bound >= 0.9 else 'not met'})."
        + (" Above 1: the kvpress loop also pays costs that are not FLOPs (a pipeline call per cell, and each cell's "
           "answer decoded step by step at batch 1, where a step costs more per token than a batched one; see "
           "profile_grid), which kvroute's batched cells share." if speedup > bound else ""),
        "",
        f"kvroute at {n_big} cells: {fraction}.",
        "",
        f"speedup: {speedup:.1f}",
        f"ratio to ceiling: {speedup / bound:.3f}",
    ]
    write(result_name("grid_speed", args), lines)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    torch.set_grad_enabled(False)
    sys.exit(main())
