"""Several questions over one context: conversations and their turn prompts ("compress once, ask many").

A **conversation** is the instances that share one context, in turn order: the multi-question form
of the synthetic families (``TaskSpec(questions=3)``, whose instances carry ``meta["conversation"]``
and ``meta["turn"]``), or the rows of an imported dataset that share a context (kvpress's datasets
ask several questions per document), in file order.

Turn ``k``'s prompt is what a chat server holds after ``k - 1`` exchanges: the context, compressed
once, then — uncompressed — each earlier question and the answer given to it, then question ``k``.
With a chat template the exchanges are rendered as user and assistant messages (the context opens
the first user message, exactly as :func:`kvroute.tasks.prompt.build_prompt` renders turn 1); without
one, each exchange is ``question + "\\n" + answer_prefix + answer + "\\n"``. The context tokens are
those of turn 1, so one prefill serves every turn.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from kvroute.errors import ConfigError, TaskFormatError
from kvroute.tasks.instance import TaskInstance
from kvroute.tasks.prompt import Prompt, _encode, _positions, answer_separator, build_prompt, prompt_texts

#: the only regime with several turns: the question must be outside the compressed prefix
TURN_REGIME = "agnostic"


def conversations(instances: Sequence[TaskInstance]) -> list[list[TaskInstance]]:
    """``instances`` grouped into conversations (first appearance order), each in turn order.

    Instances with ``meta["conversation"]`` group by it and sort by ``meta["turn"]``; the others group
    by identical context, in the order given. A single instance is a conversation of one turn.
    """
    groups: dict[tuple[str, str], list[TaskInstance]] = {}
    for inst in instances:
        conv = inst.meta.get("conversation")
        key = ("meta", str(conv)) if conv is not None else ("context", inst.context)
        groups.setdefault(key, []).append(inst)
    out = []
    for (kind, name), group in groups.items():
        if kind == "meta":
            if len({i.context for i in group}) > 1:
                raise TaskFormatError(f"conversation {name}: its instances have different contexts", field="meta")
            turns = [i.meta.get("turn") for i in group]
            if len(set(turns)) != len(turns) or not all(isinstance(t, int) for t in turns):
                raise TaskFormatError(f"conversation {name}: turns {turns} are not distinct integers", field="meta")
            group = sorted(group, key=lambda i: int(i.meta["turn"]))
        out.append(group)
    return out


def conversation_prompt(tokenizer: Any, turns: Sequence[TaskInstance], answers: Sequence[str], *,
                        regime: str = TURN_REGIME, system_prompt: str | None = None,
                        answer_prefix: str = "") -> Prompt:
    """The prompt of the last of ``turns`` after the earlier ones were answered with ``answers``: turn 1's
    context, then the exchanges uncompressed.

    ``answers`` are the bare answer texts (``"Velkirra"``, as the model's stripped output or the gold);
    each is written after the answer prefix with :func:`kvroute.tasks.prompt.answer_separator`, the
    separator the model itself writes there (a space, unless the prefix ends with one), so an answer
    prefix ``"Answer: "`` never gets two spaces. Surrounding whitespace is stripped first, so ``" Velkirra"``
    and ``"Velkirra"`` give the same prompt.

    Positions (evidence, answer, distractors) are those of the last turn's instance inside the shared
    context; ``question_positions`` those of its question inside the suffix.
    """
    if len(answers) != len(turns) - 1:
        raise ConfigError(f"{len(turns)} turns need {len(turns) - 1} earlier answers, got {len(answers)}")
    last = turns[-1]
    prompt = build_prompt(tokenizer, last, regime=regime, system_prompt=system_prompt, answer_prefix=answer_prefix)
    if len(turns) == 1:
        return prompt
    if regime != TURN_REGIME:
        raise ConfigError(f"several questions over one context need the {TURN_REGIME} regime (the question is asked "
                          f"after the compressed context); got {regime!r}")
    if any(t.context != last.context for t in turns):
        raise ConfigError(f"turns {', '.join(t.id for t in turns)} do not share one context")
    prefix = prompt.answer_prefix
    answers = [answer_separator(prompt, a.strip()) + a.strip() for a in answers]
    questions = [prompt_texts(t)[1] for t in turns]
    if getattr(tokenizer, "chat_template", None) is None:
        parts = [q + "\n" + prefix + a + "\n" for q, a in zip(questions, answers, strict=False)]
        suffix = "".join(parts) + questions[-1] + "\n" + prefix
        q_start = len(suffix) - len(questions[-1] + "\n" + prefix) + questions[-1].find(last.question)
    else:
        suffix, q_start = _chat_suffix(tokenizer, prompt, questions, answers, system_prompt)
        q_start += questions[-1].lstrip().find(last.question)
    question_ids, offsets = _encode(tokenizer, suffix)
    n = prompt.n_context
    qpos = _positions(offsets, q_start, q_start + len(last.question), shift=n)
    return replace(prompt, question_ids=question_ids, question_text=suffix, question_positions=qpos,
                   kvpress_question=suffix)


def _chat_suffix(tokenizer: Any, prompt: Prompt, questions: Sequence[str], answers: Sequence[str],
                 system_prompt: str | None) -> tuple[str, int]:
    """The rendered exchanges after the context (chat template) and where the last question starts in them."""
    sep = "#" * (len(prompt.kvpress_context) + 10)
    mark = "@" * 12  # stands for the last question, to find where it starts
    messages: list[dict[str, str]] = [{"role": "system", "content": system_prompt}] if system_prompt else []
    messages.append({"role": "user", "content": prompt.kvpress_context + sep + questions[0]})
    for a, q in zip(answers, [*questions[1:-1], mark], strict=True):
        messages.append({"role": "assistant", "content": prompt.answer_prefix + a})
        messages.append({"role": "user", "content": q.lstrip() if q is not mark else mark})
    rendered = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    parts = rendered.split(sep)
    if len(parts) != 2 or parts[0] != prompt.context_text or rendered.count(mark) != 1:
        raise ConfigError(f"the chat template of {getattr(tokenizer, 'name_or_path', 'this tokenizer')} renders a "
                          "conversation's context differently from its first turn, so one prefill cannot serve "
                          "every turn")
    before, after = parts[1].split(mark)
    asked = questions[-1].lstrip()
    return before + asked + after + prompt.answer_prefix, len(before)
