"""``long_context``: single-sentence facts about several people buried in long neutral filler.

The asked fact sits at a controllable ``depth`` (0 = start of the context, 1 = end); the other
people's facts of the same attribute (the distractors) are scattered at random depths. The length
is set in tokens — measured with the tokenizer given to ``generate`` — from ~150 words up to the
model's window (``target_tokens``); each level has a default length.
"""

from __future__ import annotations

import random

from kvroute.tasks.family import FAMILIES, Family, TaskSpec
from kvroute.tasks.lexicon import Draw
from kvroute.tasks.people import choose_relations, derived, manipulation, state
from kvroute.tasks.relations import MANIPULABLE_TYPES
from kvroute.tasks.text import Draft

VERSION = 2
_TARGET = {1: 200, 2: 800, 3: 2400}


@FAMILIES.add
class LongContext(Family):
    name = "long_context"
    VERSION = VERSION
    summary = "Facts about several people buried in long filler; length in tokens and evidence depth are knobs."
    levels = {
        1: f"about {_TARGET[1]} tokens (~150 words); 2 people with the asked attribute",
        2: f"about {_TARGET[2]} tokens; 2 people",
        3: f"about {_TARGET[3]} tokens; 2 people",
    }
    max_distractors = 12  # other people with the same attribute
    always_filler = True

    def level_question_types(self, difficulty: int) -> tuple[str, ...]:
        return ("Standard",)

    def level_distractors(self, difficulty: int) -> int:
        return 1  # only the length changes between levels; raise competition with --distractors

    def level_target_tokens(self, difficulty: int) -> int | None:
        return _TARGET[difficulty]

    def valid_combo(self, answer_type: str, question_type: str) -> bool:
        return question_type != "Manipulated" or answer_type in MANIPULABLE_TYPES

    def draft(self, rng: random.Random, spec: TaskSpec, *, answer_type: str, question_type: str,
              unanswerable: bool, distractors: int) -> Draft:
        draw = Draw(rng)
        asked, _, others = choose_relations(rng, answer_type, same_type=0, others=2)
        key = others[0]
        people = draw.people(1 + distractors)
        target = 0  # blocks are scattered, so the subject's position in the list does not matter
        values = [draw.value(asked.answer_type) for _ in people]
        blocks = [[state(asked, p, v, evidence=k == target)] for k, (p, v) in enumerate(zip(people, values,
                                                                                               strict=True))]
        # one background fact per person; the subject's is the Part key
        extra = [key if k == target else rng.choice(others) for k in range(len(people))]
        extra_values = [draw.value(r.answer_type) for r in extra]
        part = question_type == "Part"
        blocks += [[state(r, p, v, evidence=part and k == target)]
                   for k, (p, r, v) in enumerate(zip(people, extra, extra_values, strict=True))]
        subject, value = people[target], values[target]
        wrong = values[1:]
        meta: dict[str, object] = {"relation": asked.name, "people": len(people)}
        if question_type == "Manipulated":
            m = manipulation(rng, asked)
            question, answers, wrong = m.question.format(n=subject.name), [m.derive(value)], derived(m, wrong)
            meta["manipulation"] = m.question
        elif part:
            question, answers = asked.ask(key.who(extra_values[target])), [value]
            meta["identified_by"] = key.name
        else:
            question, answers = asked.ask(subject.name), [value]
        return Draft(blocks, question, answers, answer_type, question_type, wrong, anchor=0, scatter=True,
                     meta=meta)
