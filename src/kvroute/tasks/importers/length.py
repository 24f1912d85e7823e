"""Instances longer than the model's window: measure, skip, or cut from the middle.

An instance's length is the number of tokens of its full prompt as :func:`build_prompt` makes it
(chat template, context, question, answer prefix) plus its ``max_new_tokens`` (the answer needs
room in the window too). Truncation keeps the head and the tail of the *context* — equal numbers
of context tokens, cut at token boundaries and joined as they are (LongBench's and kvpress's
convention: ``decode(ids[:half]) + decode(ids[-half:])``) — and leaves question and answer prefix
untouched. The caller re-locates the answers in the shortened context.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvroute.tasks.instance import TaskInstance
from kvroute.tasks.prompt import build_prompt

MIN_CONTEXT_TOKENS = 16
"""Below this many context tokens a middle cut is refused and the instance is skipped as too long."""


def prompt_length(tokenizer: Any, inst: TaskInstance) -> int:
    """Tokens ``inst`` occupies in the model's window: prompt + ``meta["max_new_tokens"]``."""
    return len(build_prompt(tokenizer, inst).input_ids) + int(inst.meta.get("max_new_tokens") or 0)


@dataclass(frozen=True)
class MiddleCut:
    """The shortened context and what was removed (character range of the original context)."""

    context: str
    removed: tuple[int, int]
    kept_context_tokens: int


def cut_middle(tokenizer: Any, context: str, keep_tokens: int) -> MiddleCut | None:
    """``context`` with its middle removed so that about ``keep_tokens`` of its tokens remain."""
    if keep_tokens < MIN_CONTEXT_TOKENS:
        return None
    enc = tokenizer(context, add_special_tokens=False, return_offsets_mapping=True)
    offsets = [tuple(o) for o in enc["offset_mapping"]]
    n = len(offsets)
    if keep_tokens >= n:
        return MiddleCut(context, (0, 0), n)
    head = keep_tokens // 2
    tail = keep_tokens - head
    cut_start = offsets[head - 1][1] if head else 0
    cut_end = offsets[n - tail][0] if tail else len(context)
    return MiddleCut(context[:cut_start] + context[cut_end:], (cut_start, cut_end), head + tail)
