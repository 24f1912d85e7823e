"""Peak memory of a 64-cell decode against context length: the one-shot masked attention vs the planned one.

Each (length, mode) runs in a fresh process: load the model, prefill a random-token context of the
given length once (kvroute's prefill, no scorer), hand the heap's free pages back (malloc_trim: what the
allocator kept from the prefill would otherwise be reused unseen), reset the peak-RSS counter
(/proc/self/clear_refs), then decode 64 cells (random keep masks at ratios 0.01…0.64) for a question of
`--question` tokens plus one generated token, and read the growth of the peak RSS (VmHWM) over the resident size
before the decode. The children run with glibc's mmap threshold fixed (common.PEAK_ONLY_ENV: every block of
128 KB or more mapped and returned when freed), so the peak follows the live tensors, not the heap's fragments; this
costs them time, so the seconds column is not a speed measurement. Each row runs `--repeats` times, a fresh process
each; the table gives the median and range. Modes:

- `one-shot`: every forward over the whole context at once, masked (`gather = false`, the kept-entries kernel off; in
  the explicit form, float32
  scores and probabilities [Hkv, B, G·q, T + s] per layer, the "would need" column; where PyTorch's fused CPU
  kernel runs, kvroute.engine.attention.streaming, they are never materialised); run at the first question length, up to
  `--one-shot-max`;
- `planned`: the defaults: where the kept-entries kernel is built (kvroute.engine.attention.kept, loaded before the
  measurement starts), every forward through it (each cell's kept entries, no transient copy; its CSR index cached
  per layer); else the question forward over each cell's kept entries (kvroute.engine.attention.gather, in slices of
  at most the budget and GATHER_SLICE_BYTES), the decode steps at once or in chunks of the context past the budget
  (kvroute.engine.attention.streaming); the budget is a quarter of the free memory, or `--budget-mb`.

Both modes give the same tokens (checked here on every length both run). The table also gives the
memory the one-shot form would need per forward (`one_shot_bytes`) and the context K/V of the prefill;
the last lines fit the planned peak against context length (its slope in MB per MB of context K/V) per
question length. The cells' own K/V (64 cells × their question and generated tokens: state a pruned cache holds
as well) is given beside the peak: it grows with the question, not with the context.

    python benchmarks/attention_memory.py [--model smollm2-135m] [--lengths 512 2048 8192 16384] [--questions 50 200]
        [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys

from common import MEMORY_PROBE, PEAK_ONLY_ENV, environment, run_child, write

CHILD = MEMORY_PROBE + r"""
import json, sys, time
import torch
from kvroute.models import load_model
from kvroute.engine.decode import DecodeSettings, decode_cells
from kvroute.engine.prefill import prefill
from kvroute.presses import KeepMask

model_name, n, q, mode, budget_mb = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], float(sys.argv[5])
torch.set_num_threads(2)
lm = load_model(model_name, device="cpu", dtype="float32")
g = torch.Generator().manual_seed(0)
ids = torch.randint(100, lm.tokenizer.vocab_size - 100, (n + q,), generator=g).tolist()
pre = prefill(lm.model, ids[:n], [])
L, Hkv, T = len(pre.keys), pre.keys[0].shape[1], n
masks = [KeepMask(torch.rand(L, Hkv, T, generator=g) >= r, "random", r) for r in [0.01 * (i + 1) for i in range(64)]]
budget = None if mode == "planned" and budget_mb <= 0 else (1 << 60 if mode == "one-shot" else int(budget_mb * 2**20))
settings = DecodeSettings(max_new_tokens=2, batch_size=64, capture=False, attention_memory=budget,
                          gather=mode != "one-shot")
from kvroute.engine.attention import kept
kept.ENABLED = kept.ENABLED and mode != "one-shot"  # (KVROUTE_KEPT_KERNEL=0: off in both)
kept.kernel()  # built or loaded before the measurement (its code is not the decode's memory)

