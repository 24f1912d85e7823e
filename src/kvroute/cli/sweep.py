"""``kvroute sweep`` and ``export``: grids of cells into a run folder, and its records out."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from kvroute.cli.core import (
    _csv,
    _resume_command,
    app,
)
from kvroute.console import SweepProgress, console
from kvroute.errors import KvrouteError


@app.command()
def sweep(
    config: Annotated[Path, typer.Argument(help="Sweep config (.toml, .yaml or .json); see docs/running.md, Sweeps.")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Run directory: store.sqlite, manifest.json, tasks/.")],
    backend: Annotated[str, typer.Option(help="local (this process) or ray "
                                              "(a Ray cluster, pip install 'kvroute\\[ray]').")] = "local",
    resume: Annotated[bool, typer.Option("--resume",
                                         help="Continue a run in --out: compute only the missing cells.")] = False,
    retry_errors: Annotated[bool, typer.Option("--retry-errors", help="With --resume: compute the cells that errored "
                                               "(status \"error\") again; "
                                               "a resume otherwise counts them as done.")] = False,
    ray_address: Annotated[str | None, typer.Option("--ray-address",
                                                    help="Ray cluster address (default: ray.init()'s choice).")] = None,
    set_: Annotated[list[str] | None, typer.Option("--set",
                                                   help="Override a config key: "
                                                        "--set decoding.max_new_tokens=16 (repeat).")] = None,
    models: Annotated[str | None, typer.Option("--models",
                                               help="Override models: comma-separated names or folders.")] = None,
    press: Annotated[list[str] | None, typer.Option("--press", "-p",
                                                    help="Override presses (repeat for several).")] = None,
    ratios: Annotated[str | None, typer.Option("--ratios", help="Override ratios, e.g. 0,0.5,0.9.")] = None,
    regimes: Annotated[str | None, typer.Option("--regimes", help="Override regimes: agnostic,aware.")] = None,
    seeds: Annotated[str | None, typer.Option("--seeds", help="Override seeds, e.g. 0,1,2.")] = None,
    max_new_tokens: Annotated[int | None, typer.Option(help="Override decoding.max_new_tokens.")] = None,
    attention_backend: Annotated[str | None, typer.Option(
        "--attention-backend", help="Override decoding.attention_backend: auto, or one of reference, sdpa, gathered, "
                                    "chunked, fused, kept (docs/performance.md).")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run",
                                          help="Validate and show the grid; load no model, write nothing.")] = False,
    new_settings: Annotated[bool, typer.Option("--new-settings", help="With --resume: add cells with settings that "
                                               "differ from the run's "
                                               "(refused otherwise, so runs do not mix).")] = False,
) -> None:
    """Run a sweep config's grid of cells into a crash-safe, resumable store, with a progress bar and a summary."""
    import json

    from kvroute.sweep import load_sweep_config, run_sweep

    overrides = list(set_ or [])
    for key, values in (("models", _csv(models)), ("presses", press), ("ratios", _csv(ratios, float, "--ratios")),
                        ("regimes", _csv(regimes)), ("seeds", _csv(seeds, int, "--seeds"))):
        if values:
            overrides.append(f"{key}={json.dumps(values)}")
    if max_new_tokens is not None:
        overrides.append(f"decoding.max_new_tokens={max_new_tokens}")
    if attention_backend is not None:
        overrides.append(f"decoding.attention_backend={json.dumps(attention_backend)}")
    from kvroute.sweep.driver import check_backend

    check_backend(backend)  # before --dry-run, which plans without running
    if new_settings and not resume:
        raise KvrouteError("--new-settings adds settings to an existing run; use it with --resume")
    cfg = load_sweep_config(config, overrides)
    from kvroute.files import check_not_input
    from kvroute.sweep.export import run_inputs

    inputs = {"the sweep config": config, **{f"the task file of tasks[{i}]": t.file for i, t in enumerate(cfg.tasks)}}
    for kind, path in run_inputs(out).items():  # the run writes its store and manifest: neither may be an input
        check_not_input(path, inputs, what=f"{kind} under --out")
    if dry_run:
        from kvroute.sweep.driver import size_sweep

        d = size_sweep(cfg)  # sized, not generated: a dry run builds no task
        q = d["questions_per_unit"]
        turns = "" if q == 1 else f" × {q:g} questions in turn" if q == int(q) else f" × {q:.2f} questions (mean)"
        console.print(f"[green]valid[/green] {config}: {d['cells']} cells = {d['units']} units (prefills) × "
                      f"{d['cells_per_unit']} cells{turns}; models {', '.join(d['models'])}; instances per model "
                      f"{', '.join(f'{k}: {v}' for k, v in d['instances'].items())}"
                      + (f"; each compressed cell also restored: {', '.join(d['restore'])}" if d["restore"] else "")
                      + (f"; retrieval heads (score ≥ 0.1, from {cfg.retrieval_heads}): "
                         + ", ".join(f"{k}: {v}" for k, v in d["retrieval_heads"].items())
                         if d.get("retrieval_heads") else ""))
        return
    try:
        res = run_sweep(cfg, out, backend=backend, resume=resume, ray_address=ray_address,
                        progress=SweepProgress(), retry_errors=retry_errors, new_settings=new_settings)
    except KeyboardInterrupt:
        from kvroute.errors import Interrupted

        raise Interrupted(f"interrupted; the finished cells are kept in {out}; resume with "
                          f"{_resume_command()}") from None
    console.print(f"[green]done[/green] {res.computed} cells computed, {res.already_done} already in the store "
                  f"({res.total_cells} in the grid) in {res.seconds:.1f} s → {out}")
    _summary_table(res.summary)
    if res.errors:
        n = sum(e["n"] for e in res.errors)
        console.print(f"[yellow]{n} of {res.total_cells} cells errored[/yellow] (status \"error\", left out of the "
                      f"analysis; --resume --retry-errors computes them again):", highlight=False)
        for e in res.errors[:5]:
            console.print(f"  {e['n']} × {escape(str(e['press']))} ({escape(str(e['model']))}): "
                          f"{escape(str(e['error']))}", highlight=False)


