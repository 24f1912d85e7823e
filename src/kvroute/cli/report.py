"""``kvroute report``: a run's records analysed into report.html, summary.json and figures/."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer

from kvroute.cli.core import (
    app,
)
from kvroute.console import RichProgress, console


@app.command()
def report(
    run: Annotated[Path, typer.Argument(help="Run directory (store.sqlite + manifest.json) "
                                             "or a .parquet/.csv/.jsonl records file.")],
    out: Annotated[Path | None, typer.Option("--out", "-o", help="Output folder (default: RUN_DIR/report).")] = None,
    title: Annotated[str, typer.Option(help="Report title.")] = "kvroute report",
    n_boot: Annotated[int, typer.Option(help="Bootstrap replicates (resampling instances).")] = 1000,
    delta: Annotated[float, typer.Option(help="Safe ratio: allowed rise of the hallucination rate "
                                              "over the baseline.")] = 0.05,
    seed: Annotated[int, typer.Option(help="Bootstrap seed.")] = 0,
) -> None:
    """Analyse a run's records and write report.html, summary.json and figures/."""
    from kvroute.analysis.summary import AnalysisConfig
    from kvroute.bounds import check_seed
    from kvroute.report.build import build_run_report

    check_seed(seed, "--seed")  # before any record is read
    t0 = time.perf_counter()
    path = build_run_report(run, out, title=title, config=AnalysisConfig(n_boot=n_boot, delta=delta, seed=seed),
                            progress=RichProgress())
    console.print(f"[green]wrote[/green] {path} (+ summary.json, figures/) in {time.perf_counter() - t0:.1f} s")


@app.command("findings")
def findings_cmd(
    summary: Annotated[Path, typer.Argument(help="A report's summary.json (RUN_DIR/report/summary.json).")],
    league: Annotated[bool, typer.Option("--league", help="Print the press league as a Markdown table "
                                                          "instead.")] = False,
    keep: Annotated[Path | None, typer.Option("--keep", help="Also write the part of the summary the findings are "
                                                             "written from to this file (for docs that quote "
                                                             "them).")] = None,
) -> None:
    """Print a finished report's headline findings (or its press league), as the docs quote them."""
    import json

    from kvroute.errors import KvrouteError
    from kvroute.report.findings import findings_lines, findings_summary
    from kvroute.report.league import league_markdown

    try:
        data = json.loads(summary.read_text(encoding="utf-8-sig"))
    except RecursionError:
        raise KvrouteError(f"cannot read {summary} as a report's summary.json: nested too deep") from None
    except (OSError, ValueError) as e:
        raise KvrouteError(f"cannot read {summary} as a report's summary.json: {e}") from e
    if keep is not None:
        from kvroute.files import check_not_input

        check_not_input(keep, {"the summary read": summary}, "--keep")
    for line in league_markdown(data.get("press_league") or []) if league else findings_lines(data):
        typer.echo(line)
    if keep is not None:
        keep.write_text(json.dumps(findings_summary(data), indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
