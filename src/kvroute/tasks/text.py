"""From a family's draft to a context string with exact character spans.

A family writes its story as :class:`Sentence` objects grouped in blocks (a block's sentences stay
together, in order). :func:`assemble` lays the blocks out — alone, or inside filler text when a
target length in tokens is asked for, with the anchor block at a chosen depth — and returns the
context with the character span of every evidence sentence. Answer spans are the whole-word
occurrences of a gold answer inside the evidence spans.
"""

from __future__ import annotations

import math
import random
import re
import string
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from kvroute.tasks.instance import Span
from kvroute.tasks.lexicon import cap, filler_sentence

TOKENS_PER_WORD = 1.5
"""Fallback estimate of tokens per whitespace word when no tokenizer is given. Measured on this
lexicon's text: SmolLM2 1.28, Qwen2.5 1.26 — so estimated lengths are ~15% shorter in those models'
real tokens. Pass the model's tokenizer for exact lengths."""

_FMT = string.Formatter()


@dataclass(frozen=True)
class Sentence:
    text: str
    evidence: bool = False
    para: bool = False  # starts a new paragraph


def render(template: str, slots: dict[str, str], *, evidence: bool = False, para: bool = False) -> Sentence:
    """Fill ``template``'s ``{name}`` slots and capitalise the first letter."""
    parts = []
    for literal, name, _spec, _conv in _FMT.parse(template):
        parts.append(literal)
        if name is not None:
            parts.append(slots[name])
    return Sentence(cap("".join(parts)), evidence=evidence, para=para)


@dataclass
class Draft:
    """What a family generator produces for one instance, before layout."""

    blocks: list[list[Sentence]]
    question: str
    answers: list[str]
    answer_type: str
    question_type: str
    distractors: list[str] = field(default_factory=list)
    unanswerable: bool = False
    anchor: int = 0  # the block placed at ``depth`` inside filler
    scatter: bool = False  # place the other blocks at random depths (else right after the anchor, in order)
    meta: dict[str, Any] = field(default_factory=dict)


class TokenCounter:
    """Counts tokens of text with ``tokenizer`` (no special tokens), or estimates them from words."""

    def __init__(self, tokenizer: Any | None = None) -> None:
        self.tokenizer = tokenizer
        self.exact = tokenizer is not None
        self.name = getattr(tokenizer, "name_or_path", None) or (type(tokenizer).__name__ if tokenizer else "estimate")

    def __call__(self, text: str) -> int:
        if self.tokenizer is None:
            return math.ceil(len(text.split()) * TOKENS_PER_WORD)
        return len(self.tokenizer.encode(text, add_special_tokens=False))


@dataclass(frozen=True)
class Layout:
    context: str
    evidence_spans: tuple[Span, ...]
    n_filler: int  # filler sentences used
    depth: float | None  # realised relative position of the anchor block (None without filler)


def _join(pieces: Sequence[Sentence]) -> tuple[str, list[Span]]:
    out: list[str] = []
    spans: list[Span] = []
    pos = 0
    for i, s in enumerate(pieces):
        if i:
            sep = "\n\n" if s.para else " "
            out.append(sep)
            pos += len(sep)
        spans.append((pos, pos + len(s.text)))
        out.append(s.text)
        pos += len(s.text)
    return "".join(out), spans


def assemble(draft: Draft, *, rng: random.Random, target_tokens: int | None, depth: float,
             count: TokenCounter, paragraph: int = 8) -> Layout:
    """Lay out ``draft``'s blocks, padded with filler to about ``target_tokens`` when given.

    ``depth`` in [0, 1] is the share of filler tokens placed before the anchor block. With
    ``draft.scatter`` the other blocks go to random depths (drawn from ``rng``), otherwise they
    follow the anchor block in order. Filler sentences are added until the estimate reaches the
    target; the result is within one filler sentence (~15 tokens) of it.
    """
    story = [s for b in draft.blocks for s in b]
    if target_tokens is None:
        text, spans = _join(story)
        return Layout(text, tuple(sp for sp, s in zip(spans, story, strict=True) if s.evidence), 0, None)

    need = target_tokens - count(_join(story)[0])
    filler: list[str] = []
    filler_tokens: list[int] = []
    total = 0
    while total < need:
        f = filler_sentence(rng)
        t = count(" " + f) if count.exact else count(f)
        if total + t - need > need - total:  # adding it would overshoot more than stopping short
            break
        filler.append(f)
        filler_tokens.append(t)
        total += t
    # where each block goes: index into the filler list (blocks inserted before filler[idx])
    cum = [0]
    for t in filler_tokens:
        cum.append(cum[-1] + t)

    def index_at(frac: float) -> int:
        goal = frac * total
        return min(range(len(cum)), key=lambda i: (abs(cum[i] - goal), i))

    anchor_idx = index_at(depth)
    order = list(range(len(draft.blocks)))
    if draft.scatter:
        where = {b: (index_at(rng.random()) if b != draft.anchor else anchor_idx) for b in order}
    else:
        where = {b: anchor_idx for b in order}
        order = [draft.anchor] + [b for b in order if b != draft.anchor]
    pieces: list[Sentence] = []
    by_index: dict[int, list[int]] = {}
    for b in order:
        by_index.setdefault(where[b], []).append(b)
    n_since_para = 0
    for i in range(len(filler) + 1):
        for b in by_index.get(i, []):
            for k, s in enumerate(draft.blocks[b]):
                pieces.append(Sentence(s.text, s.evidence, para=s.para if k else False))
        if i < len(filler):
            n_since_para += 1
            brk = n_since_para > paragraph
            if brk:
                n_since_para = 1
            pieces.append(Sentence(filler[i], para=brk))
    text, spans = _join(pieces)
    ev = tuple(sp for sp, s in zip(spans, pieces, strict=True) if s.evidence)
    realised = cum[anchor_idx] / total if total else 0.0
    return Layout(text, ev, len(filler), round(realised, 4))


def find_answer_spans(context: str, answers: Sequence[str], within: Sequence[Span]) -> tuple[Span, ...]:
    """Whole-word occurrences of any answer inside the ``within`` spans, sorted and de-duplicated."""
    found: set[Span] = set()
    for a in answers:
        pat = re.compile(r"(?<!\w)" + re.escape(a) + r"(?!\w)")
        for s, e in within:
            for m in pat.finditer(context, s, e):
                found.add((m.start(), m.end()))
    return tuple(sorted(found))
