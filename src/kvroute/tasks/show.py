"""A readable view of task instances (rich renderables; the CLI prints them).

Evidence spans are underlined on a dark yellow background, answer spans bold green, distractor
occurrences red. Task text is styled by character ranges on a ``rich.text.Text`` — never parsed as
markup — so brackets in a user's context are shown as they are.
"""

from __future__ import annotations

import re

from rich.console import Group
from rich.panel import Panel
from rich.text import Text

from kvroute.tasks.instance import TaskInstance

EVIDENCE_STYLE = "underline on grey23"
ANSWER_STYLE = "bold green"
DISTRACTOR_STYLE = "red"


def highlighted_context(inst: TaskInstance) -> Text:
    text = Text(inst.context)
    for d in inst.distractors:
        for m in re.finditer(re.escape(d), inst.context):
            text.stylize(DISTRACTOR_STYLE, m.start(), m.end())
    for s, e in inst.evidence_spans:
        text.stylize(EVIDENCE_STYLE, s, e)
    for s, e in inst.answer_spans:
        text.stylize(ANSWER_STYLE, s, e)
    return text


def instance_panel(inst: TaskInstance, *, max_chars: int | None = None) -> Panel:
    """One instance as a panel: tags, highlighted context, question, answers, distractors."""
    ctx = highlighted_context(inst)
    if max_chars is not None and len(inst.context) > max_chars:
        ctx = ctx[:max_chars]
        ctx.append(f" … [{len(inst.context) - max_chars} more characters]", style="dim")
    meta = ", ".join(f"{k}={v}" for k, v in inst.meta.items() if k not in ("format",))
    title = Text.assemble((inst.family, "bold"), f" v{inst.version}  ", (inst.id, "dim"))
    answers = Text("answers     ", style="bold")
    answers.append(" | ".join(inst.answers), style=ANSWER_STYLE)
    if inst.unanswerable:
        answers.append("  (unanswerable)", style="yellow")
    rows = [
        Text.assemble(("tags        ", "bold"), f"{inst.answer_type} · {inst.question_type}", (f"   {meta}", "dim")),
        Text(""),
        ctx,
        Text(""),
        Text.assemble(("question    ", "bold"), inst.question),
        answers,
        Text.assemble(("distractors ", "bold"), (" | ".join(inst.distractors) or "—", DISTRACTOR_STYLE)),
    ]
    return Panel(Group(*rows), title=title, title_align="left")


LEGEND = Text.assemble(("evidence", EVIDENCE_STYLE), "  ", ("answer", ANSWER_STYLE), "  ",
                       ("distractor", DISTRACTOR_STYLE))
