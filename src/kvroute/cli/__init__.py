"""The ``kvroute`` command, one module per command group; :mod:`kvroute.cli.core` holds the app and ``main``.

Only this package prints (through :mod:`kvroute.console`). Importing it registers every command.
"""

from kvroute.cli.core import app, main

# the commands, in the order `kvroute --help` lists them
from kvroute.cli import run, sweep, report, restore_map, models, presses, tasks, kernel  # noqa: E402, F401  isort: skip

__all__ = ["app", "main"]