def _summary_table(rows: list[dict]) -> None:
    if not rows:
        return
    regimes = len({r["regime"] for r in rows}) > 1
    errors = any(r.get("errors") for r in rows)
    restores = any(r.get("restore") for r in rows)
    t = Table(title="summary (means over instances)")
    for col in ("model", *(["regime"] if regimes else []), "press", "ratio", *(["restore"] if restores else []), "n",
                *(["errored"] if errors else []),
                "F1", "halluc. rate", "GER"):
        t.add_column(col, justify="left" if col in ("model", "regime", "press", "restore") else "right",
                     overflow="fold")  # a narrow terminal wraps a press name rather than cutting its parameters

    def f(v: float | None) -> str:
        return "-" if v is None else f"{v:.3f}"

    for r in rows:
        cells = [str(r["model"]), *([str(r["regime"])] if regimes else []), str(r["press"]), f"{r['ratio']:g}",
                 *([str(r.get("restore") or "-")] if restores else []), str(r["n"]),
                 *([str(r.get("errors") or 0)] if errors else []), f(r["f1"]), f(r["hallucination_rate"]), f(r["ger"])]
        t.add_row(*(Text(c) for c in cells))  # Text, not markup: snapkv[window_size=8] keeps its brackets
    console.print(t)


@app.command("export")
def export(
    run: Annotated[Path, typer.Argument(help="Run directory a sweep wrote (holds store.sqlite).")],
    fmt: Annotated[str, typer.Option("--format", "-f", help="parquet or csv.")] = "parquet",
    out: Annotated[Path | None, typer.Option("--out", "-o",
                                             help="Output file (default: RUN_DIR/records.FORMAT).")] = None,
) -> None:
    """Export a run store's records to one Parquet or CSV file (lists as list columns / JSON text)."""
    from kvroute.sweep.export import export_records

    path, n = export_records(run, fmt, out)
    console.print(f"[green]wrote[/green] {n} records to {path}")
