"""``import_tasks``: a source → validated instances, plus a per-task summary of what happened to each row.

Nothing is dropped silently: a row whose answers do not occur in its context is kept with
``meta["evidence"] == "none"``; a row too long for the window is skipped *and counted*
(or cut from the middle when asked); an exact duplicate of an earlier row (same content, hence
the same id) is counted and not written twice. A malformed row stops the import with its row
number (and line, for JSONL and CSV).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, fields
from typing import Any

from kvroute.errors import ConfigError
from kvroute.progress import SILENT, Progress
from kvroute.tasks.importers.base import LAYOUTS, Layout, SourceRow, detect_layout
from kvroute.tasks.importers.convert import to_instance
from kvroute.tasks.importers.length import cut_middle, prompt_length
from kvroute.tasks.importers.sources import read_source
from kvroute.tasks.instance import TaskInstance
from kvroute.tasks.locate import MAX_EVIDENCE_CHARS

log = logging.getLogger(__name__)

TRUNCATE_MODES = ("middle",)
_MAX_CUTS = 6  # re-measure after a cut; a tokenizer can merge tokens at the seam


@dataclass(frozen=True)
class ImportOptions:
    """How to read a source; validated on construction (``ConfigError`` names the option).

    Attributes:
        layout: ``kvpress`` or ``ruler`` (``kvroute tasks import --help``); ``None`` detects it
            from the columns.
        family: task family for rows without a ``task`` column (default: the file stem).
        config / split: a hub dataset's configuration and split (split default ``test``).
        max_tokens: the window an instance must fit (prompt + ``max_new_tokens``), measured with
            the tokenizer given to :func:`import_tasks`; ``None`` imports every length.
        truncate: ``None`` skips (and counts) too-long instances; ``"middle"`` keeps the head and
            tail of the context and re-locates the answers.
        limit: only the first ``limit`` rows of the source.
        max_evidence_chars: longest evidence window around an answer (see ``kvroute.tasks.locate``).
    """

    layout: str | None = None
    family: str | None = None
    config: str | None = None
    split: str | None = None
    max_tokens: int | None = None
    truncate: str | None = None
    limit: int | None = None
    max_evidence_chars: int = MAX_EVIDENCE_CHARS

    def __post_init__(self) -> None:
        def need(ok: bool, fld: str, msg: str) -> None:
            if not ok:
                raise ConfigError(f"import option {fld}={getattr(self, fld)!r}: {msg}")

        if self.layout is not None:
            LAYOUTS.get(self.layout)  # unknown names fail with suggestions
        need(self.family is None or (isinstance(self.family, str) and bool(self.family.strip())), "family",
             "must be a non-empty name")
        need(self.max_tokens is None or (_is_int(self.max_tokens) and self.max_tokens >= 32), "max_tokens",
             "must be an integer >= 32")
        need(self.truncate is None or self.truncate in TRUNCATE_MODES, "truncate",
             f"must be one of {', '.join(TRUNCATE_MODES)} (or unset to skip too-long instances)")
        need(self.truncate is None or self.max_tokens is not None, "truncate", "needs max_tokens (the window)")
        need(self.limit is None or (_is_int(self.limit) and self.limit >= 1), "limit", "must be a positive integer")
        need(_is_int(self.max_evidence_chars) and self.max_evidence_chars >= 40, "max_evidence_chars",
             "must be an integer >= 40")


def _is_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


@dataclass
class TaskCounts:
    """What happened to the rows of one task (family)."""

    task: str
    rows: int = 0  # rows read
    instances: int = 0  # instances written
    with_spans: int = 0  # ... whose answers were located in the context
    evidence_none: int = 0  # ... whose answers occur nowhere in the context (GER undefined)
    skipped_too_long: int = 0  # rows longer than max_tokens, not written
    truncated: int = 0  # instances cut from the middle to fit
    duplicates: int = 0  # rows identical to an earlier one, not written twice

    def as_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(frozen=True)
class ImportResult:
    instances: tuple[TaskInstance, ...]
    summary: tuple[TaskCounts, ...]  # one per task, in order of first appearance
    source: str
    layout: str
    max_tokens: int | None = None
    tokens_counted_with: str | None = None

    def totals(self) -> TaskCounts:
        total = TaskCounts("all")
        for c in self.summary:
            for f in fields(c):
                if f.name != "task":
                    setattr(total, f.name, getattr(total, f.name) + getattr(c, f.name))
        return total


@dataclass
class _State:
    counts: dict[str, TaskCounts] = field(default_factory=dict)
    seen: set[str] = field(default_factory=set)
    out: list[TaskInstance] = field(default_factory=list)


def import_tasks(source: str, options: ImportOptions = ImportOptions(), *, tokenizer: Any | None = None,
                 progress: Progress = SILENT) -> ImportResult:
    """Read ``source`` (a file or hub id) and convert every row; see :class:`ImportOptions`."""
    if options.max_tokens is not None and tokenizer is None:
        raise ConfigError("max_tokens is measured in the model's tokens: give a tokenizer (--model or --tokenizer)")
    table = read_source(source, config=options.config, split=options.split)
    layout: Layout = LAYOUTS.get(options.layout)() if options.layout else detect_layout(table.columns, table.name)
    rows = table.rows[: options.limit] if options.limit else table.rows
    st = _State()
    with progress.task(f"importing {len(rows)} rows", total=len(rows)) as bar:
        for where, raw in rows:
            row = layout.read(raw, where)
            family = (row.task or options.family or table.stem).strip()
            counts = st.counts.setdefault(family, TaskCounts(family))
            counts.rows += 1
            inst = _convert(row, family, table.name, layout.name, options, tokenizer, counts)
            if inst is not None:
                if inst.id in st.seen:
                    counts.duplicates += 1
                else:
                    st.seen.add(inst.id)
                    st.out.append(inst)
                    counts.instances += 1
                    counts.truncated += "truncated" in inst.meta
                    if inst.answer_spans:
                        counts.with_spans += 1
                    else:
                        counts.evidence_none += 1
            bar.advance()
    name = getattr(tokenizer, "name_or_path", None) or (type(tokenizer).__name__ if tokenizer is not None else None)
    return ImportResult(tuple(st.out), tuple(st.counts.values()), table.name, layout.name, options.max_tokens, name)


def _convert(row: SourceRow, family: str, source: str, layout: str, options: ImportOptions, tokenizer: Any,
             counts: TaskCounts) -> TaskInstance | None:
    def make(context: str | None = None, extra: dict[str, Any] | None = None) -> TaskInstance:
        return to_instance(row, family=family, source=source, layout=layout, context=context, extra_meta=extra,
                           max_evidence_chars=options.max_evidence_chars)

    inst = make()
    if options.max_tokens is None:
        return inst
    limit = options.max_tokens
    n = prompt_length(tokenizer, inst)
    counted = {"context_tokens": _context_tokens(tokenizer, inst.context)}
    if n <= limit:
        return make(extra=counted)
    if options.truncate != "middle":
        log.info("row %d (%s): %d tokens > %d, skipped", row.where.row, family, n, limit)
        counts.skipped_too_long += 1
        return None
    keep = counted["context_tokens"] - (n - limit)
    for _ in range(_MAX_CUTS):
        cut = cut_middle(tokenizer, row.context, keep)
        if cut is None:
            break
        trunc = {"original_tokens": n, "removed_chars": list(cut.removed)}
        inst = make(cut.context, {"truncated": trunc, "context_tokens": _context_tokens(tokenizer, cut.context)})
        over = prompt_length(tokenizer, inst) - limit
        if over <= 0:
            return inst
        keep -= over
    log.info("row %d (%s): cannot cut %d tokens down to %d, skipped", row.where.row, family, n, limit)
    counts.skipped_too_long += 1
    return None


def _context_tokens(tokenizer: Any, text: str) -> int:
    return len(tokenizer.encode(text, add_special_tokens=False))
