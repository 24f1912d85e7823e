"""The main job's speed: `kvroute demo` timed, its forward FLOPs counted, set beside a matmul peak measured in the
same run, and, with ``--before REV``, the same demo from an earlier commit run back to back on the same machine.

    python benchmarks/demo_speed.py [--scale 1] [--tickets 2] [--before REV] [--work DIR]

Each side runs ``python -m kvroute.cli demo --scale S --tickets N --out DIR`` in a process of its own; the earlier
commit from a ``git worktree`` of REV with that tree's ``src`` first on ``PYTHONPATH`` (the same virtual environment,
models and kernels folder). A float32 ``torch.mm`` peak is measured before, between and after (the best of them
counts: a busy minute counts against the machine, not against kvroute); each side's peak resident memory is its
process's own (wait4). ``benchmarks/compare_runs.py`` then compares the two runs' records field by field.

The forward FLOPs are counted from the current run's records and task files with benchmarks/flops.py's model (2·P per
token for the decoder layers' P parameters, 4·H·D per (query, visible key) pair and layer, 2·hidden·V per position
whose logits are computed): per instance one prefill of its T context tokens; per decoded cache (each compressed cell,
and the full cache once, which the ratio-0 cells share) the question and teacher-forced gold tokens and the generated
tokens over its kept entries; the logit lens at the last prompt token (a vocabulary projection per layer) and the
sequence lens (each candidate's tokens after the first fed for every cell, with a vocabulary projection per layer and
position); KVzip's replay of each instance's context (a forward of each pass's replay tokens over the context, and
kvpress's scoring product, benchmarks/flops.py's ``replay_flops``, the passes as the scorer's own ``prepare`` cuts
them). Not counted: Expected Attention's statistics (no forward), the routed-evidence rollout, the ticket searches'
forwards and the report: the fraction of peak is a lower bound for the sweep and lower still for the whole demo. The
table gives the fraction without the replay as well, the form of earlier runs of this script.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).parent))
from common import ROOT, environment, matmul_peak, worktree, write  # noqa: E402
from compare_runs import commit  # noqa: E402
from flops import Shape, prefill_flops, replay_flops  # noqa: E402

MODEL = "qwen2.5-0.5b"  # the demo's model
REPLAY = "KVzip replay"  # the part of the FLOPs earlier runs of this script did not count


def demo_flops(run_dir: Path, scale: float) -> tuple[float, dict[str, float]]:
    """The forward FLOPs of the demo's sweep in ``run_dir`` (its records and task files), total and by part."""
    import pandas as pd

    from kvroute.analysis.load import load_records
    from kvroute.demo import demo_config
    from kvroute.metrics.representation import answer_candidates
    from kvroute.models import load_model
    from kvroute.presses import build_press
    from kvroute.runner import gold_ids
    from kvroute.sweep import sweep_config_from_mapping
    from kvroute.tasks import load_tasks
    from kvroute.tasks.prompt import build_prompt

    settings = sweep_config_from_mapping(demo_config([MODEL], scale=scale), source="kvroute demo").settings
    lm = load_model(MODEL, dtype="float32")
    s = Shape.of(lm.model)
    attn = 4 * s.heads * s.head_dim * s.layers  # per (query, visible key) pair
    head = 2 * s.hidden * s.vocab  # one position's logits
    instances = {t.id: t for f in sorted((run_dir / "tasks").glob("*.jsonl")) for t in load_tasks(f)}
    df = load_records(run_dir)
    parts = {"prefill": 0.0, "question and answer": 0.0, "logit lens": 0.0, "sequence lens": 0.0, REPLAY: 0.0}
    kvzip = build_press("kvzip").scorer
    kvzip.setup_tokenizer(lm.tokenizer)
    for iid, rows in df.groupby("instance_id"):
        inst = instances[str(iid)]
        prompt = build_prompt(lm.tokenizer, inst, regime="agnostic", system_prompt=settings.system_prompt,
                              answer_prefix=settings.answer_prefix)
        T, Q = prompt.n_context, len(prompt.question_ids)
        gold = gold_ids(lm.tokenizer, inst, prompt)
        cands = answer_candidates(lm.tokenizer, prompt, inst, gold)
        parts["prefill"] += prefill_flops(s, T)
        if (rows["press"] == "kvzip").any():
            parts[REPLAY] += replay_flops(s, T, kvzip_passes(kvzip, lm.model, prompt.context_ids), int(kvzip.n_sink))
        full = rows[rows["ratio"] == 0]
        caches = [(T, int(full["answer_tokens"].iloc[0]) if len(full) else 0)] + [
            (round(float(r.kept_fraction) * T), int(r.answer_tokens)) for r in rows[rows["ratio"] > 0].itertuples()
            if not pd.isna(r.kept_fraction)]
        for kept, answer in caches:
            q = Q + len(gold) + max(answer - 1, 0)  # the question forward's tokens, then each step's
            pairs = q * kept + q * (q + 1) // 2
            parts["question and answer"] += 2 * s.layer_params * q + attn * pairs + head * (len(gold) + max(answer, 1))
            parts["logit lens"] += head * s.layers  # one vocabulary projection per layer at the last prompt token
            for seq in cands.seqs:  # the rest of each candidate fed after the question, lens at every layer
                m = len(seq) - 1
                seq_pairs = m * (kept + Q) + m * (m + 1) // 2
                parts["sequence lens"] += 2 * s.layer_params * m + attn * seq_pairs + head * s.layers * m
    return sum(parts.values()), parts