base = baseline()
t0 = time.perf_counter()
outs = decode_cells(lm.model, None, pre, ids[n:], masks, settings=settings)
seconds = time.perf_counter() - t0
kv_mb = sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in zip(pre.keys, pre.values)) / 2**20
own_mb = kv_mb / n * 64 * (q + 2)  # the cells' own K/V: their question and generated tokens (a pruned cache holds them)
print(json.dumps({"peak_mb": status("VmHWM") - base, "seconds": seconds, "kv_mb": kv_mb, "own_mb": own_mb,
                  "tokens": [o.tokens for o in outs]}))
"""


def _slope(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of y on x."""
    mx = sum(x for x, _ in points) / len(points)
    my = sum(y for _, y in points) / len(points)
    sxx = sum((x - mx) ** 2 for x, _ in points)
    return sum((x - mx) * (y - my) for x, y in points) / sxx if sxx else float("nan")


def _summary(runs: list[dict]) -> dict:
    """One row's runs → the median peak and seconds, the peak's range, and the (shared) sizes."""
    peaks = [r["peak_mb"] for r in runs]
    return {**runs[0], "peak_mb": statistics.median(peaks), "lo": min(peaks), "hi": max(peaks), "n": len(peaks),
            "seconds": statistics.median(r["seconds"] for r in runs)}


