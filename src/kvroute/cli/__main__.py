"""``python -m kvroute.cli``."""

from kvroute.cli.core import main

main()
