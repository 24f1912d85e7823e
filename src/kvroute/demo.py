"""The main job: a compression study on the embedded default model, ending in a report.

``kvroute demo`` (and ``make demo``) pulls the model(s) (Qwen2.5-0.5B by default), generates a task
suite, sweeps a ratio grid dense near the top over the paper's press (Expected Attention with AdaKV),
per-head Expected Attention, classic ones, KVzip and kvroute's route-preserving selection, searches token-route lottery
tickets for a few instances, saves one instance's keep-mask for the survival heatmap, writes the
report, and returns the headline findings. The run directory is an ordinary sweep run: re-running
the demo resumes it, and ``kvroute report RUN_DIR`` redraws the report.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvroute.config import DEFAULT_MAX_NEW_TOKENS
from kvroute.progress import SILENT, Progress

if TYPE_CHECKING:
    from kvroute.models.loading import LoadedModel
    from kvroute.tasks.instance import TaskInstance

log = logging.getLogger(__name__)

#: the model the demo studies by default: Qwen2.5-0.5B answers the level-1 tasks right uncompressed (F1 0.70-0.98
#: per family, benchmarks/CALIBRATION.md), so nearly every instance carries information about what compression
#: does; SmolLM2-135M fails about 70% of them uncompressed (its former demo: 19 of 64 informative instances)
DEMO_MODEL = "qwen2.5-0.5b"
#: dense where Qwen2.5-0.5B's cliff lies (α* 0.7-0.9 in benchmarks/results/mask_controls_qwen2.5-0.5b.md)
DEMO_RATIOS = (0.0, 0.5, 0.7, 0.8, 0.85, 0.9, 0.95)
DEMO_PRESSES = (
    "expected_attention+adakv",  # the paper's press
    "expected_attention",  # per-head top-k of the same scores
    "expected_attention+routes",  # kvroute's route-preserving selection
    "snapkv[window_size=16]",  # kvpress's 64-token window would cover most of a CPU-sized context
    "streaming_llm",
    "kvzip",  # context reconstruction, the strongest press of kvpress's RULER leaderboard (its own replay forward)
)
#: (family, difficulty, instances) of the default suite; contexts stay short except long_context. Sized so that the
#: whole demo (sweep, tickets, report) takes about 15 min on a 2-core CPU (Qwen2.5-0.5B decodes ~2.8x slower per
#: cell than SmolLM2-135M: benchmarks/results/mask_controls*.md)
DEMO_FAMILIES = (("base", 1, 6), ("knowledge", 1, 4), ("multi_entity", 1, 3), ("multi_presence", 1, 3),
                 ("coreference", 1, 3), ("hops", 1, 4))
#: long_context at four lengths spanning 10x, for α* against context length
DEMO_LENGTHS = ((200, 2), (400, 2), (800, 2), (2000, 2))
SURVIVAL_PRESS, SURVIVAL_RATIO = "expected_attention+adakv", 0.9


def check_demo_options(*, scale: float = 1.0, tickets: int = 0, report_boot: int = 1000) -> None:
    """Refuse options the demo would silently bend (a negative scale runs one instance per family)."""
    import math

    from kvroute.errors import ConfigError

    if not (isinstance(scale, int | float) and math.isfinite(scale) and scale > 0):
        raise ConfigError(f"--scale {scale}: give a positive number (0.25 for a quick look, 1 for the full demo)")
    if tickets < 0:
        raise ConfigError(f"--tickets {tickets}: give 0 (no ticket search) or a positive number")
    if report_boot < 1:
        raise ConfigError(f"--n-boot {report_boot}: give a positive number of bootstrap replicates")


def demo_config(models: Sequence[str], *, scale: float = 1.0, seed: int = 0) -> dict[str, Any]:
    """The sweep config (as a mapping) of the demo; ``scale`` multiplies the instance counts."""
    check_demo_options(scale=scale)

    def n(k: int) -> int:
        return max(1, round(k * scale))

    tasks: list[dict[str, Any]] = [{"family": f, "difficulty": d, "n": n(k), "seed": seed} for f, d, k in DEMO_FAMILIES]
    tasks += [{"family": "long_context", "difficulty": 1, "n": n(k), "seed": seed, "target_tokens": t}
              for t, k in DEMO_LENGTHS]
    return {
        "name": "demo", "models": list(models), "tasks": tasks, "presses": list(DEMO_PRESSES),
        "ratios": list(DEMO_RATIOS), "regimes": ["agnostic"], "seeds": [seed],
        # "Answer:" after the template: the calibration's prefix (SmolLM2 base F1 0.30 → 0.46 with it)
        "decoding": {"max_new_tokens": 16, "batch_size": 64, "answer_prefix": "Answer:"},
    }


@dataclass
class DemoResult:
    run_dir: Path
    report: Path
    seconds: dict[str, float]
    findings: list[str]
    summary: dict[str, Any] = field(default_factory=dict)


def _save_survival(run_dir: Path, lm: LoadedModel, instance: TaskInstance) -> Path:
    """One instance's keep-mask under the survival press and ratio, for the report's heatmap."""
    from kvroute.engine.prefill import ScoreRequest, prefill
    from kvroute.presses import build_press
    from kvroute.report.heatmap import SurvivalExample, save_survival
    from kvroute.tasks.prompt import build_prompt

    prompt = build_prompt(lm.tokenizer, instance)
    press = build_press(SURVIVAL_PRESS)
    press.scorer.setup(lm.model)
    req = ScoreRequest.for_press(press, SURVIVAL_RATIO)
    pre = prefill(lm.model, prompt.context_ids, [req])
    mask = press.keep_mask(pre.scores[req.key], SURVIVAL_RATIO).mask.cpu().numpy()
    ev = [p for p in prompt.evidence_positions if p < prompt.n_context]
    ans = [p for p in prompt.answer_positions if p < prompt.n_context]
    tokens = [lm.tokenizer.decode([t]) for t in prompt.context_ids]
    title = f"{lm.name}, instance {instance.id} ({instance.family}): {SURVIVAL_PRESS} at ratio {SURVIVAL_RATIO}"
    return save_survival(run_dir / "masks" / f"{lm.name}-{instance.id}.npz",
                         SurvivalExample(mask, ev, tokens=tokens, answer=ans, title=title))


def run_tickets(run_dir: Path, lm: LoadedModel, instances: Sequence[TaskInstance], *, max_evaluations: int = 120,
                system_prompt: str | None = None, answer_prefix: str = "",
                max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS, progress: Progress = SILENT) -> int:
    """Search tickets for ``instances`` (skipping those the full cache answers wrongly); append to tickets.jsonl.

    ``system_prompt``, ``answer_prefix`` and ``max_new_tokens`` are the sweep's, so tickets answer the prompt the
    cells did and decode as long.
    """
    from kvroute.errors import EngineError
    from kvroute.tickets import TicketSettings, find_ticket, save_ticket

    settings = TicketSettings(max_evaluations=max_evaluations, max_new_tokens=max_new_tokens)
    done = 0
    for inst in instances:
        try:
            tk = find_ticket(lm, inst, settings=settings,
                             system_prompt=system_prompt, answer_prefix=answer_prefix, progress=progress)
        except EngineError as e:
            log.info("no ticket for %s: %s", inst.id, e)
            continue
        save_ticket(run_dir, lm.name, "gold", inst.family, tk)
        done += 1
    return done


def findings(summary: dict[str, Any], seconds: float, sweep_seconds: float | None = None) -> list[str]:
    """The report's headline findings (:func:`kvroute.report.findings.findings`, one writer for the report, the
    console and the docs), one ``label: sentence`` line each, then the wall time."""
    from kvroute.report.findings import findings_lines

    lines = [line.removeprefix("  • ") for line in findings_lines(summary)]
    line = f"wall time: {seconds / 60:.1f} min"
    if sweep_seconds is not None and sweep_seconds > seconds + 1:
        line += f" (this run resumed; the sweep's sessions took {sweep_seconds / 60:.1f} min in all)"
    lines.append(line)
    return lines


def run_demo(models: Sequence[str], run_dir: str | Path, *, scale: float = 1.0, tickets: int = 2,
             progress: Progress = SILENT, report_boot: int = 1000) -> DemoResult:
    """Run the whole study into ``run_dir`` (resuming it if it exists) and write its report."""
    from kvroute.analysis.load import load_manifest
    from kvroute.analysis.summary import AnalysisConfig
    from kvroute.analysis.tickets import load_tickets
    from kvroute.models import load_model
    from kvroute.report.build import build_run_report
    from kvroute.sweep import plan_sweep, run_sweep, sweep_config_from_mapping

    check_demo_options(scale=scale, tickets=tickets, report_boot=report_boot)
    run_dir = Path(run_dir)
    t0 = time.perf_counter()
    cfg = sweep_config_from_mapping(demo_config(models, scale=scale), source="kvroute demo")
    seconds: dict[str, float] = {}
    run_sweep(cfg, run_dir, resume=True, progress=progress)
    seconds["sweep"] = time.perf_counter() - t0
    # the instances the sweep used, per model, to pick ticket and survival examples
    plan = plan_sweep(cfg)
    t1 = time.perf_counter()
    # tickets already searched, per model: a resumed demo searches only what is missing
    have: set[tuple[str, str]] = set()
    if (run_dir / "tickets.jsonl").exists():
        done = load_tickets(run_dir)
        if not done.empty:
            have = set(zip(done["model"].astype(str), done["instance_id"].astype(str), strict=True))
    survival = None
    for spec in cfg.models:
        insts = [u.instance for u in plan.units if u.model == spec.name and u.instance.family == "base"]
        if not insts:
            continue
        lm = load_model(spec.name, device=spec.device, dtype=spec.dtype or "float32")
        mask_file = _save_survival(run_dir, lm, insts[0])
        if survival is None:
            survival = mask_file
        searched = sum(1 for m, _ in have if m == lm.name)
        todo = [i for i in insts if (lm.name, i.id) not in have][: max(0, tickets - searched)]
        if todo and tickets:
            run_tickets(run_dir, lm, todo, system_prompt=cfg.settings.system_prompt,
                        answer_prefix=cfg.settings.answer_prefix, max_new_tokens=cfg.settings.max_new_tokens,
                        progress=progress)
    seconds["tickets"] = time.perf_counter() - t1
    t2 = time.perf_counter()
    report = build_run_report(run_dir, title="kvroute demo study", config=AnalysisConfig(n_boot=report_boot),
                              survival_file=survival, progress=progress)
    seconds["report"] = time.perf_counter() - t2
    seconds["total"] = time.perf_counter() - t0
    summary = json.loads((run_dir / "report" / "summary.json").read_text())
    sessions = (load_manifest(run_dir) or {}).get("sessions", [])
    swept = sum(float(x.get("seconds") or 0) for x in sessions if isinstance(x, dict)) or None
    return DemoResult(run_dir, report, seconds, findings(summary, seconds["total"], swept), summary)
