"""The masked attention's forms side by side: one-shot, chunked (online softmax), gathered and the kept-entries kernel.

One layer's masked attention for the cells of the grid_speed grid (3 presses × 9 ratios 0.1…0.9: each cell keeps exactly
(1 − α)·T context entries per KV head, at random positions) with the model's head shapes, at several context lengths and
numbers of queries per cell (1: a decode step; the question forward has ~47 on the `base` task). Every form is timed on
the same random tensors, repeats interleaved; the gathered form's time includes its gather (it gathers per forward). The
table shows the median milliseconds per layer and, per row, the gathered form against the one-shot one; the last lines
say from how many queries per cell the gathered form is the faster at every length, which is what
``kvroute.engine.attention.gather.GATHER_MIN_QUERIES`` is set from. The FLOPs of the score and value products are
counted too (the gathered form's over the kept entries only). Where PyTorch's fused CPU attention kernel is present
(``kvroute.engine.attention.streaming.FUSED``), the one-shot and gathered forms use it, and the same two forms are also
timed with it off (explicit scores, softmax and values), side by side. Where the kept-entries kernel is built
(``kvroute.engine.attention.kept``: C++, each (KV head, cell) over its kept positions, no gather), it is timed too, its
suffix joined as the fused kernel's, its CSR index built once outside the timing (the engine builds it once per layer
and batch); the last lines say up to how many query rows per (KV head, cell) it is the fastest form at every length,
which is what ``kvroute.engine.attention.kept.KEPT_MAX_ROWS`` is set from.

    python benchmarks/attention_kernels.py [--model smollm2-135m] [--lengths 512 2048 8192] [--queries 1 4 8 16 47 100]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from functools import partial

import torch
from common import environment, matmul_peak, peak_fraction, write

PRESSES = 3
RATIOS = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--lengths", type=int, nargs="+", default=[512, 2048, 8192])
    ap.add_argument("--queries", type=int, nargs="+", default=[1, 4, 8, 16, 47, 100])
    ap.add_argument("--chunk", type=int, default=512, help="the chunked form's context chunk")
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()

    from kvroute.engine.attention import BACKENDS, AttentionCall, MaskedContext, streaming
    from kvroute.engine.attention.gather import GATHER_MIN_QUERIES, gathered_context_attention
    from kvroute.engine.attention.kept import KEPT_MAX_ROWS, kept_available, kept_context, kept_index
    from kvroute.engine.attention.streaming import chunked_context_attention, keep_bias, suffix_scores, with_suffix
    from kvroute.models import load_model

    fused = streaming.FUSED

    def explicit(f):  # noqa: ANN001, ANN202 - a form with the fused kernel turned off for the call
        streaming.FUSED = False
        try:
            return f()
        finally:
            streaming.FUSED = fused

    model = load_model(args.model, dtype="float32").model
    config = getattr(model.config, "text_config", model.config)
    del model
    H = config.num_attention_heads
    Hkv = getattr(config, "num_key_value_heads", None) or H
    D = getattr(config, "head_dim", None) or config.hidden_size // H
    G = H // Hkv
    ratios = [r for _ in range(PRESSES) for r in RATIOS]
    B = len(ratios)
    g = torch.Generator().manual_seed(0)
    def kernel(qg, k_ctx, v_ctx, offsets, index, empty, key, value, q):  # noqa: ANN001, ANN202, PLR0913
        """The kept-entries kernel, the suffix joined."""
        o, lse = kept_context(qg, k_ctx, v_ctx, offsets, index, scale=D**-0.5)
        return with_suffix(o, lse, empty, suffix_scores(qg, key, q, D**-0.5), value.transpose(0, 1), qg.dtype)

    def one_shot(call):  # noqa: ANN001, ANN202 - the one-shot form: the fused backend where it serves, else reference
        fused_backend = BACKENDS.get("fused")
        return (fused_backend if call.T and fused_backend.serves(call) else BACKENDS.get("reference")).forward(call)

    peak = matmul_peak()
    rows, faster, kernel_best = [], {}, {}
    has_kernel = kept_available(torch.zeros(1, D), 1)
    for T in args.lengths:
        k_ctx, v_ctx = torch.randn(Hkv, T, D, generator=g), torch.randn(Hkv, T, D, generator=g)
        keep = torch.zeros(Hkv, B, 1, T, dtype=torch.bool)
        for b, r in enumerate(ratios):
            for h in range(Hkv):
                keep[h, b, 0, torch.randperm(T, generator=g)[: int(T * (1 - r))]] = True
        kept = int(keep.sum())
        bias = keep_bias(keep, torch.float32)  # the engine builds it once per layer and batch, for every step
        offsets, index = kept_index(keep[:, :, 0])  # (so is the kept-entries kernel's index)
        empty = ~keep[:, :, 0].any(-1, keepdim=True)

        for q in args.queries:
            s = q + 10  # the suffix: the question so far and the query positions
            qg = torch.randn(B, Hkv, G * q, D, generator=g)
            key, value = torch.randn(B, Hkv, s, D, generator=g), torch.randn(B, Hkv, s, D, generator=g)
            forms = {
                # (MaskedContext holds keep as [B, L, Hkv, T]: here one layer)
                "one-shot": partial(one_shot, AttentionCall(
                    MaskedContext([k_ctx[None]], [v_ctx[None]], keep[:, :, 0].transpose(0, 1)[:, None], None), 0, qg,
                    k_ctx, v_ctx, key, value, q, D**-0.5, None)),
                "chunked": partial(chunked_context_attention, qg, k_ctx, v_ctx, bias, key, value, q=q, scale=D**-0.5,
                                   chunk=args.chunk),
                "gathered": partial(gathered_context_attention, qg, k_ctx, v_ctx, keep, key, value, q=q,
                                    scale=D**-0.5),
            }
            if fused:  # the same two forms with the fused kernel off
                forms["one-shot explicit"] = partial(explicit, forms["one-shot"])
                forms["gathered explicit"] = partial(explicit, forms["gathered"])
            if has_kernel:
                forms["kept kernel"] = partial(kernel, qg, k_ctx, v_ctx, offsets, index, empty, key, value, q)
            if Hkv * B * G * q * (T + B * s) <= 2**28:  # the sdpa backend's boolean mask, at most 256 MB
                forms["sdpa"] = partial(BACKENDS.get("sdpa").forward, forms["one-shot"].args[0])
            times: dict[str, list[float]] = {k: [] for k in forms}
            for f in forms.values():
                f()  # warm-up
            for _ in range(args.repeats):
                for name, f in forms.items():
                    t0 = time.perf_counter()
                    f()
                    times[name].append(time.perf_counter() - t0)
            ref = forms["one-shot"]()
            diff = max(float((f() - ref).abs().max()) for n, f in forms.items() if n != "one-shot")
            med = {k: 1000 * statistics.median(v) for k, v in times.items()}
            full_flops, kept_flops = 4 * B * G * q * T * D * Hkv, 4 * G * q * kept * D
            rows.append((T, q, med, full_flops, kept_flops, diff))
            faster[(T, q)] = med["gathered"] < med["one-shot"]
            if has_kernel:
                kernel_best[(T, q)] = med["kept kernel"] < min(med["one-shot"], med["chunked"], med["gathered"])
            print(f"T={T} q={q}: " + ", ".join(f"{k} {v:.2f} ms" for k, v in med.items()), flush=True)
    peak = max(peak, matmul_peak())
    # the kept entries' FLOPs (what a pruned cache multiplies) over the fastest form's time, against the matmul peak
    fractions = [kf / (min(m.values()) / 1000) / peak for _, _, m, _, kf, _ in rows]
    qs = sorted(args.queries)
    from_q = next((q for q in qs if all(faster[(T, q2)] for T in args.lengths for q2 in qs if q2 >= q)), None)
    # the most query rows (G·q) up to which the kernel is the fastest form at every length and query count
    up_to = max((G * q for q in qs if all(kernel_best.get((T, q2)) for T in args.lengths for q2 in qs if q2 <= q)),
                default=None)
    lines = [
        "# Masked attention kernels: one-shot, chunked and gathered, per layer",
        "",
        f"Command: `python benchmarks/attention_kernels.py --model {args.model} --lengths "
        f"{' '.join(map(str, args.lengths))} --queries {' '.join(map(str, args.queries))} --chunk {args.chunk} "
        f"--repeats {args.repeats}`",
        f"Environment: {environment()}",
        f"{args.model}'s attention shapes ({H} query heads, {Hkv} KV heads, head dim {D}), float32; {B} cells "
        f"({PRESSES} presses × ratios 0.1…0.9, each keeping exactly (1 − α)·T entries per KV head at random "
        f"positions); a suffix of q + 10 positions; median of {args.repeats} interleaved repeats. GFLOP: the score "
        "and value products (the gathered form's over the kept entries only).",
        "",
        "| context T | queries per cell | one-shot ms | chunked ms | gathered ms (with its gather) "
        "| gathered / one-shot | GFLOP all T | GFLOP kept | largest difference from one-shot |"
        + (" one-shot explicit ms | gathered explicit ms |" if fused else "")
        + (" kept kernel ms | kept kernel / fastest other |" if has_kernel else "")
        + " sdpa ms | fastest form: fraction of peak (GFLOP kept) |",
        "|---|---|---|---|---|---|---|---|---|" + ("---|---|" if fused else "") + ("---|---|" if has_kernel else "")
        + "---|---|",
        *[f"| {T} | {q} | {m['one-shot']:.2f} | {m['chunked']:.2f} | {m['gathered']:.2f} | "
          f"{m['gathered'] / m['one-shot']:.2f} | {ff / 1e9:.2f} | {kf / 1e9:.2f} | {d:.1e} |"
          + (f" {m['one-shot explicit']:.2f} | {m['gathered explicit']:.2f} |" if fused else "")
          + (f" {m['kept kernel']:.2f} | {m['kept kernel'] / min(m['one-shot'], m['chunked'], m['gathered']):.2f} |"
             if has_kernel else "")
          + (f" {m['sdpa']:.2f} |" if "sdpa" in m else " — |") + f" {fr:.2f} |"
          for (T, q, m, ff, kf, d), fr in zip(rows, fractions, strict=True)],
        "",
        f"Float32 torch.mm peak measured in this run: {peak / 1e9:.1f} GFLOP/s; the sdpa backend (PyTorch's public "
        "fused attention, one boolean mask over the context and every cell's suffix) is timed where its mask takes "
        "at most 256 MB. Best row: " + peak_fraction(*max(((kf, min(m.values()) / 1000) for _, _, m, _, kf, _ in rows),
                                                        key=lambda x: x[0] / x[1]), peak) + ".",
        "",
        *([f"One-shot and gathered use PyTorch's fused CPU attention kernel (the context part in one call, the suffix "
           "joined through its log-sum-exp); the explicit columns are the same forms with it off. Fused / explicit, "
           "median over the rows: one-shot "
           f"{statistics.median(m['one-shot'] / m['one-shot explicit'] for *_, m, _, _, _ in rows):.2f}, gathered "
           f"{statistics.median(m['gathered'] / m['gathered explicit'] for *_, m, _, _, _ in rows):.2f}.", ""]
          if fused else ["The fused kernel is not present in this PyTorch: every form is explicit.", ""]),
        (f"The gathered form is the faster at every length from {from_q} queries per cell up "
         if from_q is not None else "The gathered form is never the faster at every length ")
        + f"(the engine gathers from GATHER_MIN_QUERIES = {GATHER_MIN_QUERIES}); below that, a decode step's one "
        "query does not repay the gather, and the engine multiplies the shared keys (one-shot, or chunked past the "
        "memory budget).",
        "",
        *([(f"The kept-entries kernel is the fastest form at every length up to {up_to} query rows per (KV head, cell) "
            f"({G} query heads per KV head × queries per cell)" if up_to is not None else
            "The kept-entries kernel is not the fastest form at every length for any query count measured")
           + f"; the engine runs it up to KEPT_MAX_ROWS = {KEPT_MAX_ROWS} rows (the gathered form above).", ""]
          if has_kernel else ["The kept-entries kernel is not built here (kvroute.engine.attention.kept): not timed.",
                              ""]),
        f"gathered from: {from_q}",
        *([f"kept kernel fastest up to rows: {up_to}"] if has_kernel else []),
    ]
    write("attention_kernels", lines)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    torch.set_grad_enabled(False)
    sys.exit(main())
