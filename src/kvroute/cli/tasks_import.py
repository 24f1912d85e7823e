"""``kvroute tasks import | niah | grid``: real datasets, needle grids, and their depth × length tables.

Part of the CLI (this module prints); :func:`register` adds the commands to the ``tasks`` sub-app.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from kvroute.cli.core import parse_list


def _model_window(source: str) -> int | None:
    """``max_position_embeddings`` of a zoo model or model folder (no weights loaded), else None."""
    import json

    from kvroute.models.fetch import pull
    from kvroute.models.zoo import ZOO

    path = Path(source).expanduser()
    if source in ZOO:
        path = pull(ZOO.get(source))
    cfg = path / "config.json"
    if path.is_dir() and cfg.is_file():
        value = json.loads(cfg.read_text(encoding="utf-8-sig")).get("max_position_embeddings")
        return int(value) if isinstance(value, int) else None
    return None


def register(tasks_app: typer.Typer) -> None:
    """Add ``import``, ``niah`` and ``grid`` to ``tasks_app``."""

    @tasks_app.command("import")
    def tasks_import(
        source: Annotated[str, typer.Argument(help="A .parquet/.csv/.tsv/.jsonl/.json file, "
                                                   "or a Hugging Face dataset id (org/name).")],
        out: Annotated[Path, typer.Option("--out", "-o", help="JSONL task file to write (kvroute format).")],
        layout: Annotated[str | None, typer.Option(help="kvpress or ruler "
                                                        "(default: detected from the columns).")] = None,
        family: Annotated[str | None, typer.Option(help="Task name for rows without a 'task' column "
                                                        "(default: file stem).")] = None,
        config: Annotated[str | None, typer.Option(help="Hub dataset configuration (subset).")] = None,
        split: Annotated[str | None, typer.Option(help="Hub dataset split (default: test).")] = None,
        model: Annotated[str | None, typer.Option("--model", "-m",
                                                  help="Model whose tokenizer and window limit lengths.")] = None,
        tokenizer: Annotated[str | None, typer.Option(help="Model whose tokenizer measures lengths "
                                                           "(window: --max-tokens).")] = None,
        max_tokens: Annotated[int | None, typer.Option(help="Window: prompt + max_new_tokens must fit "
                                                            "(default: the model's).")] = None,
        truncate: Annotated[str | None, typer.Option(help="'middle': cut too-long contexts in the middle "
                                                          "instead of skipping them.")] = None,
        limit: Annotated[int | None, typer.Option(help="Only the first N rows.")] = None,
    ) -> None:
        """Import an existing dataset (kvpress evaluation layout or RULER) as kvroute task instances.

        Answers are located in each context (case-, whitespace- and quote-tolerant, every occurrence);
        rows whose answers never occur are kept and marked evidence none. Prints a summary per task.
        """
        from kvroute.console import RichProgress, console
        from kvroute.errors import ConfigError
        from kvroute.files import check_not_input
        from kvroute.tasks import save_tasks
        from kvroute.tasks.importers import ImportOptions, import_tasks

        check_not_input(out, {"the dataset imported": source if Path(source).is_file() else None})
        if model and tokenizer:
            raise ConfigError("give --model or --tokenizer, not both")
        tok = None
        source_model = model or tokenizer
        if source_model:
            from kvroute.models import load_tokenizer

            tok = load_tokenizer(source_model, progress=RichProgress())
            if max_tokens is None and model:
                max_tokens = _model_window(model)
                if max_tokens is None:
                    raise ConfigError(f"cannot read the context window of {model!r}; give --max-tokens")
        elif max_tokens is not None or truncate is not None:
            raise ConfigError("--max-tokens and --truncate count tokens: give --model or --tokenizer")
        opts = ImportOptions(layout=layout, family=family, config=config, split=split, max_tokens=max_tokens,
                             truncate=truncate, limit=limit)
        t0 = time.perf_counter()
        res = import_tasks(source, opts, tokenizer=tok, progress=RichProgress())
        save_tasks(res.instances, out)
        console.print(import_summary_table(res))
        console.print(f"[green]wrote[/green] {len(res.instances)} instances ({res.layout} layout) to {out} "
                      f"in {time.perf_counter() - t0:.1f} s")

    @tasks_app.command("niah")
    def tasks_niah(
        out: Annotated[Path, typer.Option("--out", "-o", help="File to write (JSONL).")],
        length: Annotated[list[str], typer.Option("--length", "-l",
                                                  help="Context lengths in tokens "
                                                       "(repeat or comma-separate).")] = ["1000"],  # noqa: B006
        depth: Annotated[list[str], typer.Option("--depth", "-d",
                                                 help="Needle depths in [0, 1] "
                                                      "(repeat or comma-separate).")] = ["0,0.25,0.5,0.75,1"],  # noqa: B006
        n: Annotated[int, typer.Option("--n", help="Instances per (length, depth) cell.")] = 1,
        seed: Annotated[int, typer.Option(help="Generator seed.")] = 0,
        haystack: Annotated[Path | None, typer.Option(help="UTF-8 text to hide the needle in "
                                                           "(default: kvroute's shipped essays).")] = None,
        needle: Annotated[str | None, typer.Option(help="Needle template with {key} and {value}.")] = None,
        question: Annotated[str | None, typer.Option(help="Question template with {key}.")] = None,
        layout: Annotated[str, typer.Option(help="kvroute (task file), ruler or kvpress "
                                                 "(rows to import or run elsewhere).")] = "kvroute",
        tokenizer: Annotated[str | None, typer.Option(help="Model whose tokenizer measures lengths "
                                                           "(default: word estimate).")] = None,
    ) -> None:
        """Generate a needle-in-a-haystack grid (length × depth) over any text."""
        import json

        from kvroute.console import RichProgress, console
        from kvroute.errors import ConfigError
        from kvroute.tasks import save_tasks
        from kvroute.tasks.families.niah import EXPORT_LAYOUTS, NEEDLE, QUESTION, NiahSpec, generate_niah, niah_rows
        from kvroute.tasks.text import TokenCounter

        if layout not in EXPORT_LAYOUTS:
            raise ConfigError(f"--layout {layout!r}: use one of {', '.join(EXPORT_LAYOUTS)}")
        from kvroute.files import check_not_input

        check_not_input(out, {"the --haystack text": haystack})
        lengths, depths = parse_list(length, int, "--length") or [], parse_list(depth, float, "--depth") or []
        spec = NiahSpec(lengths=tuple(lengths), depths=tuple(depths), n=n, seed=seed, haystack=haystack,
                        needle=NEEDLE if needle is None else needle,
                        question=QUESTION if question is None else question)
        tok = None
        if tokenizer is not None:
            from kvroute.models import load_tokenizer

            tok = load_tokenizer(tokenizer, progress=RichProgress())
        t0 = time.perf_counter()
        instances = generate_niah(spec, tok)
        if layout == "kvroute":
            save_tasks(instances, out)
        else:
            rows = niah_rows(instances, layout, count=TokenCounter(tok))
            out.parent.mkdir(parents=True, exist_ok=True)
            from kvroute.files import atomic_write

            with atomic_write(out) as f:
                f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
        console.print(f"[green]wrote[/green] {len(instances)} niah instances ({len(spec.lengths)} lengths × "
                      f"{len(spec.depths)} depths × {n}, haystack {spec.haystack_name}, {layout} layout) to {out} "
                      f"in {time.perf_counter() - t0:.1f} s")

    @tasks_app.command("grid")
    def tasks_grid(
        records: Annotated[Path, typer.Argument(help="Records: a run directory "
                                                     "or a .jsonl/.parquet/.csv records file.")],
        tasks: Annotated[Path, typer.Option("--tasks", "-t", help="The task file the run used.")],
        by: Annotated[list[str], typer.Option("--by",
                                              help="Meta keys to group by "
                                                   "(repeat or comma-separate).")] = ["target_length,depth"],  # noqa: B006
    ) -> None:
        """Accuracy, GER and reachability per (press, ratio) and task-meta cell, e.g. niah length × depth."""
        from rich.markup import escape

        from kvroute.analysis.grid import meta_table
        from kvroute.analysis.load import load_records
        from kvroute.console import console
        from kvroute.tasks import load_tasks

        keys = [k for v in by for k in v.split(",") if k.strip()]
        table = meta_table(load_records(records), load_tasks(tasks), keys)
        for press, g in table.groupby("press", sort=False):
            console.print(grid_table(g, keys, title=f"press {escape(str(press))}"))


def _fmt(v: Any, digits: int = 2) -> str:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return str(v)
    return "—" if f != f else f"{f:.{digits}f}"


def grid_table(df: Any, keys: list[str], title: str) -> Table:
    """Rows = meta cells, columns = ratios; each cell ``accuracy · GER · reachable`` (routed)."""
    ratios = sorted(df["ratio"].unique())
    t = Table(title=f"{title}: accuracy · GER · reachable (routed)", show_lines=False)
    for k in keys:
        t.add_column(k)
    for r in ratios:
        t.add_column(f"ratio {_fmt(r)}", justify="right")
    for cell, g in df.groupby(keys, sort=True, dropna=False):
        cell = cell if isinstance(cell, tuple) else (cell,)
        row = [str(c) for c in cell]
        for r in ratios:
            x = g[g["ratio"] == r]
            if x.empty:
                row.append("")
                continue
            x = x.iloc[0]
            s = f"{_fmt(x.accuracy)} · {_fmt(x.ger)} · {_fmt(x.reachable)} ({_fmt(x.routed_reachable)})"
            if x.no_evidence:
                s += f" [{int(x.no_evidence)} no-ev]"
            row.append(s)
        t.add_row(*row)
    return t


def import_summary_table(res: Any) -> Table:
    """The per-task summary of an import (and a total row when there are several tasks)."""
    from dataclasses import fields

    from kvroute.tasks.importers import TaskCounts

    cols = [f.name for f in fields(TaskCounts)]
    labels = {"instances": "written", "with_spans": "spans found", "evidence_none": "evidence none",
              "skipped_too_long": "too long (skipped)", "duplicates": "dupes"}
    title = f"imported {res.source} ({res.layout} layout)"
    if res.max_tokens is not None:
        title += f", window {res.max_tokens} tokens ({res.tokens_counted_with})"
    t = Table(title=title)
    for c in cols:
        t.add_column(labels.get(c, c), justify="left" if c == "task" else "right", overflow="fold")
    rows = list(res.summary) + ([res.totals()] if len(res.summary) > 1 else [])
    for c in rows:
        d = c.as_dict()
        t.add_row(*[str(d[k]) for k in cols], style="bold" if c.task == "all" and len(res.summary) > 1 else None)
    return t
