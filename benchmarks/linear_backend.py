"""Linear layers at decode sizes: PyTorch's default float32 CPU linear vs oneDNN's, side by side.

(a) Each weight shape of the model, at the row counts a decode forward has (1 row: kvpress's batch-1
    steps; 8–64: kvroute's batched cells; more: a question forward), every layer's matrix in turn (so
    the weights come from memory, as in a forward): median ms per matmul, default vs oneDNN.
(b) The 27-cell grid's decoding (`Engine` with `capture=False`, the full cache skipped, as grid_speed),
    from one prefill: the default linear throughout, oneDNN throughout, and kvroute.engine.linear's rule
    (oneDNN up to LARGE_ROWS rows, larger forwards by the CPU's vendor), alternating: median seconds, and
    whether every cell's tokens are equal.
(c) One kvpress pipeline call (SnapKV 0.5) with the model's linear layers switched the same way, for
    how much of (b)'s gain a loop over kvpress would also get from the library (kvroute never switches
    the reference: grid_speed times kvpress as it runs).

    python benchmarks/linear_backend.py [--model smollm2-135m] [--tokens 2048] [--repeats 5]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from common import environment, median_spread, write
from grid_speed import PRESSES, RATIOS, is_default, result_name

ROWS = [1, 8, 27, 64, 256, 1269]


def timed(fn, repeats: int) -> list[float]:  # noqa: ANN001
    fn()
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--max-new-tokens", type=int, default=24)
    args = ap.parse_args()

    from torch import nn

    from kvroute.engine import Cell, DecodeSettings, Engine
    from kvroute.engine import linear as linear_mod
    from kvroute.engine.linear import _forward, onednn_available, onednn_linear
    from kvroute.engine.reference import kvpress_answer, kvpress_pipeline
    from kvroute.models import load_model
    from kvroute.tasks import TaskSpec, build_prompt, generate_tasks

    if not onednn_available():
        print("this PyTorch build has no oneDNN linear on the CPU: nothing to compare")
        return 1
    lm = load_model(args.model, dtype="float32")
    model = lm.model

    # (a) per shape and row count
    shapes: dict[tuple[int, int], list[nn.Linear]] = {}
    for m in model.modules():
        if type(m) is nn.Linear:
            shapes.setdefault(tuple(m.weight.shape), []).append(m)
    table = []
    large = linear_mod.linear_rule()[1]
    with torch.inference_mode():
        for (n_out, n_in), layers in sorted(shapes.items(), key=lambda kv: -kv[0][0] * kv[0][1]):
            for rows in ROWS:
                x = torch.randn(rows, n_in)
                n = len(layers)
                reps = max(3, min(args.repeats * 3, 200 // n))
                default = statistics.median(timed(lambda x=x, layers=layers: [
                    nn.functional.linear(x, m.weight, m.bias) for m in layers], reps)) / n
                fast = statistics.median(timed(lambda x=x, layers=layers: [_forward(m, x, large=large) for m in layers],
                                               reps)) / n  # what kvroute.engine.linear runs
                table.append((n_out, n_in, n, rows, default * 1e3, fast * 1e3))
                print(f"{n_out}x{n_in} rows {rows}: default {default * 1e3:.3f} ms, oneDNN {fast * 1e3:.3f} ms",
                      flush=True)

    # (b) the grid's decoding, one prefill, on and off alternating
    task = generate_tasks(TaskSpec("base", n=1, seed=11, target_tokens=args.tokens), lm.tokenizer)[0]
    prompt = build_prompt(lm.tokenizer, task)
    engine = Engine(lm, DecodeSettings(max_new_tokens=args.max_new_tokens, capture=False))
    cells = [Cell(p, r) for p in PRESSES for r in RATIOS]
    res = engine.run(prompt, cells, decode_full=False).raise_for_errors()
    q_ids = list(prompt.question_ids)
    # default throughout, oneDNN throughout, and kvroute's rule (oneDNN up to LARGE_ROWS rows, above by CPU vendor)
    arms = {"default": (False, False), "oneDNN": (True, True), "rule": (True, linear_mod.linear_rule()[1])}
    times: dict[str, list[float]] = {a: [] for a in arms}
    tokens: dict[str, list[list[int]]] = {}
    saved = linear_mod.ONEDNN, linear_mod.ONEDNN_LARGE
    try:
        for rep in range(args.repeats + 1):
            for arm, (on, large) in arms.items():
                linear_mod.ONEDNN, linear_mod.ONEDNN_LARGE = on, large
                t0 = time.perf_counter()
                outs = engine._decode(res.prefill, q_ids, [m for m in res.masks if m is not None])
                if rep:  # the first round warms up
                    times[arm].append(time.perf_counter() - t0)
                tokens[arm] = [o.tokens for o in outs]
    finally:
        linear_mod.ONEDNN, linear_mod.ONEDNN_LARGE = saved
    equal = tokens["oneDNN"] == tokens["default"] == tokens["rule"]

    # (c) one kvpress call with the model's linear layers switched the same way
    pipe = kvpress_pipeline(lm)
    kv: dict[bool, list[float]] = {True: [], False: []}
    answers: dict[bool, str] = {}
    for rep in range(args.repeats + 1):
        for on in (False, True):
            with onednn_linear(model, enabled=on):
                t0 = time.perf_counter()
                answers[on] = kvpress_answer(lm, prompt.kvpress_context, prompt.kvpress_question, "snapkv", 0.5,
                                             max_new_tokens=args.max_new_tokens, pipeline=pipe)
                if rep:
                    kv[on].append(time.perf_counter() - t0)

    dec = statistics.median(times["default"]) / statistics.median(times["oneDNN"])
    rule = statistics.median(times["default"]) / statistics.median(times["rule"])
    vendor = "oneDNN" if linear_mod.linear_rule()[1] else "the default"
    kvp = statistics.median(kv[False]) / statistics.median(kv[True])
    default = is_default(args, tokens=2048)
    lines = [
        "# Linear layers at decode sizes: PyTorch's default float32 CPU linear vs oneDNN"
        + ("" if default else f" ({args.model}, {args.tokens} context tokens)"),
        "",
        f"Command: `python benchmarks/linear_backend.py --model {args.model} --tokens {args.tokens} "
        f"--repeats {args.repeats} --max-new-tokens {args.max_new_tokens}`",
        f"Environment: {environment()}",
        f"Model {lm.name} (float32). Default: `torch.nn.functional.linear` (BLAS sgemm); oneDNN: "
        "`torch.ops.mkldnn._linear_pointwise` on the same dense weights (kvroute.engine.linear, the decode "
        "forwards only).",
        "",
        "| weight (out × in) | layers | rows | default ms | oneDNN ms | default / oneDNN |",
        "|---|---|---|---|---|---|",
        *[f"| {o} × {i} | {n} | {r} | {a:.3f} | {b:.3f} | {a / b:.2f}× |" for o, i, n, r, a, b in table],
        "",
        f"The 27-cell grid's decoding ({len(prompt.context_ids)}-token `base` instance, one prefill, answers only, "
        f"max_new_tokens={args.max_new_tokens}; the question forward's {len(q_ids)} queries × 27 cells are one "
        f"large forward): default throughout {median_spread(times['default'])} s, oneDNN throughout "
        f"{median_spread(times['oneDNN'])} s (**{dec:.2f}×**), kvroute's rule (oneDNN up to "
        f"{linear_mod.LARGE_ROWS} rows, larger forwards through {vendor} on this CPU) "
        f"{median_spread(times['rule'])} s (**{rule:.2f}×**). Tokens equal in every cell, all three: "
        f"{'yes' if equal else 'NO'}.",
        "",
        f"One kvpress pipeline call (SnapKV 0.5, same prompt) with the model's linear layers switched the same way "
        f"(prefill included): default {median_spread(kv[False])} s, oneDNN {median_spread(kv[True])} s: "
        f"{kvp:.2f}×; answers equal: {'yes' if answers[True] == answers[False] else 'no'}. kvroute does not switch "
        "the reference: grid_speed times the kvpress loop as it runs, so this is how much of the gain a kvpress "
        "loop could also have.",
        "",
        f"decode speedup: {dec:.2f}",
        f"decode speedup with kvroute's rule: {rule:.2f}",
    ]
    write(result_name("linear_backend", args, tokens=2048), lines)
    print("\n".join(lines))
    return 0 if equal else 1


if __name__ == "__main__":
    raise SystemExit(main())
