"""Synthetic tasks: seven generator families, one JSONL format, and prompts aligned to tokens.

>>> from kvroute.tasks import TaskSpec, generate_tasks
>>> tasks = generate_tasks(TaskSpec("base", n=3, seed=0))
"""

from __future__ import annotations

from typing import Any

from kvroute.tasks.families import FAMILIES, Family, TaskSpec, get_family
from kvroute.tasks.instance import ANSWER_TYPES, FORMAT_VERSION, IDK, QUESTION_TYPES, Span, TaskInstance
from kvroute.tasks.io import dumps_tasks, load_tasks, save_tasks
from kvroute.tasks.prompt import Prompt, build_prompt, prompt_texts


def generate_tasks(spec: TaskSpec, tokenizer: Any | None = None) -> list[TaskInstance]:
    """Generate ``spec.n`` instances of ``spec.family`` (``tokenizer`` measures ``target_tokens``)."""
    return get_family(spec.family).generate(spec, tokenizer)


__all__ = ["ANSWER_TYPES", "FAMILIES", "FORMAT_VERSION", "IDK", "QUESTION_TYPES", "Family", "Prompt", "Span",
           "TaskInstance", "TaskSpec", "build_prompt", "dumps_tasks", "generate_tasks", "get_family", "load_tasks",
           "prompt_texts", "save_tasks"]
