"""A readable view of task instances (rich renderables; the CLI prints them).

Evidence spans are underlined on a dark yellow background, answer spans bold green, distractor
occurrences red. Task text is styled by character ranges on a ``rich.text.Text`` — never parsed as
markup — so brackets in a user's context are shown as they are. Control characters in task text
(an ``ESC [31m`` sequence, a carriage return, bidi overrides) would reach the terminal and act there;
:func:`visible` turns each into one visible character first (``␛``, ``␍``, …), so the character
offsets of the spans still hold.
"""

from __future__ import annotations

import re

from rich.cells import cell_len
from rich.console import Group
from rich.panel import Panel
from rich.text import Text

from kvroute.tasks.instance import TaskInstance

EVIDENCE_STYLE = "underline on grey23"
ANSWER_STYLE = "bold green"
DISTRACTOR_STYLE = "red"


_BIDI = frozenset("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u200e\u200f\u061c")


def _visible_char(c: str) -> str:
    o = ord(c)
    if o < 0x20 and c not in "\n\t":
        return chr(0x2400 + o)  # the Unicode control pictures: ␀ … ␛ … ␟
    if o == 0x7F:
        return "\u2421"  # ␡
    if 0x80 <= o < 0xA0 or c in _BIDI or c in "\u2028\u2029":
        return "\ufffd"  # C1 controls (ESC's 8-bit twin CSI), bidi overrides, line separators
    return c


def visible(text: str) -> str:
    """``text`` with every control character (but newline and tab) replaced by one visible character."""
    if text.isprintable() or all(c.isprintable() or c in "\n\t" for c in text):
        return text
    return "".join(_visible_char(c) for c in text)


def highlighted_context(inst: TaskInstance) -> Text:
    text = Text(visible(inst.context))  # one character per character: the spans' offsets still hold
    for d in inst.distractors:
        for m in re.finditer(re.escape(d), inst.context):
            text.stylize(DISTRACTOR_STYLE, m.start(), m.end())
    for s, e in inst.evidence_spans:
        text.stylize(EVIDENCE_STYLE, s, e)
    for s, e in inst.answer_spans:
        text.stylize(ANSWER_STYLE, s, e)
    return text


def instance_panel(inst: TaskInstance, *, max_chars: int | None = None, width: int | None = None) -> Panel:
    """One instance as a panel: tags, highlighted context, question, answers, distractors. Its title (family, version,
    id) goes in the border where it fits ``width`` (rich would cut it there), else in its first line, wrapped."""
    ctx = highlighted_context(inst)
    if max_chars is not None and len(inst.context) > max_chars:
        ctx = ctx[:max_chars]
        ctx.append(f" … [{len(inst.context) - max_chars} more characters]", style="dim")
    meta = visible(", ".join(f"{k}={v}" for k, v in inst.meta.items() if k not in ("format",)))
    title = Text.assemble((visible(inst.family), "bold"), f" v{inst.version}  ", (visible(inst.id), "dim"))
    answers = Text("answers     ", style="bold")
    answers.append(visible(" | ".join(inst.answers)), style=ANSWER_STYLE)
    if inst.unanswerable:
        answers.append("  (unanswerable)", style="yellow")
    rows = [
        Text.assemble(("tags        ", "bold"), visible(f"{inst.answer_type} · {inst.question_type}"),
                      (f"   {meta}", "dim")),
        Text(""),
        ctx,
        Text(""),
        Text.assemble(("question    ", "bold"), visible(inst.question)),
        answers,
        Text.assemble(("distractors ", "bold"), (visible(" | ".join(inst.distractors)) or "—", DISTRACTOR_STYLE)),
    ]
    if width is not None and cell_len(title.plain) > width - 6:  # "╭─ " … " ─╮": rich cuts a longer title
        return Panel(Group(title, *rows))
    return Panel(Group(*rows), title=title, title_align="left")


LEGEND = Text.assemble(("evidence", EVIDENCE_STYLE), "  ", ("answer", ANSWER_STYLE), "  ",
                       ("distractor", DISTRACTOR_STYLE))