def _cell(r: dict) -> str:
    """A peak cell: the median MB, its range over the runs where there are several, and the median seconds."""
    spread = f" [{r['lo']:.0f}–{r['hi']:.0f}]" if r["n"] > 1 else ""
    return f"{r['peak_mb']:.0f}{spread} ({r['seconds']:.1f})"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--lengths", type=int, nargs="+", default=[512, 2048, 8192, 16384])
    ap.add_argument("--questions", type=int, nargs="+", default=[50, 200], help="question tokens decoded per cell")
    ap.add_argument("--one-shot-max", type=int, default=8192, help="longest context run in one shot")
    ap.add_argument("--budget-mb", type=float, default=0, help="the planned mode's budget (0: the default)")
    ap.add_argument("--repeats", type=int, default=3, help="fresh processes per row (the table gives the median)")
    ap.add_argument("--out", default="attention_memory", help="the results file: results/OUT.md")
    args = ap.parse_args()
    import torch

    from kvroute.engine.attention.gather import GATHER_SLICE_BYTES
    from kvroute.engine.attention.kept import KEPT_MAX_ROWS
    from kvroute.engine.attention.streaming import attention_budget, one_shot_bytes
    from kvroute.models import load_model

    lm = load_model(args.model)  # pull once, outside the measured children
    config = getattr(lm.model.config, "text_config", lm.model.config)
    H = config.num_attention_heads
    budget = int(args.budget_mb * 2**20) if args.budget_mb > 0 else attention_budget(torch.device("cpu"))
    rows = []
    for question in args.questions:
        for n in args.lengths:
            q = question + 1  # the question forward: the question's tokens (no gold here)
            need = one_shot_bytes(64, H, q, n + q)
            res = {}
            # the one-shot form at the first question length only (it is the reference the planned one replaces)
            first = question == args.questions[0] and n <= args.one_shot_max
            modes = ("one-shot", "planned") if first else ("planned",)
            for _ in range(args.repeats):
                for mode in modes:  # the modes alternate, so that drift over the run touches both alike
                    r = run_child(CHILD, args.model, str(n), str(question), mode, str(args.budget_mb),
                                  env=PEAK_ONLY_ENV)
                    res.setdefault(mode, []).append(r)
                    print(f"{n:>6} q={question} {mode:<9} peak +{r['peak_mb']:.0f} MB in {r['seconds']:.1f} s",
                          flush=True)
            tokens = {m: {str(r["tokens"]) for r in rs} for m, rs in res.items()}
            same = "yes" if len(set().union(*tokens.values())) == 1 else "NO"
            res = {m: _summary(rs) for m, rs in res.items()}
            rows.append((n, question, need, res, same))
    lines = [
        "# Masked attention memory: a 64-cell decode against context length",
        "",
        f"Command: `python benchmarks/attention_memory.py --model {args.model} --lengths "
        f"{' '.join(map(str, args.lengths))} --questions {' '.join(map(str, args.questions))} --one-shot-max "
        f"{args.one_shot_max}" + (f" --budget-mb {args.budget_mb:g}" if args.budget_mb > 0 else "")
        + (f" --repeats {args.repeats}" if args.repeats != 3 else "")
        + (f" --out {args.out}" if args.out != "attention_memory" else "") + "`",
        f"Environment: {environment()}",
        "64 cells (random keep masks at ratios 0.01…0.64), a question of the given length and one generated token, "
        f"capture off, a fresh process per run, {args.repeats} run(s) per row (median, range); peak = growth of the "
        "decode process's peak RSS over its resident size after the prefill, the heap's free pages handed back first "
        "(malloc_trim), glibc's mmap threshold fixed at 128 KB (blocks from 128 KB up mapped and returned when freed, "
        "so the peak follows the live tensors; the seconds are not a speed measurement). One-shot: every forward "
        "over all T context keys at once, masked (`gather = false`, no budget, the kept-entries kernel off). Planned: "
        "the defaults — where the kept-entries kernel is built, every forward of at most "
        f"{KEPT_MAX_ROWS} query rows per (KV head, cell) through it; else the question forward over each cell's kept "
        "entries (gathered, in slices of "
        f"at most the budget and {GATHER_SLICE_BYTES / 2**20:.0f} MB), decode steps at once or in chunks past the "
        f"budget ({budget / 2**30:.1f} GiB, "
        f"{'given' if args.budget_mb > 0 else 'a quarter of the free memory'}).",
        "",
        "| context tokens | question tokens | context K/V MB | cells' own K/V MB | one-shot would need per forward "
        "| one-shot peak MB [range] (s) | planned peak MB [range] (s) | same tokens |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for n, question, need, res, same in rows:
        kv = next(iter(res.values()))["kv_mb"]
        one = res.get("one-shot")
        one_s = _cell(one) if one else "— (not run)"
        pl = res["planned"]
        own = next(iter(res.values()))["own_mb"]
        lines.append(f"| {n} | {question} | {kv:.0f} | {own:.0f} | {need / 2**20:.0f} MB | {one_s} "
                     f"| {_cell(pl)} | {same} |")
    lines.append("")
    for question in args.questions:
        pts = [(res["planned"]["kv_mb"], res["planned"]["peak_mb"]) for n, qq, _, res, _ in rows if qq == question]
        per_k = _slope([(n / 1000, res["planned"]["peak_mb"]) for n, qq, _, res, _ in rows if qq == question])
        lines.append(f"Planned peak with a {question}-token question: {per_k:.1f} MB more per 1,000 context tokens, "
                     f"{_slope(pts):.2f} MB per MB of context K/V (least squares over {len(pts)} lengths).")
    if len(args.questions) > 1:
        top = max(args.lengths)
        peaks = {qq: res["planned"]["peak_mb"] for n, qq, _, res, _ in rows if n == top}
        lines.append(f"At {top} tokens: " + ", ".join(f"{peaks[qq]:.0f} MB with a {qq}-token question"
                                                      for qq in args.questions) + ".")
    both = [(n, res) for n, _, _, res, _ in rows if "one-shot" in res]
    if both:
        n, res = both[-1]
        one, pl = res["one-shot"]["peak_mb"], res["planned"]["peak_mb"]
        lines.append(f"At {n} tokens the planned decode's peak grows by {pl:.0f} MB against {one:.0f} MB in one shot "
                     f"(one-shot / planned: {one / pl:.2f}); tokens equal at every length both ran: "
                     f"{'yes' if all(r[4] == 'yes' for r in rows) else 'NO'}.")
    write(args.out, lines)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
