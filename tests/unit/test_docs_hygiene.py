"""The README and the docs pages explain; they do not keep history (issue 45).

Commit hashes and sequences of past timings go stale with the next change: dated, machine-tagged figures live in
``benchmarks/results/`` and changes in ``CHANGELOG.md``. So, for README.md and every ``docs/*.md``:

(a) no word that looks like a commit hash (7–40 lowercase hex characters with at least one digit and at least
    one letter a–f), save the few hex strings allow-listed below;
(b) at most :data:`MAX_DURATIONS` measured durations (a number followed by s, ms, min, h, minutes or seconds)
    outside fenced code blocks — more is a timing history, which belongs in a results file;
(c) README.md, the front door, has at most :data:`README_MAX_LINES` lines;
(d) every docs page but docs/README.md is linked from README.md, so that none is orphaned;
(e) a finding the docs quote (a ``> `` block-quote line) is the code's sentence, word for word, as a committed
    result file under ``benchmarks/results/`` holds it: the docs quote findings, they never paraphrase them,
    and a rerun that changes a sentence makes the quote fail until it is updated.
"""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = [README, *sorted((ROOT / "docs").glob("*.md"))]

MAX_DURATIONS = 6
README_MAX_LINES = 120

#: A word of 7–40 lowercase hex characters: the length range of an abbreviated or full git commit hash. The
#: word must stand alone (no letter, digit or underscore on either side), so a longer run such as a SHA-256
#: digest (64 characters) never matches, nor does a hex-looking part of an identifier.
HEX_WORD = re.compile(r"(?<![\w])[0-9a-f]{7,40}(?![\w])")

#: Hex words that are not commit hashes, per page, each with why it is there. Kept exact (page and word), so a
#: commit hash elsewhere on the same page still fails; an entry whose word has left its page fails too
#: (test_every_allowed_hex_word_is_still_needed), so the list cannot rot into a blanket exemption.
ALLOWED_HEX = {
    # the example instance of the task format: its `id` is 16 hex digits of SHA-256 over the content
    "docs/tasks.md": {"fd08d5a219932cf9"},
    # instance ids of the tiny models' equivalence runs, in the generated support table's list of differences
    "docs/models.md": {"850b6e4487285ce4", "404b3b553a8ee057"},
}

#: A measured duration: a number (digits, optionally with thousands commas or a decimal part) followed, after at
#: most one space, by a unit of time, standing alone on both sides ("15.2 min", "531 s", "30s", "1,210 ms").
DURATION = re.compile(r"(?<![\w.,])\d+(?:[.,]\d+)*[ \u00a0]?(?:minutes|seconds|min|ms|s|h)(?![\w])")

FENCE = re.compile(r"^\s*(?:[-*+]\s+|\d+[.)]\s+)*(?P<fence>`{3,}|~{3,})")

#: A markdown link to a docs page from the repository root: inline ``[text](docs/page.md#anchor "title")`` or a
#: reference definition ``[label]: docs/page.md#anchor``.
DOCS_LINK = re.compile(
    r"(?:\]\(\s*<?|^\s{0,3}\[[^\]]+\]:\s*<?)(?:\./)?docs/(?P<page>[^)\s#>/]+\.md)(?:#[^)\s>]*)?>?(?:\s+\"[^\"]*\")?\s*\)?",
    re.M,
)


def _name(page: Path) -> str:
    """The page's path from the repository root (its file name for a page elsewhere, as in the pattern tests)."""
    return page.relative_to(ROOT).as_posix() if page.is_relative_to(ROOT) else page.name


def _outside_fences(text: str) -> list[tuple[int, str]]:
    """(line number, line) for every line outside fenced code blocks (the fence lines themselves left out)."""
    lines, fence = [], None
    for number, line in enumerate(text.splitlines(), 1):
        m = FENCE.match(line)
        if fence is None:
            if m:
                fence = m["fence"]
                continue
            lines.append((number, line))
        elif m and m["fence"][0] == fence[0] and len(m["fence"]) >= len(fence) and not line[m.end():].strip():
            fence = None
    return lines


def hex_words(page: Path) -> list[tuple[int, str]]:
    """(line number, word) for every commit-hash-like word on the page, the allow-listed ones left out."""
    allowed = ALLOWED_HEX.get(_name(page), set())
    found = []
    for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
        for m in HEX_WORD.finditer(line):
            word = m.group()
            if re.search(r"\d", word) and re.search(r"[a-f]", word) and word not in allowed:
                found.append((number, word))
    return found


def durations(page: Path) -> list[tuple[int, str]]:
    """(line number, text) for every measured duration outside fenced code blocks."""
    return [(number, m.group()) for number, line in _outside_fences(page.read_text(encoding="utf-8"))
            for m in DURATION.finditer(line)]


def linked_docs(readme: Path) -> set[str]:
    """The docs pages (file names) that README.md links to."""
    return {m["page"] for _, line in _outside_fences(readme.read_text(encoding="utf-8"))
            for m in DOCS_LINK.finditer(line)}


PAGES = [pytest.param(page, id=_name(page)) for page in DOCS]


