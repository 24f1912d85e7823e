"""``kvroute presses``: the scorer and selection catalogue (list) and the equivalence check against kvpress (check)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from kvroute.cli.core import (
    _App,
    _csv,
    app,
    load_model_cli,
)
from kvroute.config import DEFAULT_MAX_NEW_TOKENS, check_max_new_tokens
from kvroute.console import RichProgress, console, print_json, print_table
from kvroute.errors import EngineError, KvrouteError

presses_app = _App(help="Scorers and selection strategies (a press is scorer or scorer+selection).",
                   no_args_is_help=True)
app.add_typer(presses_app, name="presses")


@presses_app.command("list")
def presses_list(
    as_json: Annotated[bool, typer.Option("--json", help="Print the listing as JSON: a list of objects, each with "
                                                         "a kind (scorer, selection, constraint, "
                                                         "kvpress_not_offered, refused_plugin) and a name.")] = False,
) -> None:
    ("List the scorers (built-in and installed plugins), the selection strategies, "
     "and kvpress's presses not offered.")
    rows = _press_rows()
    if as_json:
        print_json(rows)
        return
    t = Table(title="scorers", show_lines=False)
    for col in ("name", "source", "parameters (defaults)", "scored", "reads", "extra cost", "vs kvpress",
                "description"):
        t.add_column(col, overflow="fold")
    for row in rows:
        if row["kind"] == "scorer" and "error" in row:  # a broken plugin: its row says so, the others are listed
            t.add_row(row["name"], row["source"], "-", "-", "-", "-", "-", "failed to import (see below)")
        elif row["kind"] == "scorer":
            t.add_row(row["name"], row["source"], _params(row["parameters"]), row["scored"],
                      ", ".join(row["reads"]) or "-", row["extra_cost"] or "-", row["vs_kvpress"], row["description"])
    print_table(t, console)
    for row in rows:
        if "error" in row:
            console.print(Text(row["error"], style="yellow"))
    t = Table(title="selection strategies")
    for col in ("name", "parameters (defaults)", "kvpress", "description"):
        t.add_column(col, overflow="fold")
    for row in rows:
        if row["kind"] == "selection":
            t.add_row(row["name"], _params(row["parameters"]), row["kvpress"] or "- (kvroute's own)",
                      row["description"])
    print_table(t, console)
    _constraints_table(rows)
    t = Table(title="kvpress presses not offered here")
    for col in ("kvpress", "why"):
        t.add_column(col, overflow="fold")
    for row in rows:
        if row["kind"] == "kvpress_not_offered":
            t.add_row(f"{row['kvpress']} ({row['name']})", f"{row['status']}: {row['why']}")
    print_table(t, console)

    console.print("A press is [bold]scorer[/bold] or [bold]scorer+selection[/bold] (default selection: per_head, "
                  "unless the scorer's row names another), "
                  + escape("each with optional [key=value,...], e.g. expected_attention+adakv, "
                           "snapkv[window_size=32]+chunk[chunk_length=256]. A scorer of your own: "
                           "module:Class (a kvpress ScorerPress or kvroute Scorer subclass), or a plugin "
                           "installed under the entry-point group kvroute.presses; check it against kvpress "
                           "with kvroute presses check."))


def _constraints_table(rows: list[dict[str, Any]]) -> None:
    t = Table(title=escape("serving constraints (scorer+selection+constraint+..., "
                           "e.g. snapkv+paged[block=16]+uniform)"))
    for col in ("name", "parameters (defaults)", "description"):
        t.add_column(col, overflow="fold")
    for row in rows:
        if row["kind"] == "constraint":
            t.add_row(row["name"], _params(row["parameters"]), row["description"])
    print_table(t, console)


def _params(parameters: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in parameters.items()) or "-"


def _press_rows() -> list[dict[str, Any]]:
    """What `presses list` lists, one object per row (its ``--json``): the scorers (a plugin that failed to import
    with its ``error``), the plugins refused, the selection strategies and kvpress's presses not offered."""
    from kvroute.presses import SCORERS, SELECTIONS
    from kvroute.presses.catalogue import CATALOGUE
    from kvroute.presses.plugins import plugin_names, plugins, refused_line, source

    rows: list[dict[str, Any]] = []
    for name in [*SCORERS.names(), *plugin_names()]:
        try:
            cls = SCORERS.get(name)  # a plugin is imported here, and only here when listing
            parameters = cls.parameters()  # a plugin's own code (fenced): its failure is its row's, not the listing's
        except KvrouteError as e:
            rows.append({"kind": "scorer", "name": name, "source": source(name), "error": str(e)})
            continue
        reads = [what for flag, what in ((cls.needs_attentions, "N×N prefill map"),
                                         (cls.needs_evidence, "evidence spans"),
                                         (cls.needs_question_window, "question in the prefix")) if flag is True]
        scored = "per ratio" if cls.ratio_dependent is True else "once"
        if cls.default_selection != "per_head":
            scored += f"; default +{cls.default_selection}"
        rows.append({"kind": "scorer", "name": name, "source": source(name), "parameters": parameters,
                     "scored": scored, "reads": reads, "extra_cost": cls.extra_cost or None,
                     "vs_kvpress": _kvpress_status(name, source(name)), "description": cls.description})
    rows += [{"kind": "refused_plugin", "name": p.name, "error": refused_line(p)}
             for p in plugins() if p.problem is not None]
    kvpress_of = {entry.name: entry.kvpress for entry in CATALOGUE if entry.status == "selection"}
    kvpress_of.update({"per_head": "ScorerPress", "global": "KVzipPress (its selection)"})
    rows += [{"kind": "selection", "name": name, "parameters": selection.parameters(),
              "kvpress": kvpress_of.get(name), "description": selection.description}
             for name, selection in SELECTIONS.items()]
    from kvroute.presses.constraints import CONSTRAINTS

    rows += [{"kind": "constraint", "name": name, "parameters": c.parameters(), "description": c.description}
             for name, c in CONSTRAINTS.items()]
    rows += [{"kind": "kvpress_not_offered", "name": entry.name, "kvpress": entry.kvpress, "status": entry.status,
              "why": entry.why} for entry in CATALOGUE if not entry.offered and entry.status != "base class"]
    return rows


