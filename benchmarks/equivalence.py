"""kvroute's masked engine vs the kvpress pipeline, answer for answer, on a real embedded model.

For every instance × press × ratio, kvroute decodes the cell from one shared prefill with a
KeepMask; kvpress's own `KVPressTextGenerationPipeline` runs the same press on the same prompt
(its own hooks, its own pruned or fake-key-masked cache). The greedy answers must agree token for
token: the generated token ids (read off the pipeline's final ``tokenizer.decode`` call) and the
text; for presses kvpress applies with fake keys (AdaKV, CriticalAdaKV, KVzip's global selection)
kvroute's keep masks must also equal the masks kvpress decides. The comparison is
:mod:`kvroute.engine.check`'s, as in ``kvroute presses check``. Ends with the line `agreement: X/Y`.

The presses are read from the registries: every scorer that wraps a kvpress press (kvpress's
defaults, its default selection; finch in the question-aware regime, where the question is in the
compressed prefix; presses with learned hub weights — QFilter, KVzap, expected attention with stored
statistics — with random weights of the right shape, written by kvpress's own class, since no
checkpoint can be downloaded here), a few parameter variants that reach code paths the defaults skip on ~220-token
contexts, and for every selection strategy with a kvpress counterpart the presses of
``SELECTION_CASES`` (the script refuses to run if a registered selection has neither cases nor is
kvroute's own). Random scorers are seeded per (seed, layer) on both sides.

    python benchmarks/equivalence.py [--model smollm2-135m] [--n 10] [--max-new-tokens 8] [--tokens 220]
    python benchmarks/equivalence.py --model tiny-llama --device cuda --dtype bfloat16 --out results/x.md
    python benchmarks/equivalence.py --models tiny-llama3 tiny-phi3-128 tiny-gemma3 --n 4

``tiny-ARCH`` (``tiny-ARCH-HEADSIZE``) is a tiny random model of the registry
(kvroute.models.tiny.TINY_ARCHITECTURES) at its first (that) head size, written as a local folder and loaded as any
folder is: an architecture kvroute cannot study is refused at load, and its report says so in one line.
``--models`` runs each in turn, each to its own report (results/equivalence_MODEL.md).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch
from common import cpu_name

from kvroute.engine import Cell, DecodeSettings, Engine
from kvroute.engine.check import Agreement, compare_prompt
from kvroute.engine.reference import kvpress_pipeline
from kvroute.errors import ModelLoadError
from kvroute.models import load_model
from kvroute.models.tiny import TINY_ARCHITECTURES, save_tiny_model
from kvroute.presses import SCORERS, SELECTIONS, build_press
from kvroute.presses.scorers import KvpressScorer
from kvroute.presses.scorers.local_weights import with_random_weights
from kvroute.tasks import TaskSpec, build_prompt, generate_tasks

VARIANTS = ["lagkv[lag_size=32]", "compactor[chunk_size=64]", "non_causal_attention[chunk_size=64]",
            "kvzip[chunk_size=64]"]
# every selection with a kvpress counterpart: the presses that check it (expected attention without its own
# value norm under CriticalKV, as kvpress advises)
SELECTION_CASES = {
    "per_head": ["knorm+per_head"],
    "adakv": ["expected_attention+adakv", "snapkv+adakv"],
    "chunk": ["expected_attention+chunk[chunk_length=48]", "knorm+chunk[chunk_length=48]",
              "finch+chunk[chunk_length=128,rescore=false]"],
    "chunkkv": ["expected_attention+chunkkv", "snapkv+chunkkv[chunk_length=10]"],
    "entropy_chunkkv": ["expected_attention+entropy_chunkkv"],
    "block": ["expected_attention+block[block_size=32]", "knorm+block[block_size=64]"],
    "criticalkv": ["expected_attention[use_vnorm=false]+criticalkv", "snapkv+criticalkv"],
    "critical_adakv": ["expected_attention[use_vnorm=false]+critical_adakv"],
    "pyramid": ["snapkv+pyramid", "snapkv[window_size=32]+pyramid[window_size=32,beta=10]"],
    "global": ["kvzip+global[per_layer=true]"],
}
OWN_SELECTIONS = {"routes", "shared"}  # kvroute's own: kvpress has no counterpart
RATIOS = [0.25, 0.5, 0.75, 0.9]
SEED = 0
# --model names for tiny random models (no download): tiny-ARCH, tiny-ARCH-HEADSIZE for the registry's head sizes
TINY = {f"tiny-{a.name}" + (f"-{d}" if i else ""): (a.name, d) for a in TINY_ARCHITECTURES.values()
        for i, d in enumerate((None, *a.head_dims))}
FAMILIES = ["base", "multi_entity", "hops", "knowledge", "coreference", "multi_presence"]


def registry_presses() -> list[str]:
    return [n for n, cls in SCORERS.items() if issubclass(cls, KvpressScorer)]


def presses() -> list[str]:
    missing = set(SELECTIONS.names()) - set(SELECTION_CASES) - OWN_SELECTIONS
    if missing:
        raise SystemExit(f"selections without equivalence cases: {sorted(missing)}; add them to SELECTION_CASES")
    return registry_presses() + VARIANTS + [p for cases in SELECTION_CASES.values() for p in cases]


def device_text(lm) -> str:
    dev = next(lm.model.parameters()).device
    if dev.type == "cuda":
        return f"{torch.cuda.get_device_name(dev)}"
    return f"{torch.get_num_threads()} torch threads"


def instances(tokenizer, n: int, tokens: int) -> list:
    out = []
    per = -(-n // len(FAMILIES))
    for fam in FAMILIES:
        out += generate_tasks(TaskSpec(fam, n=per, seed=7, target_tokens=tokens), tokenizer)
    return out[:n]


def tiny_folder(name: str, weights: Path) -> str:
    """The local folder of tiny model ``name`` (a TINY key). tiny-llama and tiny-qwen2: hidden 256 and 4 heads
    (head size 64, where kvpress's fake keys exist), as before the registry; the others: the registry's shape."""
    arch, head_dim = TINY[name]
    spec = TINY_ARCHITECTURES[arch]
    if head_dim is None and arch in ("llama", "qwen2"):
        sizes = {"hidden": 256}
    else:
        sizes = spec.sizes(head_dim or spec.head_dim or spec.head_dims[0])
    return str(save_tiny_model(weights / name, arch, **sizes))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m", help="a zoo name, a local folder, or tiny-ARCH[-HEADSIZE] "
                    f"({', '.join(k for k, (_, d) in TINY.items() if d is None)}; random weights, 3 layers: a fast "
                    "check of the code paths, e.g. on another device)")
    ap.add_argument("--models", nargs="+", default=None, help="several models (as --model), each to its own report")
    ap.add_argument("--n", type=int, default=10)
    ap.add_argument("--max-new-tokens", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=220, help="target context length of the generated instances")
    ap.add_argument("--out", default=None, help="default: results/equivalence[_MODEL].md")
    ap.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N (both sides run there)")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    args = ap.parse_args()
    if args.models and args.out:
        raise SystemExit("--out names one report; with --models each model writes results/equivalence_MODEL.md")
    codes = []
    for model in args.models or [args.model]:
        args.model = model
        codes.append(run(args))
    return max(codes)


def run(args: argparse.Namespace) -> int:
    """One model's comparison and report (``args.model``); 0 where every cell agrees."""
    out = Path(args.out) if args.out else Path(__file__).parent / "results" / (
        "equivalence.md" if args.model == "smollm2-135m" else f"equivalence_{args.model}.md")
    torch.manual_seed(0)
    weights = Path(tempfile.mkdtemp(prefix="kvroute-equivalence-"))
    source = args.model
    if args.model in TINY:  # a tiny random model, written as a local folder
        source = tiny_folder(args.model, weights)
    try:
        lm = load_model(source, dtype=args.dtype, device=args.device)
    except ModelLoadError as e:  # an architecture kvroute cannot study: its report is that one line
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(f"# Equivalence with the kvpress pipeline\n\nCommand: `python benchmarks/equivalence.py --model "
                       f"{args.model}`\n\nModel: {args.model}. Not run: {e}\nagreement: not studied\n")
        print(f"{args.model}: {e}\nagreement: not studied", flush=True)
        return 0
    label = {with_random_weights(p, lm.model, weights): p for p in presses()}  # the spec run -> the spec shown
    all_presses = list(label)
    tasks = instances(lm.tokenizer, args.n, args.tokens)
    engine = Engine(lm, DecodeSettings(max_new_tokens=args.max_new_tokens))
    pipe = kvpress_pipeline(lm)
    aware = [p for p in all_presses if build_press(p).scorer.needs_question_window]
    groups = {"agnostic": [p for p in all_presses if p not in aware], "aware": aware}
    tally = Agreement(label, per_press={p: [0, 0, 0, 0] for p in label.values()})  # rows in registry order
    t_ours = t_ref = 0.0

    def report(done: int) -> list[str]:
        lines = [
            "# Equivalence with the kvpress pipeline",
            "",
            f"Command: `python benchmarks/equivalence.py --model {args.model} --n {args.n} "
            f"--max-new-tokens {args.max_new_tokens} --tokens {args.tokens}"
            + ("" if args.device == "cpu" else f" --device {args.device}")
            + ("" if args.dtype == "float32" else f" --dtype {args.dtype}") + "`",
            f"Machine: {cpu_name()}, {device_text(lm)}, torch {torch.__version__}; "
            f"date {time.strftime('%Y-%m-%d')}.",
            f"Model: {lm.name} ({args.dtype}). Instances: {done} "
            f"({', '.join(dict.fromkeys(t.family for t in tasks[:done]))}; ~{args.tokens}-token contexts), "
            f"question-agnostic (finch: question-aware), greedy, max_new_tokens={args.max_new_tokens}.",
            "",
            f"Presses: every kvpress scorer in the registry ({len(registry_presses())}, kvpress defaults, each with "
            f"its default selection), {len(VARIANTS)} parameter variants, and "
            f"{sum(map(len, SELECTION_CASES.values()))} presses covering every selection with a kvpress counterpart "
            f"({len(SELECTION_CASES)}; kvroute's own: {', '.join(sorted(OWN_SELECTIONS))}); presses with learned hub "
            f"weights run with random weights of the right shape on both sides; ratios {', '.join(map(str, RATIOS))}. "
            "Agreement = equal generated token ids and text (and, for fake-key presses, equal keep masks).",
            "",
            "| press | agreement | keep masks equal (fake-key presses) |",
            "|---|---|---|",
            *[f"| `{p}` | {a}/{n} | {f'{m}/{nm}' if nm else '–'} |" for p, (a, n, m, nm) in tally.per_press.items()],
            "",
            f"Wall time: kvroute {t_ours:.1f} s (one prefill per instance and regime, all cells batched), "
            f"kvpress pipeline {t_ref:.1f} s (one call per cell, "
            "plus one prefill per fake-key cell to read its masks).",
            "",
        ]
        if tally.not_compared:
            lines += ["Not compared (kvpress could not run the cell):", ""]
            lines += [f"- {why} ({n} instances)" for why, n in tally.not_compared.items()] + [""]
        if tally.mismatches:
            lines += ["Disagreements:", ""] + [f"- {d}" for d in tally.mismatches] + [""]
        if tally.fake_key_only:
            lines += [f"{tally.fake_key_only} of the disagreements are kvpress's fake keys, not kvroute: kvpress keeps "
                      "a masked entry's value and overwrites its key with one whose logit is very negative (−1e5 "
                      "scaled), assuming its weight underflows to zero; softmax compares logits with each other, so a "
                      "query whose real logits are lower still puts its attention there. Rerun with the same entries "
                      "masked exactly (−inf, as physically dropping them would), kvpress's pipeline answers kvroute's "
                      "tokens.", ""]
        if done < len(tasks):
            lines.append(f"(partial: {done} of {len(tasks)} instances so far)")
        lines.append(tally.line)
        if tally.fake_key_only:
            lines.append(tally.exact_line)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text("\n".join(lines) + "\n")
        return lines

    for k, inst in enumerate(tasks):
        for regime, group in groups.items():
            if not group:
                continue
            prompt = build_prompt(lm.tokenizer, inst, regime=regime)
            res = compare_prompt(engine, prompt, [Cell(p, r) for p in group for r in RATIOS], seed=SEED,
                                 pipeline=pipe, prompt_id=inst.id)
            t_ours += res.seconds_kvroute
            t_ref += res.seconds_kvpress
            tally.add(res)
        print(f"[{k + 1}/{len(tasks)}] {inst.family:<15} {tally.line} so far", flush=True)
        lines = report(k + 1)
    print("\n".join(lines[-(len(tally.mismatches) + 3):]))
    return 0 if tally.agree == tally.total else 1


if __name__ == "__main__":
    sys.exit(main())