def kvzip_passes(scorer: Any, model: Any, context_ids: list[int]) -> list[tuple[int, int, int]]:
    """(replay tokens, chunk start, chunk end) of each pass KVzip's scorer makes over ``context_ids``, from kvpress's
    own ``KVzipPress.prepare``, walked by the scorer's own ``replay_passes`` (what ``KVzipScorer.score_model``
    runs)."""
    from kvroute.presses.scorers.kvzip import replay_passes

    press = scorer.press
    press._context_ids, press.context_length = torch.tensor([context_ids]), len(context_ids)
    try:
        return [(ids.shape[1], start, end) for ids, start, end in replay_passes(press, model, scorer._tokenizer)]
    finally:
        press._context_ids = press.score_val = None


def run_demo(tree: Path, out: Path, scale: float, tickets: int) -> tuple[float, float]:
    """``kvroute demo`` from ``tree`` (its ``src`` first on the path) into ``out``: its wall time in seconds and its
    peak resident memory in MB (the child's own, from wait4)."""
    env = {**os.environ, "PYTHONPATH": str(tree / "src") + os.pathsep + os.environ.get("PYTHONPATH", "")}
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "kvroute.cli", "demo", "--scale", f"{scale:g}", "--tickets",
                             str(tickets), "--out", str(out)], env=env, cwd=tree)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        raise subprocess.CalledProcessError(proc.returncode, proc.args)
    return time.perf_counter() - t0, usage.ru_maxrss / 1024


def backends(out: Path) -> str:
    """The attention backends the run's sweep ran, with their layer forwards, from its manifest ("not recorded" for a
    commit from before the backends were recorded)."""
    manifest = json.loads((out / "manifest.json").read_text())
    ran: dict[str, int] = {}
    for session in manifest.get("sessions", []):
        for name, n in (session.get("attention_backends") or {}).items():
            ran[name] = ran.get(name, 0) + int(n)
    return ", ".join(f"{name} {n}" for name, n in sorted(ran.items(), key=lambda kv: -kv[1])) or "not recorded"


