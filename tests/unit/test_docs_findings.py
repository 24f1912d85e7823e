"""The findings the README and the docs quote are the report's own sentences, regenerated from a committed summary.

A quoted block is marked ``<!-- findings: PATH -->`` (PATH a summary.json relative to the repository root) and
followed by a fenced ``text`` block; its lines must be exactly :func:`kvroute.report.findings.findings_lines` of
that summary — what ``kvroute findings PATH`` prints. Prose and numbers cannot drift apart.
"""

import json
import re
from pathlib import Path

import pytest

from kvroute.report.findings import findings_lines
from kvroute.report.league import league_markdown

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"<!-- findings: (?P<path>\S+) -->\s*```text\n(?P<body>.*?)```", re.S)
LEAGUE = re.compile(r"<!-- league: (?P<path>\S+) -->\n(?P<body>(?:\|.*\n)+)")


def _blocks():
    for doc in DOCS:
        for m in BLOCK.finditer(doc.read_text(encoding="utf-8")):
            yield pytest.param(doc, m["path"], m["body"], id=f"{doc.name}:{m['path']}")


BLOCKS = list(_blocks())


def test_the_front_door_quotes_the_demo_findings():
    assert any(doc.name == "README.md" for doc, *_ in (b.values for b in BLOCKS))


@pytest.mark.parametrize(("doc", "path", "body"), BLOCKS)
def test_a_quoted_block_is_what_the_code_writes_from_its_summary(doc, path, body):
    summary = json.loads((ROOT / path).read_text(encoding="utf-8"))
    assert body.rstrip("\n").split("\n") == findings_lines(summary), (
        f"{doc.name} quotes findings that {path} does not give: regenerate with `kvroute findings {path}`")


LEAGUES = [pytest.param(doc, m["path"], m["body"], id=f"{doc.name}:{m['path']}")
           for doc in DOCS for m in LEAGUE.finditer(doc.read_text(encoding="utf-8"))]


@pytest.mark.parametrize(("doc", "path", "body"), LEAGUES)
def test_a_quoted_league_is_the_summary_s_league(doc, path, body):
    summary = json.loads((ROOT / path).read_text(encoding="utf-8"))
    assert body.rstrip("\n").split("\n") == league_markdown(summary["press_league"]), (
        f"{doc.name} quotes a league that {path} does not give")
