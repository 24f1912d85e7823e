"""``kvroute tasks``: task families (list, generate, show) and real datasets (import, niah, grid)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table
from rich.text import Text

from kvroute.cli.core import (
    _App,
    app,
)
from kvroute.cli.tasks_import import register as register_import
from kvroute.console import RichProgress, console, print_json, print_table

tasks_app = _App(help="Task families and real datasets: list, generate, show, import, niah, grid.",
                 no_args_is_help=True)
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
    print_table(t, console)
    console.print(f"knobs (kvroute tasks generate --help): {', '.join(get_family('base').describe()['knobs'])}")


@tasks_app.command("generate")
def tasks_generate(
    families: Annotated[list[str], typer.Argument(help="Family names, or 'all'.")],
    out: Annotated[Path, typer.Option("--out", "-o", help="JSONL file to write.")],
    n: Annotated[int, typer.Option("--n", help="Instances per family.")] = 10,
    seed: Annotated[int, typer.Option("--seed", help="Generator seed (same seed, same bytes).")] = 0,
    difficulty: Annotated[int, typer.Option("--difficulty", "-d", help="Family level (see `tasks list`).")] = 1,
    target_tokens: Annotated[int | None, typer.Option(help="Pad contexts with filler "
                                                           "to about this many tokens.")] = None,
    depth: Annotated[float | None, typer.Option(help="Where the facts sit in the filler, 0 (start) … 1 (end).")] = None,
    distractors: Annotated[int | None, typer.Option(help="Distractor entities/values (default: the level's).")] = None,
    unanswerable_share: Annotated[float | None, typer.Option(help="Share of unanswerable items (coreference).")] = None,
    answer_type: Annotated[list[str] | None, typer.Option("--answer-type",
                                                          help="Only these answer types (repeat).")] = None,
    question_type: Annotated[list[str] | None, typer.Option("--question-type",
                                                            help="Only these question types (repeat).")] = None,
    tokenizer: Annotated[str | None, typer.Option("--tokenizer",
                                                  help="Model whose tokenizer measures --target-tokens.")] = None,
    questions: Annotated[int, typer.Option("--questions", help="Questions per context (the multi-question form: "
                                                                "each context about this many people, one "
                                                                "instance per question, asked in turn by a run "
                                                                "with decoding.history).")] = 1,
) -> None:
    """Generate task instances of one or more families into a JSONL file."""
    from kvroute.tasks import FAMILIES, TaskSpec, generate_tasks, get_family, save_tasks

    get_family("base")
    names = FAMILIES.names() if families == ["all"] else families
    specs = [TaskSpec(f, n=n, seed=seed, difficulty=difficulty, target_tokens=target_tokens, depth=depth,
                      distractors=distractors, unanswerable_share=unanswerable_share,
                      answer_types=tuple(answer_type) if answer_type else None,
                      question_types=tuple(question_type) if question_type else None, questions=questions)
             for f in names]
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
    max_chars: Annotated[int | None, typer.Option(help="Cut long contexts after this many characters, 0: never "
                                                       "(default: 2000 at a terminal, never elsewhere).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the instances as JSON: a list of objects, as the "
                                                         "task file holds them (contexts whole).")] = False,
) -> None:
    """Show instances readably: evidence underlined, answers green, distractors red."""
    from kvroute.tasks import load_tasks
    from kvroute.tasks.show import LEGEND, instance_panel

    instances = load_tasks(file)
    shown = instances[skip:skip + n]
    if as_json:
        print_json([inst.to_dict() for inst in shown])
        return
    if max_chars is None:  # a pipe or a file gets the whole context: nothing it holds is cut
        max_chars = 2000 if console.is_terminal else 0
    console.print(Text.assemble(f"{file}: {len(instances)} instances   ", LEGEND))
    for inst in shown:
        console.print(instance_panel(inst, max_chars=max_chars or None, width=console.width))


register_import(tasks_app)  # tasks import | niah | grid