def sweep_seconds(out: Path) -> float:
    """The sweep's computing time from the run's manifest (its sessions together)."""
    manifest = json.loads((out / "manifest.json").read_text())
    return sum(float(s.get("seconds") or 0.0) for s in manifest.get("sessions", []))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scale", type=float, default=1.0, help="the demo's --scale (1: make demo's study)")
    ap.add_argument("--tickets", type=int, default=2, help="the demo's --tickets (2: make demo's)")
    ap.add_argument("--before", default=None, help="an earlier commit whose demo runs first, for a before/after")
    ap.add_argument("--work", type=Path, default=Path("/tmp/kvroute-demo-speed"), help="where the runs go")
    ap.add_argument("--tag", default="", help="a suffix of the results file's name (demo_speed_TAG.md), to keep a run "
                                              "made in another setting (e.g. KVROUTE_KEPT_KERNEL=0) beside the last")
    args = ap.parse_args()
    if args.work.exists():
        shutil.rmtree(args.work)
    args.work.mkdir(parents=True)
    peaks = [matmul_peak()]
    wall: dict[str, float] = {}
    rss: dict[str, float] = {}  # peak resident memory, MB
    with worktree(args.before) as tree:
        sides: list[tuple[str, Path, Path]] = [("before", tree, args.work / "before")] if tree is not None else []
        sides.append(("after", ROOT, args.work / "after"))
        for name, src_tree, out in sides:
            wall[name], rss[name] = run_demo(src_tree, out, args.scale, args.tickets)
            peaks.append(matmul_peak())
            print(f"{name}: {wall[name]:.1f} s, peak resident {rss[name]:.0f} MB", flush=True)
    peak = max(peaks)
    flops, parts = demo_flops(args.work / "after", args.scale)
    sweep = {name: sweep_seconds(out) for name, _, out in sides}
    commits = {name: commit(out) for name, _, out in sides}  # as each run's manifest records it
    settings = "".join(f"{k}={v} " for k, v in sorted(os.environ.items()) if k.startswith("KVROUTE_"))
    cmd = (f"{settings}python benchmarks/demo_speed.py --scale {args.scale:g} --tickets {args.tickets}"
           + (f" --before {args.before}" if args.before else "") + (f" --tag {args.tag}" if args.tag else ""))
    lines = [
        "# The main job's speed: `kvroute demo`, forward FLOPs against a matmul peak",
        "",
        f"Command: `{cmd}`",
        f"Environment: {environment()}",
        f"Model {MODEL} (float32). Forward FLOPs counted (benchmarks/demo_speed.py, from the records of the after "
        f"run): {flops / 1e12:.2f} TFLOP — " + ", ".join(f"{k} {v / 1e12:.2f}" for k, v in parts.items())
        + f". float32 torch.mm peak measured in this run: {peak / 1e9:.1f} GFLOP/s (best of {len(peaks)}).",
        "",
        "| run | commit | demo wall s | sweep s | forward FLOPs at peak, s | fraction of peak: sweep | whole demo "
        f"| sweep without the {REPLAY} | peak resident MB | attention backends (layer forwards) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    at_peak, unreplayed = flops / peak, (flops - parts[REPLAY]) / peak
    for name, _, out in sides:
        lines.append(f"| {name} | {commits[name]} | {wall[name]:.1f} | {sweep[name]:.1f} | {at_peak:.1f} | "
                     f"{at_peak / sweep[name]:.2f} | {at_peak / wall[name]:.2f} | {unreplayed / sweep[name]:.2f} | "
                     f"{rss[name]:.0f} | {backends(out)} |")
    lines.append("")
    if args.before:
        ratio = wall["after"] / wall["before"]
        lines += [f"After / before, whole demo: {ratio:.2f}× (goal ≤ 0.6×: {'met' if ratio <= 0.6 else 'not met'}); "
                  f"sweep: {sweep['after'] / sweep['before']:.2f}×. One run each, back to back. Records compared by "
                  f"`python benchmarks/compare_runs.py {args.work / 'before'} {args.work / 'after'}`.", ""]
    frac = at_peak / sweep["after"]
    lines += [f"Goal: the sweep at ≥ 0.7 of the matmul peak: {'met' if frac >= 0.7 else 'not met'} ({frac:.2f}; "
              "a lower bound, see the script's docstring for what is not counted).", "",
              f"fraction of peak: {frac:.2f}"]
    name = "demo_speed" if args.scale == 1 else f"demo_speed_scale{args.scale:g}"
    name += f"_{args.tag}" if args.tag else ""
    write(name, lines)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    torch.set_grad_enabled(False)
    sys.exit(main())
