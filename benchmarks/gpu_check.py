"""kvroute's engine on a CUDA GPU: equivalence, peak memory of 64-cell decodes, speed against the kvpress loop.

For a machine with a CUDA device and no model hub: the weights are random (``torch.manual_seed(0)``), the
shapes real — SmolLM2-135M's config and tokenizer from the embedded model's folder, and Llama-3-8B's shape
(32 layers, 32 query heads over 8 KV heads of 128, hidden 4096, MLP 14336, vocabulary 128,256) with the same
tokenizer. Random weights answer nonsense, so answers are compared between engines, never scored; memory and
speed depend on the shapes only. Three parts, each written to the report as it finishes:

1. Equivalence (SmolLM2 shape, float32, ~512 tokens, 27 cells): kvroute's answers against kvpress's
   pipeline; the chunked attention and draft verification against the plain engine (same tokens).
2. Peak memory of a 64-cell decode (random keep masks, a 50-token question, 4 new tokens), captures off
   and on, against context length, with the planner's prediction (kvroute.engine.plan) beside it:
   ``torch.cuda.max_memory_allocated`` over the weights.
3. Speed: the grid_speed grid (snapkv, expected_attention, streaming_llm × 9 ratios, answers only) against
   a loop over kvpress's pipeline, with the FLOP ceiling (benchmarks/flops.py) and `ratio to ceiling`.

    python benchmarks/gpu_check.py --model-dir DIR [--out results/gpu_check.md] [--budget-s 480]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from flops import CellWork, Shape, ceiling  # noqa: E402

PRESSES = ["snapkv", "expected_attention", "streaming_llm"]
RATIOS = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9]
LLAMA_8B = dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                num_key_value_heads=8, vocab_size=128256, rope_theta=500000.0, max_position_embeddings=131072,
                rms_norm_eps=1e-5, tie_word_embeddings=False)


class Report:
    def __init__(self, path: Path, budget_s: float) -> None:
        self.path, self.t0, self.budget = path, time.perf_counter(), budget_s
        self.lines: list[str] = []
        self.data: dict = {}

    def left(self) -> float:
        return self.budget - (time.perf_counter() - self.t0)

    def add(self, *lines: str) -> None:
        self.lines += lines
        print("\n".join(lines), flush=True)
        self.path.write_text("\n".join(self.lines) + "\n")
        self.path.with_suffix(".json").write_text(json.dumps(self.data, indent=1))


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def random_model(model_dir: Path, *, big: bool, dtype: torch.dtype, device: str):  # noqa: ANN201 - LoadedModel
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from kvroute.models.loading import LoadedModel, model_info

    config = AutoConfig.from_pretrained(model_dir)
    if big:
        for k, v in LLAMA_8B.items():
            setattr(config, k, v)
        config.head_dim = 128
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation="sdpa")
    model.eval()
    model.generation_config.eos_token_id = config.eos_token_id
    tok = AutoTokenizer.from_pretrained(model_dir)
    name = "llama-3-8b-shape (random)" if big else "smollm2-135m-shape (random)"
    return LoadedModel(model=model, tokenizer=tok, name=name, kind="random", path=str(model_dir),
                       info=model_info(model))


def prompts_of(lm, tokens: int, n: int = 1):  # noqa: ANN001, ANN201
    from kvroute.tasks import TaskSpec, build_prompt, generate_tasks

    tasks = generate_tasks(TaskSpec("base", n=n, seed=11, target_tokens=tokens), lm.tokenizer)
    return [build_prompt(lm.tokenizer, t) for t in tasks]


def equivalence(rep: Report, lm, tokens: int = 512, label: str = "SmolLM2 shape, random weights, float32") -> None:  # noqa: ANN001
    from kvroute.engine import Cell, DecodeSettings, Engine
    from kvroute.engine.reference import kvpress_answer, kvpress_pipeline

    p = prompts_of(lm, tokens)[0]
    cells = [Cell(x, r) for x in PRESSES for r in RATIOS]
    base = Engine(lm, DecodeSettings(max_new_tokens=16, capture=False)).run(p, cells).raise_for_errors()
    pipe = kvpress_pipeline(lm)
    agree = sum(kvpress_answer(lm, p.kvpress_context, p.kvpress_question, c.press, c.ratio, max_new_tokens=16,
                               pipeline=pipe) == o.text for c, o in zip(cells, base.outputs, strict=True))
    chunked = Engine(lm, DecodeSettings(max_new_tokens=16, capture=False, attention_memory=1)).run(p, cells)
    chunked.raise_for_errors()
    drafted = Engine(lm, DecodeSettings(max_new_tokens=16, capture=False, draft=True)).run(p, cells).raise_for_errors()
    same_chunked = sum(a.tokens == b.tokens for a, b in zip(base.outputs, chunked.outputs, strict=True))
    same_draft = sum(a.tokens == b.tokens for a, b in zip(base.outputs, drafted.outputs, strict=True))
    rep.data.setdefault("equivalence", []).append(dict(model=label, tokens=p.n_context, cells=len(cells),
                                                      kvpress_agree=agree, chunked_same=same_chunked,
                                                      draft_same=same_draft))
    rep.add(f"## 1. Equivalence on CUDA ({label})", "",
            f"{p.n_context} context tokens, {len(cells)} cells, 16 new tokens: answers equal to kvpress's pipeline "
            f"{agree}/{len(cells)}; chunked attention (smallest chunk) same tokens {same_chunked}/{len(cells)}; "
            f"draft verification same tokens {same_draft}/{len(cells)}.", "")


def decode_peak(lm, T: int, *, question: int, capture: bool, attention: int | None,  # noqa: ANN001
                cells: int = 64) -> dict:
    from kvroute.engine.attention.streaming import ATTENTION_SHARE, available_memory
    from kvroute.engine.decode import DecodeSettings, decode_cells
    from kvroute.engine.plan import MemoryShape, instance_bytes, plan_batch
    from kvroute.engine.prefill import prefill
    from kvroute.presses import KeepMask

    dev = lm.device
    g = torch.Generator(device="cpu").manual_seed(T)
    ids = torch.randint(100, 40000, (T + question,), generator=g).tolist()
    sync()
    torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    pre = prefill(lm.model, ids[:T])
    sync()
    prefill_peak = torch.cuda.max_memory_allocated() - base
    L, Hkv = len(pre.keys), pre.keys[0].shape[1]
    masks = [KeepMask(torch.rand(L, Hkv, T, generator=g).to(dev) < 0.5, "random", 0.5) for _ in range(cells)]
    shape = MemoryShape.of(lm.model)
    avail = available_memory(dev)
    budget = attention or int(avail * ATTENTION_SHARE)
    plan = plan_batch(shape, T=T, q=question, new=4, cells=cells, available=avail, attention=budget, capture=capture)
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    outs = decode_cells(lm.model, None, pre, ids[T:], masks,
                        settings=DecodeSettings(max_new_tokens=4, capture=capture, attention_memory=attention))
    sync()
    seconds = time.perf_counter() - t0
    peak = torch.cuda.max_memory_allocated() - base
    predicted = (shape.context_bytes(T) + plan.batch * plan.per_cell + plan.fixed)
    least = instance_bytes(shape, T=T, q=question, new=4, cells=cells + 1, capture=capture)
    del outs, pre, masks
    return dict(T=T, question=question, capture=capture, batch=plan.batch, fits=plan.fits,
                kv_gb=shape.context_bytes(T) / 2**30, prefill_gb=prefill_peak / 2**30, peak_gb=peak / 2**30,
                predicted_gb=predicted / 2**30, least_gb=least / 2**30, seconds=seconds)


def memory(rep: Report, lm, lengths: list[int], label: str) -> None:  # noqa: ANN001
    rows = []
    rep.add(f"## 2. Peak memory of a 64-cell decode: {label}", "",
            "Attention budget 256 MiB (the planner chunks the context past it); peak = `max_memory_allocated` over "
            "the weights, prefill included in 'prefill GB' only; predicted = context K/V + planned batch × per-cell "
            "share + fixed part (kvroute.engine.plan).", "",
            "| context tokens | question | captures | batch | context K/V GB | prefill peak GB | decode peak GB "
            "| predicted GB | s |", "|---|---|---|---|---|---|---|---|---|")
    for T in lengths:
        for question, capture in ((50, False), (50, True), (200, False)):
            if question == 200 and T != lengths[len(lengths) // 2]:
                continue
            if rep.left() < 60:
                rep.add(f"| {T} | {question} | {capture} | skipped: out of time |")
                continue
            try:
                r = decode_peak(lm, T, question=question, capture=capture, attention=256 << 20)
            except torch.OutOfMemoryError as e:
                rep.add(f"| {T} | {question} | {capture} | out of memory: {str(e)[:80]} |")
                torch.cuda.empty_cache()
                continue
            rows.append(r)
            rep.data.setdefault("memory", {}).setdefault(label, []).append(r)
            rep.add(f"| {T} | {question} | {'on' if capture else 'off'} | {r['batch']} | {r['kv_gb']:.2f} "
                    f"| {r['prefill_gb']:.2f} | {r['peak_gb']:.2f} | {r['predicted_gb']:.2f} | {r['seconds']:.1f} |")
    off = [r for r in rows if not r["capture"] and r["question"] == 50]
    if len(off) >= 2:
        a, b = off[0], off[-1]
        slope = (b["peak_gb"] - a["peak_gb"]) / (b["T"] - a["T"]) * 2**30
        kv = (b["kv_gb"] - a["kv_gb"]) / (b["T"] - a["T"]) * 2**30
        rep.data.setdefault("slopes", {})[label] = dict(slope_bytes_per_token=slope, kv_bytes_per_token=kv)
        rep.add("", f"Captures off: peak grows {slope / 1024:.1f} KiB per context token between {a['T']} and "
                f"{b['T']} tokens; one copy of the context K/V is {kv / 1024:.1f} KiB per token "
                f"({slope / kv:.2f}×).", "")


def speed(rep: Report, lm, T: int, label: str, repeats: int = 2) -> None:  # noqa: ANN001
    from kvroute.engine import Cell, DecodeSettings, Engine
    from kvroute.engine.reference import kvpress_answer, kvpress_pipeline

    p = prompts_of(lm, T)[0]
    cells = [Cell(x, r) for x in PRESSES for r in RATIOS]
    engine = Engine(lm, DecodeSettings(max_new_tokens=24, capture=False))
    pipe = kvpress_pipeline(lm)
    engine.run(p, cells[:2], decode_full=False).raise_for_errors()  # warm-up both
    kvpress_answer(lm, p.kvpress_context, p.kvpress_question, "snapkv", 0.5, max_new_tokens=4, pipeline=pipe)
    ta, tb, ours, ref = [], [], None, None
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        ours = engine.run(p, cells, decode_full=False).raise_for_errors().outputs
        sync()
        ta.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        ref = [kvpress_answer(lm, p.kvpress_context, p.kvpress_question, c.press, c.ratio, max_new_tokens=24,
                              pipeline=pipe) for c in cells]
        sync()
        tb.append(time.perf_counter() - t0)
        if rep.left() < 90:
            break
    agree = sum(o.text == r for o, r in zip(ours, ref, strict=True))
    work = [CellWork(c.ratio, len(o.tokens)) for c, o in zip(cells, ours, strict=True)]
    bound = ceiling(Shape.of(lm.model), [(p.n_context, len(p.question_ids), work)])
    sp = statistics.median(tb) / statistics.median(ta)
    rep.data.setdefault("speed", []).append(dict(model=label, T=p.n_context, kvroute_s=ta, kvpress_s=tb, agree=agree,
                                                 speedup=sp, ceiling=bound, ratio_to_ceiling=sp / bound))
    rep.add(f"| {label} | {p.n_context} | {statistics.median(ta):.2f} | {statistics.median(tb):.2f} | {sp:.1f}× "
            f"| {bound:.1f}× | {sp / bound:.2f} | {agree}/{len(cells)} |")


def run_parts(rep: Report, args: argparse.Namespace) -> None:
    """The parts named in ``--parts``, each guarded (a part that breaks is reported, the others still run), the
    SmolLM2 shape first, then the 8B shape, one model in memory at a time."""
    parts, cuda = args.parts.split(","), args.device == "cuda"

    def guarded(name: str, fn, *a) -> None:  # noqa: ANN001
        try:
            fn(*a)
        except Exception:
            rep.add(f"{name} failed:", "```", traceback.format_exc()[-2000:], "```", "")

    def release() -> None:
        if cuda:
            torch.cuda.empty_cache()

    small = random_model(args.model_dir, big=False, dtype=torch.float32, device=args.device)
    if "equivalence" in parts:
        guarded("equivalence", equivalence, rep, small)
    if "memory" in parts and cuda:
        guarded("memory (small)", memory, rep, small, args.small, "SmolLM2-135M shape, float32")
    if "speed" in parts:
        rep.add("## 3. Speed: 27 cells against the kvpress loop (answers only, 24 new tokens)", "",
                "| model | context tokens | kvroute s | kvpress loop s | speedup | FLOP ceiling | ratio to ceiling "
                "| answers agree |", "|---|---|---|---|---|---|---|---|")
        for T in args.speed:
            if rep.left() > 120:
                guarded(f"speed {T}", speed, rep, small, T, "SmolLM2-135M shape fp32")
    del small
    release()
    if "big-equivalence" in parts and rep.left() > 120:
        big32 = random_model(args.model_dir, big=True, dtype=torch.float32, device=args.device)
        guarded("equivalence (8B shape, float32)", equivalence, rep, big32, args.big_equivalence_tokens,
                "Llama-3-8B shape, random weights, float32")
        del big32
        release()
    if ("memory" in parts or "speed" in parts) and rep.left() > 120:
        big = random_model(args.model_dir, big=True, dtype=torch.bfloat16, device=args.device)
        for T in args.big_speed if "speed" in parts else []:
            if rep.left() > 150:
                guarded(f"speed 8B {T}", speed, rep, big, T, "Llama-3-8B shape bf16")
        if "memory" in parts and cuda:
            guarded("memory (8B)", memory, rep, big, args.big, "Llama-3-8B shape, bfloat16")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model-dir", type=Path, required=True, help="SmolLM2-135M's folder (config and tokenizer)")
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "gpu_check.md")
    ap.add_argument("--budget-s", type=float, default=480)
    ap.add_argument("--small", type=int, nargs="+", default=[512, 2048, 8192, 16384, 32768])
    ap.add_argument("--big", type=int, nargs="+", default=[4096, 16384, 32768, 65536])
    ap.add_argument("--speed", type=int, nargs="*", default=[2048, 8192])
    ap.add_argument("--big-speed", type=int, nargs="*", default=[8192])
    ap.add_argument("--parts", default="equivalence,memory,speed",
                    help="comma-separated: equivalence, memory, speed, big-equivalence (the 8B shape in float32)")
    ap.add_argument("--big-equivalence-tokens", type=int, default=2048)
    ap.add_argument("--device", default="cuda", help="cpu: a smoke run of the script (equivalence and speed only)")
    args = ap.parse_args()
    torch.set_grad_enabled(False)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device (--device cpu runs a smoke test of this script)", file=sys.stderr)
        return 2
    from common import environment

    rep = Report(args.out, args.budget_s)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    rep.add("# kvroute on a CUDA GPU (random weights, real shapes)", "",
            f"Command: `python benchmarks/gpu_check.py --model-dir DIR` (budget {args.budget_s:.0f} s)",
            f"Environment: {environment()}; device "
            + (f"{torch.cuda.get_device_name()}, {torch.cuda.get_device_properties(0).total_memory / 2**30:.0f} GiB"
               if args.device == "cuda" else "cpu (smoke run)"), "")
    run_parts(rep, args)
    rep.add("", f"Finished in {time.perf_counter() - rep.t0:.0f} s.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