def _kvpress_status(name: str, where: str) -> str:
    """A scorer's equivalence with kvpress, as `presses list` states it.

    A built-in kvpress scorer is compared with kvpress at its default selection by
    tests/reference/test_kvpress_equivalence.py (which fails for one that has no check), so its row says
    so without importing kvpress; a plugin's counterpart is looked up (its module imported kvpress already).
    """
    from kvroute.presses import SCORERS
    from kvroute.presses.scorers.kvpress_adapter import KvpressScorer
    from kvroute.presses.scorers.local_weights import LocalWeightsScorer

    if where == "kvroute":
        return "- (kvroute's own)"
    if where != "kvpress":
        return "unchecked: run kvroute presses check"
    cls = SCORERS.get(name) if name in SCORERS.names() else None
    if cls is not None and issubclass(cls, LocalWeightsScorer):
        return (f"equal, token for token, given the same weights (tests/reference, random ones); needs "
                f"{cls.weights_param}=FOLDER")
    if cls is not None and issubclass(cls, KvpressScorer) and cls.lazy():
        return BUILT_IN_EQUAL
    from kvroute.engine.check import no_kvpress_counterpart

    try:
        why = no_kvpress_counterpart(name)
    except KvrouteError as e:  # e.g. a press that needs a weights folder to build
        return f"equal (tests/reference); {e}"
    return BUILT_IN_EQUAL if why is None else why


BUILT_IN_EQUAL = "equal, token for token (tests/reference)"


@presses_app.command("check")
def presses_check(
    spec: Annotated[str, typer.Argument(help="Press: a built-in, module:Class or a plugin name, "
                                             "with \\[key=value] and +selection.")],
    model: Annotated[str | None, typer.Option("--model", "-m",
                                              help="Zoo name or local folder "
                                                   "(default: a tiny random Llama built here, offline).")] = None,
    ratios: Annotated[str, typer.Option("--ratios", help="Comma-separated ratios.")] = "0.25,0.5,0.75,0.9",
    n: Annotated[int, typer.Option("--n", help="Generated base task instances.")] = 4,
    max_new_tokens: Annotated[int, typer.Option(help="Longest answer, in tokens.")] = DEFAULT_MAX_NEW_TOKENS,
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
    check_max_new_tokens(max_new_tokens, "--max-new-tokens")  # fails before the model loads
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
                if all(c.ours is None for c in res.cells):  # kvroute refuses the press here: nothing to compare
                    first = res.cells[0]
                    raise EngineError(f"cell {first.cell.press} @ {first.cell.ratio:g}: {first.refused}")
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
