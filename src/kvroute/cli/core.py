"""The ``kvroute`` application: the Typer app, Ctrl-C handling, shared helpers and the entry point ``main``."""

from __future__ import annotations

import functools
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.logging import RichHandler
from rich.markup import escape

from kvroute import __version__
from kvroute.console import RichProgress, console, err_console
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


def _setup_logging(verbose: int) -> None:
    level = logging.WARNING if verbose == 0 else logging.INFO if verbose == 1 else logging.DEBUG
    logging.basicConfig(level=level, format="%(message)s", handlers=[RichHandler(console=err_console, show_path=False)],
                        force=True)


@app.callback()
def _root(verbose: Annotated[int, typer.Option("--verbose", "-v", count=True,
                                               help="More logging (-vv for debug).")] = 0) -> None:
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
    console.print(f"kvroute {__version__} (torch {torch.__version__}, "
                  f"transformers {transformers.__version__}, kvpress {kvp})")




def parse_list(values: str | list[str] | None, cast: type = str, option: str = "") -> list | None:
    """The CLI's one list parser: comma-separated (and, for a repeatable option, repeated) values cast to ``cast``.

    None when nothing was given; a value that does not cast raises KvrouteError naming the option and the value.
    """
    from kvroute.errors import KvrouteError

    if values is None:
        return None
    items = [x.strip() for v in ([values] if isinstance(values, str) else values) for x in v.split(",") if x.strip()]
    out = []
    for x in items:
        try:
            out.append(cast(x))
        except ValueError:
            kind = {int: "an integer", float: "a number"}.get(cast, cast.__name__)
            where = f"{option} " if option else ""
            raise KvrouteError(f"{where}{x!r} is not {kind}; give comma-separated values, e.g. "
                               f"{'0,0.5,1' if cast is float else '1,2,3'}") from None
    return out


def _csv(value: str | None, cast: type = str, option: str = "") -> list | None:
    return parse_list(value, cast, option)




def _read_text(value: str) -> str:
    """``@path`` reads a file; anything else is the text itself."""
    if value.startswith("@"):
        p = Path(value[1:])
        if not p.is_file():
            raise KvrouteError(f"no such file: {p}")
        try:
            return p.read_text(encoding="utf-8-sig")
        except UnicodeDecodeError as e:
            raise KvrouteError(f"{p} is not UTF-8 text ({e.reason} at byte {e.start}); convert it "
                               "(e.g. iconv -t UTF-8) and try again") from None
    return value




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