@pytest.mark.parametrize("page", PAGES)
def test_no_commit_hash(page):
    found = hex_words(page)
    assert not found, (
        f"{_name(page)} names {len(found)} commit-hash-like word(s): "
        + ", ".join(f"line {n}: {w}" for n, w in found)
        + " — link the results file or the CHANGELOG instead (or allow-list a hex string that is not a commit,"
        " with why, in ALLOWED_HEX)")


@pytest.mark.parametrize("page", PAGES)
def test_no_timing_history(page):
    found = durations(page)
    assert len(found) <= MAX_DURATIONS, (
        f"{_name(page)} quotes {len(found)} measured durations (at most {MAX_DURATIONS}): "
        + ", ".join(f"line {n}: {d!r}" for n, d in found)
        + " — a timing history belongs in benchmarks/results/; link it")


def test_every_allowed_hex_word_is_still_needed():
    for name, words in ALLOWED_HEX.items():
        text = (ROOT / name).read_text(encoding="utf-8")
        for word in words:
            assert re.search(rf"(?<![\w]){word}(?![\w])", text), (
                f"{word} is no longer in {name}: drop it from ALLOWED_HEX")


def test_readme_is_short():
    lines = len(README.read_text(encoding="utf-8").splitlines())
    assert lines <= README_MAX_LINES, (
        f"README.md has {lines} lines (at most {README_MAX_LINES}): move detail into a docs page and link it")


def test_every_docs_page_is_linked_from_the_readme():
    pages = {p.name for p in DOCS if p.parent.name == "docs" and p.name != "README.md"}
    missing = sorted(pages - linked_docs(README))
    assert not missing, "README.md links no " + ", ".join(f"docs/{m}" for m in missing)


# The checks' own patterns, on fixed text, so that a page passing them means what it should.


@pytest.mark.parametrize(("text", "words"), [
    ("measured at 5e465f4, then at b53b385", ["5e465f4", "b53b385"]),
    ("full hash 0123456789abcdef0123456789abcdef01234567 here", ["0123456789abcdef0123456789abcdef01234567"]),
    ("a digest " + "ab12" * 16 + " is not a commit", []),  # 64 characters: SHA-256, too long for a commit
    ("deadbeef and 12345678 and float32 and sha256 and 1e10", []),  # no digit / no letter / not all hex / short
    ("snake_abc1234 and abc1234x and ABC1234", []),  # part of a word, or not lowercase
])
def test_hex_word_pattern(tmp_path, text, words):
    page = tmp_path / "page.md"
    page.write_text(text + "\n", encoding="utf-8")
    assert [w for _, w in hex_words(page)] == words


@pytest.mark.parametrize(("text", "count"), [
    ("took 15.2 min at first, then 15.3 min, was 531 s, now 1,210 ms, 30s, 2 h, 9 minutes, 4 seconds", 8),
    ("64 cells, 3 presses, 2 heads, 16 GiB, 0.5 shares, v1.5 stable, 12:30, α = 0.9", 0),
    ("before\n```bash\nmake test   # 43 min\n```\nafter 2 s\n", 1),  # inside a fence: a command's comment
    ("- item\n  ~~~\n  7 s\n  ~~~\n- 8 s\n", 1),  # a fence inside a list item
])
def test_duration_pattern(tmp_path, text, count):
    page = tmp_path / "page.md"
    page.write_text(text + "\n", encoding="utf-8")
    assert len(durations(page)) == count


def test_docs_link_pattern(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text(
        "[Models](docs/models.md) · [report](docs/report.md#press-league) · [d](./docs/design.md \"Design\")\n"
        "[ref]: docs/tasks.md\n"
        "not a link: docs/metrics.md, nor [x](other/docs/import.md), nor ![img](docs/demo-cliff.png)\n"
        "```\n[inside](docs/presses.md)\n```\n",
        encoding="utf-8")
    assert linked_docs(readme) == {"models.md", "report.md", "design.md", "tasks.md"}


RESULTS = ROOT / "benchmarks" / "results"
#: a quoted line this long is a finding (shorter ones are notes or examples)
QUOTE_MIN_CHARS = 40


def quoted_lines(page: Path) -> list[tuple[int, str]]:
    """``(line number, text)`` of the block-quote lines of ``page`` that are long enough to be findings."""
    return [(i, line[2:].strip()) for i, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1)
            if line.startswith("> ") and len(line) > QUOTE_MIN_CHARS]


def test_every_quoted_finding_is_a_committed_result_word_for_word():
    results = "\n".join(p.read_text(encoding="utf-8") for p in sorted(RESULTS.glob("*.md")))
    missing = [f"{page.relative_to(ROOT)}:{i}: {text[:100]}" for page in DOCS for i, text in quoted_lines(page)
               if text not in results]
    assert not missing, "quoted but in no benchmarks/results/*.md:\n" + "\n".join(missing)
    assert sum(len(quoted_lines(p)) for p in DOCS) >= 10  # the check reads the quotes the docs hold


def test_a_paraphrased_quote_is_caught(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("> expected_attention at page size 16, per head: cannot decide — roughly no cost at all\n")
    results = "\n".join(p.read_text(encoding="utf-8") for p in sorted(RESULTS.glob("*.md")))
    assert [t for _, t in quoted_lines(page) if t not in results]
