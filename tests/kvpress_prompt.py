"""The prompt the engine tests hand to kvroute and to kvpress's pipeline side by side: token ids for kvroute, the same
context and question as text for kvpress (:func:`kvroute.engine.reference.kvpress_logits` and its kin)."""

from dataclasses import dataclass


@dataclass
class Prompt:
    context_ids: list[int]
    question_ids: list[int]
    kvpress_context: str
    kvpress_question: str
    answer_prefix: str = ""
    question_window: int = 0
