"""``kvroute ask``, ``run``, ``ticket`` and ``demo``: commands that load a model and answer."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from kvroute.cli.core import (
    _compact,
    _print_errored,
    _read_text,
    _resume_command,
    app,
    load_model_cli,
)
from kvroute.config import DEFAULT_MAX_NEW_TOKENS, check_max_new_tokens
from kvroute.console import RichProgress, SweepProgress, console
from kvroute.errors import KvrouteError

SAMPLE_CONTEXT = (
    "Maren Oskvold was born in the harbour town of Velkirra in 1974. She trained as a clockmaker in "
    "Dunmarrow, and in 2003 she founded the Brasswind Guild, which repairs tower clocks. Her assistant, "
    "Tobin Hale, was born in Quarrystead."
)
SAMPLE_QUESTION = "In which town was Maren Oskvold born?"


@app.command()
def ask(
    model: Annotated[str, typer.Option("--model", "-m",
                                       help="Zoo name, local folder, .gguf file or hub id.")] = "smollm2-135m",
    context: Annotated[str, typer.Option(help="Context text, or @FILE to read it.")] = SAMPLE_CONTEXT,
    question: Annotated[str, typer.Option(help="Question about the context.")] = SAMPLE_QUESTION,
    max_new_tokens: Annotated[int, typer.Option(help="Longest answer, in tokens.")] = DEFAULT_MAX_NEW_TOKENS,
    device: Annotated[str | None, typer.Option(help="cpu, cuda, cuda:1 … (default: auto).")] = None,
    dtype: Annotated[str | None, typer.Option(help="float32, bfloat16 … (default: bf16 on CUDA, fp32 on CPU).")] = None,
) -> None:
    """Answer one in-context question with a model, uncompressed (greedy decoding)."""
    from kvroute.engine.generate import greedy_answer
    from kvroute.models import load_model
    from kvroute.models.loading import resolve_device

    check_max_new_tokens(max_new_tokens, "--max-new-tokens")  # before anything loads
    resolve_device(device)  # a bad --device fails before anything loads, as in `run`
    t0 = time.perf_counter()
    lm = load_model(model, device=device, dtype=dtype, progress=RichProgress())
    t1 = time.perf_counter()
    answer = greedy_answer(lm, _read_text(context), question, max_new_tokens=max_new_tokens)
    t2 = time.perf_counter()
    console.print(f"[bold]model[/bold]    {lm.name} ({lm.info.architecture}, {lm.info.num_layers} layers, "
                  f"{lm.info.num_heads}/{lm.info.num_kv_heads} heads) on {lm.device}, "
                  f"{str(lm.dtype).removeprefix('torch.')}")
    console.print(f"[bold]question[/bold] {question}")
    console.print(f"[bold]answer[/bold]   {answer}")
    console.print(f"[dim]load {t1 - t0:.1f} s, answer {t2 - t1:.1f} s[/dim]")


@app.command()
def demo(
    models: Annotated[str, typer.Option("--models", "-m", help="Comma-separated models; "
                                        "'qwen2.5-0.5b,smollm2-135m' compares the two "
                                        "architectures.")] = "qwen2.5-0.5b",
    out: Annotated[Path, typer.Option("--out", "-o",
                                      help="Run directory (resumed when it exists).")] = Path("runs/demo"),
    scale: Annotated[float, typer.Option(help="Multiply the number of task instances (0.25 for a quick look).")] = 1.0,
    tickets: Annotated[int, typer.Option(help="Lottery-ticket searches per model.")] = 2,
    n_boot: Annotated[int, typer.Option(help="Bootstrap replicates in the report.")] = 1000,
) -> None:
    """The main job: a compression study on the embedded model(s), from pulling the model to the report."""
    from kvroute.demo import DEMO_PRESSES, DEMO_RATIOS, check_demo_options, run_demo

    check_demo_options(scale=scale, tickets=tickets, report_boot=n_boot)  # before any pull
    names = [m.strip() for m in models.split(",") if m.strip()]
    console.print(f"[bold]kvroute demo[/bold]: {escape(', '.join(names))} · "
                  f"presses {escape(', '.join(DEMO_PRESSES))} · "
                  f"ratios {', '.join(f'{r:g}' for r in DEMO_RATIOS)} → {escape(str(out))}")
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
def run(
    tasks: Annotated[Path, typer.Option("--tasks", "-t", help="Task file (JSONL, kvroute format).")],
    press: Annotated[list[str], typer.Option("--press", "-p",
                                             help="Press, e.g. snapkv or expected_attention+adakv; "
                                                  "repeat for several.")],
    ratio: Annotated[list[float], typer.Option("--ratio", "-r",
                                               help="Compression ratio in [0, 1); repeat for several.")],
    out: Annotated[Path, typer.Option("--out", "-o",
                                      help="Where to write one JSON record per (instance, press, ratio).")],
    model: Annotated[str, typer.Option("--model", "-m",
                                       help="Zoo name, local folder, .gguf file or hub id.")] = "smollm2-135m",
    question_aware: Annotated[bool, typer.Option("--question-aware",
                                                 help="Compress the question with the context.")] = False,
    max_new_tokens: Annotated[int, typer.Option(help="Longest answer, in tokens.")] = DEFAULT_MAX_NEW_TOKENS,
    limit: Annotated[int | None, typer.Option(help="Only the first N instances.")] = None,
    seed: Annotated[int, typer.Option(help="Seed for random scorers.")] = 0,
    device: Annotated[str | None, typer.Option(help="cpu, cuda, … (default: auto).")] = None,
    dtype: Annotated[str | None, typer.Option(help="float32, bfloat16, … (default: auto).")] = None,
    attention_backend: Annotated[str, typer.Option(
        "--attention-backend", help="The masked attention's backend: auto, or one of reference, sdpa, gathered, "
                                    "chunked, fused, kept (docs/performance.md).")] = "auto",
) -> None:
    """Compress every instance's cache with each press at each ratio and record answers and routing metrics."""
    import json

    from kvroute.engine import Cell, Engine
    from kvroute.files import atomic_write, check_not_input, check_output_file
    from kvroute.presses import build_press, check_ratio
    from kvroute.presses.selection.base import RATIO_DIGITS
    from kvroute.runner import run_instance
    from kvroute.settings import RunSettings
    from kvroute.tasks import load_tasks

    for p in press:  # names, ratios and the output path are checked before anything loads
        build_press(p)
    ratio = [check_ratio(r) for r in ratio]  # canonical: 0.5 and 0.5000000000000001 are one ratio
    twice = next((r for i, r in enumerate(ratio) if r in ratio[:i]), None)
    if twice is not None:
        raise KvrouteError(f"--ratio {twice:g} is given twice (as spelled or once rounded to "
                           f"{RATIO_DIGITS} digits); give each ratio once")
    check_output_file(out)
    from kvroute.bounds import check_seed

    check_seed(seed, "--seed")
    check_not_input(out, {"the task file --tasks": tasks,
                          "the model file --model": model if Path(model).is_file() else None})
    if limit is not None and limit < 1:
        raise KvrouteError(f"--limit {limit}: give a positive number of instances (or leave --limit out for all)")
    instances = load_tasks(tasks)[:limit]
    settings = RunSettings(max_new_tokens=check_max_new_tokens(max_new_tokens, "--max-new-tokens"),
                           attention_backend=attention_backend)
    cells = [Cell(p, r) for p in press for r in ratio]
    regime = "aware" if question_aware else "agnostic"
    lm = load_model_cli(model, device, dtype)
    engine = Engine(lm, settings.decode_settings())
    engine.validate(cells)
    out.parent.mkdir(parents=True, exist_ok=True)
    n, errored = 0, []
    # written to a temporary file next to --out and renamed at the end: a run that fails leaves --out as it was
    with atomic_write(out) as f, RichProgress().task(f"{len(instances)} instances × {len(cells)} cells",
                                                     len(instances)) as bar:
        for inst in instances:
            for rec in run_instance(engine, inst, cells, regime=regime, seed=seed, settings=settings, model_name=model):
                f.write(json.dumps(_compact({"id": inst.id, **rec}), ensure_ascii=False) + "\n")
                n += 1
                if rec.get("status") == "error":
                    errored.append(rec)
            bar.advance()
    console.print(f"wrote {n} records to {out}")
    _print_errored(errored, n)


