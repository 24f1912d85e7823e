"""Where the cliff sits and why, on this machine: model size, context length and causal restoration.

The study configs (benchmarks/configs/size_study.toml, length_study.toml) at a size a 2-core CPU runs in about
two hours: the same presses and ratios, fewer instances per cell (8 per family; 8 per length, 4 at 4,096
tokens), and only the metrics the cliff and the restoration table need (retention, utilization). One run
directory, filled phase by phase with ``kvroute sweep --resume`` (same settings throughout, so the phases add
cells to one store; a killed phase resumes where it stopped):

1. ``size``: smollm2-135m and qwen2.5-0.5b × base, hops, knowledge (level 1, n = 8 each) × the four presses ×
   ratios 0 … 0.95;
2. ``length``: qwen2.5-0.5b × long_context at ~256, 512, 1,024, 2,048 (n = 8) and 4,096 tokens (n = 4);
3. ``heads``: the retrieval heads of qwen2.5-0.5b and qwen2.5-1.5b from their full caches on *other* instances
   (task seed 1, n = 16 per family; metric ``retrieval``), into a second run directory;
4. ``restore``: qwen2.5-0.5b × base (the first 8 instances of phase 1), every compressed cell also restored:
   answer, evidence, random (the null), answer in each third of the layers, answer in the retrieval heads only,
   and random tokens in the retrieval heads (their null);
5. ``large``: qwen2.5-1.5b × base, hops, knowledge (n = 8 each);
6. ``large_length``: qwen2.5-1.5b × long_context at ~2,048 tokens (n = 8): α* beside qwen2.5-0.5b's at the same
   length (one length: no length law for this model).

Then ``kvroute report`` on the run, and results/cliff_study.md from its summary: α* per (model, family, press)
with intervals, the size trend and its projection to 3B/7B/14B beside the paper's 0.9, α* against context length
with the fixed-budget/fixed-ratio verdict, and the share of compression-caused failures each restoration repairs.

    python benchmarks/cliff_study.py [--out runs/cliff_study] [--phases size,length,heads,restore,large]
    python benchmarks/cliff_study.py --report-only          # tables from a finished (or partial) run
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from common import environment, fmt_cell, md_table, write

HERE = Path(__file__).parent
CONFIGS = HERE / "configs"
METRICS = '--set=metrics=["retention","utilization"]'
NO_RESTORE = "--set=restore=[]"
BASE8 = '--set=tasks=[{family="base",difficulty=1,n=8}]'
HEAD_TASKS = ('--set=tasks=[{family="base",difficulty=1,n=16,seed=1},{family="hops",difficulty=1,n=16,seed=1},'
              '{family="knowledge",difficulty=1,n=16,seed=1}]')
RESTORE = ('--set=restore=["answer","evidence","random","answer@layers:early","answer@layers:middle",'
           '"answer@layers:late","answer@heads:retrieval","random@heads:retrieval"]')
PHASES = ("size", "length", "heads", "restore", "large", "large_length")
LONG2K = '--set=tasks=[{family="long_context",n=8,target_tokens=2048}]'
KVROUTE = str(Path(sys.executable).parent / "kvroute")  # the CLI of this environment


def phase_args(name: str, out: Path, heads: Path) -> list[str]:
    """The ``kvroute sweep`` arguments of one phase."""
    size, length = str(CONFIGS / "size_study.toml"), str(CONFIGS / "length_study.toml")
    return {
        "size": [size, "--out", str(out), METRICS, NO_RESTORE, '--set=models=["smollm2-135m","qwen2.5-0.5b"]'],
        "length": [length, "--out", str(out), METRICS],
        "heads": [size, "--out", str(heads), "--ratios", "0", '--set=metrics=["retrieval"]', NO_RESTORE,
                  '--set=models=["qwen2.5-0.5b","qwen2.5-1.5b"]', HEAD_TASKS],
        "restore": [size, "--out", str(out), METRICS, '--set=models=["qwen2.5-0.5b"]', BASE8, RESTORE,
                    f"--set=retrieval_heads={heads}"],
        "large": [size, "--out", str(out), METRICS, NO_RESTORE, '--set=models=["qwen2.5-1.5b"]'],
        "large_length": [length, "--out", str(out), METRICS, '--set=models=["qwen2.5-1.5b"]', LONG2K],
    }[name]


def run_phase(name: str, out: Path, heads: Path) -> float:
    cmd = [KVROUTE, "sweep", *phase_args(name, out, heads), "--resume"]
    print("==", name, ":", " ".join(cmd[1:]), flush=True)
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True)
    return time.perf_counter() - t0


def _tokens(v: object) -> object:
    """A token count rounded to a whole token (None stays None)."""
    return round(v) if isinstance(v, float) and v == v else v


def _interval(lo: object, hi: object) -> str:
    return f"[{fmt_cell(lo)}, {fmt_cell(hi)}]" if lo is not None or hi is not None else "not identified"


def _sessions(run: Path) -> list[str]:
    from datetime import datetime

    from kvroute.sweep.manifest import read_manifest

    out = []
    for sess in (read_manifest(run) or {}).get("sessions", []):
        try:
            minutes = (datetime.fromisoformat(sess["finished"]) - datetime.fromisoformat(sess["started"])).seconds / 60
        except (KeyError, TypeError, ValueError):
            minutes = float("nan")
        argv = list(sess.get("argv") or [])[1:]
        if "--out" in argv:  # the run directory is named already
            i = argv.index("--out")
            del argv[i:i + 2]
        args = " ".join(Path(a).name if a.endswith(".toml") else a for a in argv)
        took = "–" if minutes != minutes else f"{minutes:.1f} min"
        out.append(f"- `{run.name}`: {took}, {sess.get('cells_computed')} cells, {sess.get('status')}: `{args}`")
    return out


def _trend_rows(trends: list[dict]) -> list[dict]:
    rows = []
    for t in trends:
        r = dict(t, slope_ci=_interval(t.get("slope_low"), t.get("slope_high")))
        for lab in ("3B", "7B", "14B"):
            iv = _interval(t.get(f"pred_{lab}_low"), t.get(f"pred_{lab}_high"))
            r[f"p{lab}"] = f"{fmt_cell(t.get(f'pred_{lab}'), 2)} {iv}" if t.get(f"pred_{lab}") is not None else "–"
        rows.append(r)
    return rows


TREND_COLS = [("family", "family"), ("press", "press"), ("n_models", "models"), ("slope", "slope"),
              ("slope_ci", "95% CI"), ("p3B", "α* at 3B"), ("p7B", "α* at 7B"), ("p14B", "α* at 14B"),
              ("pred_14B_has_paper", "14B interval holds 0.9"), ("boot_valid", "replicates used"),
              ("verdict", "verdict")]


def _qwen_only(base: object) -> list[str]:
    """The size trend of the Qwen2.5 models alone: one family of models, each answering its tasks at the full
    cache (SmolLM2-135M fails about half of them, so its α* is the least informative point of the pooled fit)."""
    from kvroute.analysis.size import cliff_vs_size

    qwen = base[base["model"].str.startswith("qwen2.5")]  # type: ignore[index]
    if qwen["model"].nunique() < 2:
        return []
    _, trends = cliff_vs_size(qwen)
    return ["", "The same fit on the Qwen2.5 models alone (0.5B and 1.5B: one model family, both answering at the "
                "full cache; with two models the line passes through both points, so its interval reflects the "
                "instances' sampling only, not scatter about a trend):", "",
            *md_table(_trend_rows(trends.to_dict("records")), TREND_COLS)]


def _head_counts(heads: Path) -> list[str]:
    """How many query heads, and (layer, KV head) pairs, restore=…@heads:retrieval restores per model."""
    from kvroute.analysis.load import load_records
    from kvroute.metrics.retrieval import heads_from_records
    from kvroute.models.zoo import ZOO
    from kvroute.presses.restore import kv_pairs

    if not (heads / "store.sqlite").exists():
        return []
    out = []
    for m, h in sorted(heads_from_records(load_records(heads).to_dict("records")).items()):
        if h is None:
            out.append(f"- {m}: too few copying events for retrieval scores")
            continue
        e = ZOO.get(m)
        pairs = kv_pairs(h.heads, h.num_heads, e.kv_heads)
        out.append(f"- {m}: {len(h.heads)} of {e.layers * h.num_heads} query heads score ≥ 0.1 over {h.events} "
                   f"copying events; they sit in {len(pairs)} of {e.layers * e.kv_heads} (layer, KV head) "
                   "pairs, which is what restoring into them puts back")
    return ["Retrieval heads (from the heads run):", "", *out, ""] if out else []


def _length_baseline(base: object) -> dict[tuple[str, int], float]:
    """H(0) of the long_context instances per (model, length bin), binned as the length analysis bins them."""
    from kvroute.analysis.context import LONG_CONTEXT, length_bins

    full = base[(base["family"] == LONG_CONTEXT) & (base["ratio"] == 0)].copy()  # type: ignore[index]
    if full.empty:
        return {}
    full["T"] = length_bins(full["context_tokens"])
    return {(m, int(t)): float(v) for (m, t), v in full.groupby(["model", "T"])["hallucinated"].mean().items()}


def report_tables(out: Path, heads: Path, seconds: dict[str, float]) -> list[str]:
    """results/cliff_study.md's body from the run's summary.json and its restoration table."""
    from kvroute.analysis.load import load_records
    from kvroute.analysis.restoration import pooled_restoration

    summary = json.loads((out / "report" / "summary.json").read_text())
    df = load_records(out, with_restored=True)
    if "restore" not in df:  # no restore phase yet
        df["restore"] = None
    base = df[df["restore"].isna()]
    lines = [f"One run directory, `{out}` ({len(base)} cells of the presses' own masks, "
             f"{int(df['restore'].notna().sum())} restored cells); the report is `kvroute report {out}`."]
    if seconds:
        lines.append("Phase wall times here: " + ", ".join(f"{k} {v / 60:.1f} min" for k, v in seconds.items()) + ".")
    lines += ["", "Sweep sessions that filled the run (from the manifests; wall time, cells computed):", ""]
    lines += _sessions(out) + _sessions(heads)
    counts = base.groupby(["model", "family"])["instance_id"].nunique().reset_index(name="n")
    lines += ["", "Instances per (model, family): " + "; ".join(
        f"{r.model} {r.family} {r.n}" for r in counts.itertuples()) + ".", ""]
    lines += ["## α* per model, family and press", "",
              "The fitted sigmoid midpoint of H(α) with its 95% bootstrap interval over instances (the report's "
              "section 2b; long_context is in the next table). H(0): the full cache's hallucination rate. An end "
              "shown as – is not identified (too many replicates past the grid's edge); family `all` pools the "
              "families, given only when every model ran the same instances.", ""]
    from kvroute.analysis.size import target_label

    rows = [dict(r, ci=_interval(r.get("alpha_star_low"), r.get("alpha_star_high")),
                 params=target_label(r["params"]) if r.get("params") else None)
            for r in summary.get("size_cliffs") or []]
    lines += md_table(rows, [("family", "family"), ("press", "press"), ("model", "model"), ("params", "parameters"),
                           ("n_instances", "n"), ("h0", "H(0)"), ("alpha_star", "α*"), ("ci", "95% CI"),
                           ("status", "fit")])
    lines += ["", "## α* against model size: trend and projection", "",
              "Least squares of logit α* on log10 N per (family, press), intervals from a joint bootstrap over "
              "instances (only replicates that identify α* in every model count). An extrapolation beyond the "
              "largest model measured.", ""]
    lines += md_table(_trend_rows(summary.get("size_trends") or []), TREND_COLS)
    lines += _qwen_only(base)
    lines += ["", "## α* against context length (long_context)", ""]
    lrows = [dict(r, ci=_interval(r.get("alpha_star_low"), r.get("alpha_star_high")),
                  budget_star=_tokens(r.get("budget_star")),
                  bci=_interval(_tokens(r.get("budget_star_low")), _tokens(r.get("budget_star_high"))))
             for r in summary.get("length_cliffs") or []]
    h0 = _length_baseline(base)
    for r in lrows:
        r["h0"] = h0.get((r["model"], r["T"]))
    lines += md_table(lrows, [("model", "model"), ("press", "press"), ("T", "T"), ("n_instances", "n"), ("h0", "H(0)"),
                            ("alpha_star", "α*"), ("ci", "95% CI"), ("budget_star", "budget* (tokens)"),
                            ("bci", "95% CI"), ("status", "fit")])
    lines += [""]
    vrows = [dict(r, bci=_interval(r.get("beta_low"), r.get("beta_high")))
             for r in summary.get("length_verdicts") or []]
    lines += md_table(vrows, [("model", "model"), ("press", "press"), ("n_lengths", "lengths fitted"),
                            ("beta", "β (0 fixed budget, 1 fixed ratio)"), ("bci", "95% CI"), ("verdict", "verdict")])
    lines += ["", "## Causal restoration (base)", "",
              "Among the failures compression caused (the instance's full cache answered correctly), the share the "
              "restored cell answers correctly; all failure classes and the four presses pooled per "
              "(condition, ratio), so one instance gives up to four failures: the 95% interval is Wilson's on the "
              "failures over their design effect across instances (never narrower than Wilson's on the failures, "
              "never wider than Wilson's on the instances; `kvroute.analysis.restoration.pooled_restoration`). "
              "The retrieval heads come from the full caches of other instances "
              f"(`{heads}`).", ""]
    lines += _head_counts(heads)
    pooled = pooled_restoration(df, by=["model", "restore", "ratio"])
    rrows = [dict(r, ci=_interval(r["low"], r["high"])) for r in pooled.to_dict("records")]
    lines += md_table(rrows, [("model", "model"), ("restore", "condition"), ("ratio", "α"),
                            ("n_instances", "instances"), ("failures", "failures"), ("repaired", "repaired"),
                            ("listed", "listed (not repaired)"), ("share", "share"), ("ci", "95% CI")])
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("runs/cliff_study"))
    ap.add_argument("--heads", type=Path, default=None, help="run directory of the heads phase (default OUT-heads)")
    ap.add_argument("--phases", default=",".join(PHASES))
    ap.add_argument("--report-only", action="store_true", help="run no phase: report on what the run holds")
    args = ap.parse_args()
    out = args.out.resolve()
    heads = (args.heads or out.with_name(out.name + "-heads")).resolve()
    phases = [] if args.report_only else [p.strip() for p in args.phases.split(",") if p.strip()]
    unknown = [p for p in phases if p not in PHASES]
    if unknown:
        print(f"unknown phase(s) {', '.join(unknown)}; choose from {', '.join(PHASES)}", file=sys.stderr)
        return 2
    seconds = {p: run_phase(p, out, heads) for p in phases}
    subprocess.run([KVROUTE, "report", str(out)], check=True)
    cmd = "python benchmarks/cliff_study.py" + (" --report-only" if args.report_only else "")
    body = report_tables(out, heads, seconds)
    write("cliff_study", ["# Where the cliff sits: model size, context length, causal restoration (CPU study)", "",
                          f"`{cmd}` — {environment()}", "", *body])
    return 0


if __name__ == "__main__":
    sys.exit(main())
