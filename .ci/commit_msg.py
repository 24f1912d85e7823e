#!/usr/bin/env python3
"""commit-msg check: a subject of at most 72 characters, then a blank line before any body.

Used by the ``commit-msg`` hook in .pre-commit-config.yaml (``pre-commit install --hook-type commit-msg``);
``python .ci/commit_msg.py FILE`` exits 1 with the reason when the message in FILE breaks the convention.
"""

from __future__ import annotations

import sys
from pathlib import Path

MAX_SUBJECT = 72


def problems(message: str) -> list[str]:
    """What is wrong with a commit message (empty when nothing); comment lines (``#``) are ignored."""
    lines = [ln for ln in message.splitlines() if not ln.startswith("#")]
    while lines and not lines[0].strip():
        lines.pop(0)
    if not lines:
        return ["the message is empty"]
    out = []
    subject = lines[0]
    if len(subject) > MAX_SUBJECT:
        out.append(f"the subject has {len(subject)} characters, more than {MAX_SUBJECT}: put numbers and reasoning "
                   "in the body, after a blank line")
    if subject.rstrip().endswith("."):
        out.append("the subject ends with a period")
    if len(lines) > 1 and lines[1].strip():
        out.append("the second line is not blank: leave one blank line between the subject and the body")
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: commit_msg.py COMMIT_MSG_FILE", file=sys.stderr)
        return 2
    found = problems(Path(argv[1]).read_text(encoding="utf-8"))
    for p in found:
        print(f"commit message: {p}", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