@app.command()
def ticket(
    tasks: Annotated[Path, typer.Option("--tasks", "-t", help="Task file (JSONL, kvroute format).")],
    instance: Annotated[list[str], typer.Option("--instance", "-i",
                                                help="Instance id (repeat for several; "
                                                     "default: the first).")] = [],  # noqa: B006
    model: Annotated[str, typer.Option("--model", "-m",
                                       help="Zoo name, local folder, .gguf file or hub id.")] = "smollm2-135m",
    target: Annotated[str, typer.Option(help="gold: the answer must stay correct; "
                                             "full: the full cache's exact answer.")] = "gold",
    question_aware: Annotated[bool, typer.Option("--question-aware",
                                                 help="Compress the question with the context.")] = False,
    max_new_tokens: Annotated[int, typer.Option(help="Longest answer, in tokens.")] = DEFAULT_MAX_NEW_TOKENS,
    max_evaluations: Annotated[int, typer.Option(help="Budget of decoded candidate masks per instance.")] = 400,
    out: Annotated[Path | None, typer.Option("--out", "-o",
                                             help="Run directory: appends tickets.jsonl, "
                                                  "writes masks and heatmaps.")] = None,
    answer_prefix: Annotated[str | None, typer.Option(help="Text after the question, as in the sweep's "
                                                           "decoding.answer_prefix "
                                                           "(default: the --out run's, else none).")] = None,
    system_prompt: Annotated[str | None, typer.Option(help="System prompt, as in the sweep's decoding.system_prompt "
                                                           "(default: the --out run's, else none).")] = None,
    device: Annotated[str | None, typer.Option(help="cpu, cuda, … (default: auto).")] = None,
) -> None:
    """Search a token-route lottery ticket: a small set of kept KV entries that still yields the answer.

    The prompt is built as the sweep in --out built it (its manifest's answer prefix and system
    prompt), so the ticket answers the same prompt as the cells whose cliffs it is compared with.
    """

    import numpy as np

    from kvroute.tasks import load_tasks
    from kvroute.tickets import TicketSettings, find_ticket

    settings = TicketSettings(target=target, max_new_tokens=check_max_new_tokens(max_new_tokens, "--max-new-tokens"),
                              max_evaluations=max_evaluations)
    if out is not None:  # tickets are appended to RUN_DIR/tickets.jsonl: never to the task file being read
        from kvroute.files import check_not_input
        from kvroute.tickets.save import TICKETS_FILE

        check_not_input(out / TICKETS_FILE, {"the task file --tasks": tasks}, what="the tickets file under --out")
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
                  f"{s['tokens_kept']}/{s['context_tokens']}",
                  f"{s['evidence_tokens_in_ticket']}/{s['evidence_tokens']}",
                  f"mean {np.mean(hp):.1f}, max {max(hp)}" if hp else "-", s["answer"][:40], str(s["evaluations"]))
        if out is not None:
            from kvroute.tickets import save_ticket

            save_ticket(out, lm.name, target, inst.family, tk)
    console.print(t)
    if out is not None:
        console.print(f"tickets written to {out / 'tickets.jsonl'} (masks and heatmaps in {out / 'tickets'})")
