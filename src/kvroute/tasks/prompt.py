"""Prompts for a model, built exactly as kvpress's pipeline builds them, with spans aligned to tokens.

kvpress (``KVPressTextGenerationPipeline.preprocess``) takes a ``context`` and a ``question``
string, renders ``[{"role": "user", "content": context + SEP}]`` through the chat template with
``add_generation_prompt=True``, splits the result at SEP into the context text and the template
tail, and tokenises the two parts *separately* (``add_special_tokens=False``)::

    context_ids  = encode(template_head + context)                    # what a press compresses
    question_ids = encode(question + template_tail + answer_prefix)   # appended after compression

Without a chat template the context is ``bos_token + context`` and the tail is ``"\\n"``.
:func:`build_prompt` does the same, so ``Prompt.input_ids`` are token for token what kvpress feeds
the model given :attr:`Prompt.kvpress_context` and :attr:`Prompt.kvpress_question`, and it maps the
instance's character spans to token positions with the tokenizer's offset mapping.

Regimes: ``"agnostic"`` — the question is in the suffix (kvpress's default); ``"aware"`` — the
question is inside the compressed prefix (kvpress convention: ``context + question`` as context and
an empty question), only the template tail and answer prefix are the suffix.

Prompt styles (``instance.meta["prompt_style"]``): ``"kvroute"`` (the default) wraps the context
in :data:`INSTRUCTION` and the question in :data:`QUESTION_TEMPLATE`; ``"raw"`` passes the
context and the question through unchanged and, unless the caller gives its own
``answer_prefix``, uses ``instance.meta["answer_prefix"]`` — exactly what kvpress's evaluation
feeds its pipeline for a dataset row (``kvroute tasks import`` writes raw instances).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from kvroute.errors import ConfigError, TaskFormatError
from kvroute.tasks.instance import Span, TaskInstance

REGIMES = ("agnostic", "aware")
INSTRUCTION = "Read the text below and answer the question that follows it.\n\nText:\n"
QUESTION_TEMPLATE = ("\n\nQuestion: {question}\nReply with only the answer (a name, number, date or short phrase "
                     "from the text), not a full sentence.")
ABSTAIN_CLAUSE = " If the text does not say, answer \"I don't know\"."
_QUESTION_OFFSET = QUESTION_TEMPLATE.index("{question}")
PROMPT_STYLES = ("kvroute", "raw")


def prompt_style(instance: TaskInstance) -> str:
    """``instance.meta["prompt_style"]`` (default ``"kvroute"``), checked against :data:`PROMPT_STYLES`."""
    style = instance.meta.get("prompt_style", "kvroute")
    if style not in PROMPT_STYLES:
        raise TaskFormatError(f"prompt_style {style!r} of instance {instance.id} is not one of "
                              f"{', '.join(PROMPT_STYLES)}", field="meta")
    return str(style)


def prompt_texts(instance: TaskInstance, *, abstain: bool | None = None) -> tuple[str, str]:
    """The ``context=`` and ``question=`` strings one would pass to kvpress's pipeline.

    ``abstain`` adds "If the text does not say, answer 'I don't know'" to the question; by default
    it follows ``instance.meta["abstain"]`` (set by the coreference family, which has
    unanswerable items; set it in your own tasks' meta to get the same prompt).
    """
    if prompt_style(instance) == "raw":
        return instance.context, instance.question
    if abstain is None:
        abstain = bool(instance.meta.get("abstain", False))
    question = QUESTION_TEMPLATE.format(question=instance.question) + (ABSTAIN_CLAUSE if abstain else "")
    return INSTRUCTION + instance.context, question


@dataclass(frozen=True)
class Prompt:
    """A tokenised prompt split into the compressible prefix and the uncompressed suffix.

    Positions index ``input_ids`` (= ``context_ids + question_ids``); sorted, unique.
    """

    context_ids: list[int]  # the prefix a press compresses, length T = n_context
    question_ids: list[int]  # appended after compression
    answer_positions: list[int]  # tokens overlapping an answer span (subset of evidence_positions)
    evidence_positions: list[int]  # tokens overlapping an evidence or answer span
    question_positions: list[int]  # tokens overlapping the question text
    answer_span_positions: list[list[int]]  # per answer span of the instance, its token positions
    context_text: str  # text of the prefix (template head, instruction, context[, question])
    question_text: str  # text of the suffix
    context_char_offset: int  # where instance.context starts inside context_text
    kvpress_context: str  # what to pass to kvpress as context= to get the same tokens
    kvpress_question: str  # ... and as question=
    answer_prefix: str
    regime: str
    instance_id: str
    question_window: int = 0  # aware regime: the prefix's last tokens that hold the question (finch's window)
    #: per occurrence of a distractor value in the context (whole-word matches, in text order), its token
    #: positions minus the answer's: the ``distractor`` restoration null
    distractor_span_positions: list[list[int]] = field(default_factory=list)

    @property
    def input_ids(self) -> list[int]:
        return self.context_ids + self.question_ids

    @property
    def n_context(self) -> int:
        """T: number of context (compressible) tokens."""
        return len(self.context_ids)

    @property
    def n_question(self) -> int:
        return len(self.question_ids)

    @property
    def text(self) -> str:
        return self.context_text + self.question_text


def _encode(tokenizer: Any, text: str) -> tuple[list[int], list[tuple[int, int]]]:
    if not getattr(tokenizer, "is_fast", True):
        raise ConfigError(f"{type(tokenizer).__name__} is a slow tokenizer; span alignment needs a fast "
                          "tokenizer's offset mapping (load it with use_fast=True)")
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    return list(enc["input_ids"]), [tuple(o) for o in enc["offset_mapping"]]


def _positions(offsets: Sequence[tuple[int, int]], start: int, end: int, shift: int = 0) -> list[int]:
    """Tokens whose character range overlaps ``[start, end)`` (a partial overlap counts)."""
    return [i + shift for i, (s, e) in enumerate(offsets) if e > s and s < end and e > start]


def _occurrences(text: str, value: str) -> list[tuple[int, int]]:
    """Character spans of ``value`` in ``text``, not inside a longer word (``"12"`` is not found in ``"120"``)."""
    head = r"(?<!\w)" if value[:1].isalnum() or value[:1] == "_" else ""
    tail = r"(?!\w)" if value[-1:].isalnum() or value[-1:] == "_" else ""
    return [m.span() for m in re.finditer(head + re.escape(value) + tail, text)]


def build_prompt(tokenizer: Any, instance: TaskInstance, *, regime: str = "agnostic", system_prompt: str | None = None,
                 answer_prefix: str = "", abstain: bool | None = None) -> Prompt:
    """Tokenise ``instance`` for a model the way kvpress's pipeline does, with span positions.

    ``system_prompt`` goes in a system message before the user message (kvpress has none; leave it
    ``None`` to match kvpress). Raises ``TaskFormatError`` when an answer span maps to no token.
    """
    if regime not in REGIMES:
        raise ConfigError(f"unknown regime {regime!r}; use one of {', '.join(REGIMES)}")
    raw = prompt_style(instance) == "raw"
    if raw and not answer_prefix:
        answer_prefix = str(instance.meta.get("answer_prefix") or "")
    ctx, q = prompt_texts(instance, abstain=abstain)
    kv_context, kv_question = (ctx + q, "") if regime == "aware" else (ctx, q)

    if getattr(tokenizer, "chat_template", None) is None:
        bos = getattr(tokenizer, "bos_token", None) or ""
        head = bos + (f"{system_prompt}\n\n" if system_prompt else "")
        prefix, tail = head + kv_context, "\n"
    else:
        sep = "#" * (len(kv_context) + 10)
        messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
        messages.append({"role": "user", "content": kv_context + sep})
        rendered = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        parts = rendered.split(sep)
        if len(parts) != 2 or not parts[0].endswith(kv_context):
            raise ConfigError(f"the chat template of {getattr(tokenizer, 'name_or_path', 'this tokenizer')} "
                              "rewrites the message text, so character spans cannot be aligned to tokens")
        prefix, tail = parts
    suffix = kv_question + tail + answer_prefix
    base = len(prefix) - len(kv_context)  # where kvpress's context starts inside the prefix text
    ctx_offset = base + (0 if raw else len(INSTRUCTION))

    context_ids, pre_off = _encode(tokenizer, prefix)
    question_ids, suf_off = _encode(tokenizer, suffix)
    n = len(context_ids)

    span_pos: list[list[int]] = []
    for i, (s, e) in enumerate(instance.answer_spans):
        pos = _positions(pre_off, ctx_offset + s, ctx_offset + e)
        if not pos:
            raise TaskFormatError(f"answer span {i} [{s}, {e}] ({instance.span_text((s, e))!r}) of instance "
                                  f"{instance.id} maps to no token", field="answer_spans")
        span_pos.append(pos)
    answer = sorted({p for pos in span_pos for p in pos})
    evidence = set(answer)
    for s, e in instance.evidence_spans:
        evidence.update(_positions(pre_off, ctx_offset + s, ctx_offset + e))

    distractor_pos: list[list[int]] = []
    answer_set = set(answer)
    for value in dict.fromkeys(d for d in instance.distractors if d.strip()):
        for s, e in _occurrences(instance.context, value):
            pos = [p for p in _positions(pre_off, ctx_offset + s, ctx_offset + e) if p not in answer_set]
            if pos:
                distractor_pos.append(pos)
    distractor_pos.sort()

    q_start = 0 if raw else _QUESTION_OFFSET
    window = 0
    if regime == "aware":  # the question's part of the prefix: tokens starting at or after its first character
        q_first = next((i for i, (s_, e_) in enumerate(pre_off) if e_ > s_ and s_ >= base + len(ctx)), n)
        window = n - q_first
        q0 = base + len(ctx) + q_start
        question_pos = _positions(pre_off, q0, q0 + len(instance.question))
    else:
        question_pos = _positions(suf_off, q_start, q_start + len(instance.question), shift=n)

    return Prompt(context_ids=context_ids, question_ids=question_ids, answer_positions=answer,
                  evidence_positions=sorted(evidence), question_positions=question_pos,
                  answer_span_positions=span_pos, context_text=prefix, question_text=suffix,
                  context_char_offset=ctx_offset, kvpress_context=kv_context, kvpress_question=kv_question,
                  answer_prefix=answer_prefix, regime=regime, instance_id=instance.id, question_window=window,
                  distractor_span_positions=distractor_pos)


def context_span(prompt: Prompt, span: Span) -> tuple[int, int]:
    """An instance character span in ``prompt.context_text`` coordinates."""
    return prompt.context_char_offset + span[0], prompt.context_char_offset + span[1]


def answer_separator(prompt: Prompt, text: str) -> str:
    """What separates an answer from the prompt as the model writes it: a space, unless there is one.

    After an answer prefix (``"Answer:"``, ``"... in the text is"``) and after a chat template's
    ``assistant\\n`` alike, the model's answer starts with a space-prefixed word token ("ĠPellmarsh"):
    measured on SmolLM2 after its chat template, that form is 4.6–8.8 nats more likely than the bare
    word (issue 14). No space is added when the prompt already ends with a space or a tab (an
    answer prefix such as ``"Answer: "``), or when ``text`` starts with whitespace.
    """
    if not text or text[0].isspace() or prompt.question_text.endswith((" ", "\t")):
        return ""
    return " "


def answer_ids(tokenizer: Any, prompt: Prompt, text: str) -> list[int]:
    """``text``'s tokens as the model would produce them right after ``prompt`` (its natural continuation).

    Tokenises ``question_text + separator + text`` (the suffix is tokenised on its own, as
    :func:`build_prompt` does, so the prompt's token boundary is the suffix's end) and keeps the
    tokens after ``question_ids``. When the tokenizer merges across that boundary (the prompt's
    last token would change, e.g. a trailing space joining the answer's first word), the prompt
    cannot be re-tokenised, so the continuation text is tokenised on its own instead.
    """
    cont = answer_separator(prompt, text) + text
    q = list(prompt.question_ids)
    full = list(tokenizer(prompt.question_text + cont, add_special_tokens=False)["input_ids"])
    if len(full) > len(q) and full[: len(q)] == q:
        return full[len(q):]
    return list(tokenizer(cont, add_special_tokens=False)["input_ids"])
