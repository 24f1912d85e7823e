"""``kvroute restore-map``: where in the network a run's failing cell needs its answer back."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Annotated

import typer

from kvroute.cli.core import app
from kvroute.console import RichProgress, console


@app.command("restore-map")
def restore_map_cmd(
    run: Annotated[Path, typer.Argument(help="Sweep run directory (manifest.json, store.sqlite, tasks/).")],
    instance: Annotated[str, typer.Option("--instance", help="Instance id (or a unique prefix) from the run.")],
    cell: Annotated[str, typer.Option("--cell", help="The compressed cell, PRESS@RATIO as the run names it, "
                                                     "e.g. snapkv@0.9.")],
    target: Annotated[str, typer.Option(help="What is restored in each slot: answer, evidence or span:FIRST-LAST "
                                             "(context token positions).")] = "answer",
    model: Annotated[str | None, typer.Option(help="The run's model (needed when it has several).")] = None,
    minimal: Annotated[bool, typer.Option("--minimal/--no-minimal", help="Also find the minimal repairing set "
                                                                        "(greedy by effect).")] = True,
    as_json: Annotated[bool, typer.Option("--json", help="Print the map as JSON instead of the table.")] = False,
    out: Annotated[Path | None, typer.Option("--out", "-o", help="Also write the map as JSON to this file.")] = None,
) -> None:
    """Restore the target in one (layer, KV head) slot at a time and print each slot's repair effect.

    Effect: the gold log-probability normalised so that 0 is the compressed cell and 1 the full cache.

    A slot marked * answers correctly on its own. Cells are kept in RUN_DIR/restore_map/: a rerun reuses them.
    """
    from kvroute.restore_map import restore_map_of_run, run_cell

    rc = run_cell(run, instance, cell, model=model)
    m = restore_map_of_run(rc, target=target, minimal=minimal, progress=RichProgress())
    data = m.to_dict()
    if out is not None:
        out.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    if as_json:
        typer.echo(json.dumps(data, ensure_ascii=False))
        return
    for line in map_lines(m, rc.model.name):
        console.print(line, highlight=False, markup=False)
    if out is not None:
        console.print(f"[green]wrote[/green] {out}")


def _cell(x: float, ok: bool) -> str:
    return ("    ·" if math.isnan(x) else f"{x:+5.2f}") + ("*" if ok else " ")


def map_lines(m, model: str) -> list[str]:  # noqa: ANN001  (a RestoreMap; kept import-free for --help)
    """The map as text: one row per layer, one column per KV head, then the controls and the minimal set."""
    L, Hkv = m.effect.shape
    head = f"restore map: {model}, instance {m.instance_id}, {m.press}@{m.ratio:g}, target {m.target}"
    lines = [head, f"full cache: {m.full.get('answer')!r} ({m.full.get('outcome')}); compressed: "
                   f"{m.compressed.get('answer')!r} ({m.compressed.get('outcome')})"
             + ("" if m.failure else "  [not a failure compression caused]"),
             "effect on the gold log-probability (0 = compressed, 1 = full cache; * = repaired alone)", "",
             "layer " + "".join(f"  kv{h:<4}" for h in range(Hkv))]
    for layer in range(L):
        lines.append(f"{layer:>5} " + "".join(f"  {_cell(float(m.effect[layer, h]), bool(m.repaired[layer, h]))}"
                                              for h in range(Hkv)))
    best = m.order[0]
    lines += ["", f"largest effect: slot {best[0]}.{best[1]} ({float(m.effect[best]):+.3f}); "
                  f"{int(m.repaired.sum())} of {L * Hkv} slots repair alone",
              f"every slot at once ({m.target}): {m.every_slot.get('answer')!r} ({m.every_slot.get('outcome')})"]
    if m.minimal is None:
        lines.append("minimal repairing set: none (restoring every slot does not repair)" if m.every_slot
                     else "minimal repairing set: not searched")
    else:
        lines.append(f"minimal repairing set: {len(m.minimal)} slot(s): "
                     + (", ".join(f"{a}.{b}" for a, b in m.minimal) or "(none needed: the cell is correct)"))
    lines.append("controls: " + ", ".join(f"{k} {'✔' if v else '✘'}" for k, v in m.checks.items()))
    lines.append(f"{m.computed} cells computed in {m.seconds:.1f} s (the rest read from the store)")
    return lines
