"""``base``: a short passage about one person with tightly bound attributes.

    Maren Oskvold was born in Velkirra. She works for the Brasswind Guild. She keeps a moon
    otter as a pet.            Q: In which town was Maren Oskvold born?   A: Velkirra

Distractors are the person's other values of the asked type (born in X, lives in Y). Part
questions go through a second, linked person ("Where was the person who trained Maren born?").
"""

from __future__ import annotations

import random

from kvroute.tasks.family import FAMILIES, Family, TaskSpec
from kvroute.tasks.lexicon import Draw
from kvroute.tasks.people import choose_relations, derived, fill, manipulation, state
from kvroute.tasks.relations import BY_TYPE, MANIPULABLE_TYPES
from kvroute.tasks.text import Draft, Sentence

VERSION = 2
_ATTRIBUTES = {1: 3, 2: 5, 3: 7}


@FAMILIES.add
class Base(Family):
    name = "base"
    VERSION = VERSION
    summary = "A short passage about one person with tightly bound attributes."
    levels = {
        1: "3 attributes, the full name in every sentence; Standard questions",
        2: "5 attributes, pronouns after the first sentence, 1 same-type distractor; + Manipulated",
        3: "7 attributes, 2 same-type distractors, a linked second person; + Part",
    }
    max_distractors = 2

    def valid_combo(self, answer_type: str, question_type: str) -> bool:
        return question_type != "Manipulated" or answer_type in MANIPULABLE_TYPES

    def draft(self, rng: random.Random, spec: TaskSpec, *, answer_type: str, question_type: str,
              unanswerable: bool, distractors: int) -> Draft:
        draw = Draw(rng)
        level = spec.difficulty
        pronouns = level >= 2
        variant = (lambda: rng.randrange(2)) if level >= 2 else (lambda: 0)
        subject = draw.person()
        link = rng.choice(BY_TYPE["Person"]) if question_type == "Part" else None
        n_other = max(_ATTRIBUTES[level] - 1 - distractors - (link is not None), 0)
        asked, same, others = choose_relations(rng, answer_type, same_type=distractors, others=n_other,
                                               exclude=(link.name,) if link else ())
        rels = [asked, *same, *others]
        rng.shuffle(rels)
        profile = fill(draw, subject, rels)
        meta = {"relation": asked.name}

        if link is None:
            value = profile.value(asked)
            sentences = [state(r, subject, profile.value(r), pronoun=pronouns and i > 0, variant=variant(),
                               evidence=r is asked) for i, r in enumerate(rels)]
            wrong = [profile.value(r) for r in same]
            if question_type == "Manipulated":
                m = manipulation(rng, asked)
                question, answers, wrong = m.question.format(n=subject.name), [m.derive(value)], derived(m, wrong)
                meta["manipulation"] = m.question
            else:
                question, answers = asked.ask(subject.name), [value]
            return Draft([sentences], question, answers, answer_type, question_type, wrong, meta=meta)

        # Part: the asked attribute belongs to the person the subject is linked to
        other = draw.person()
        profile.facts[link.name] = other.name
        rels.insert(rng.randrange(len(rels) + 1), link)
        value = draw.value(asked.answer_type)
        sentences = [state(r, subject, profile.value(r), pronoun=pronouns and i > 0, variant=variant(),
                           evidence=r is link) for i, r in enumerate(rels)]
        second: list[Sentence] = [state(asked, other, value, variant=variant(), evidence=True)]
        wrong = [profile.value(asked)] + [profile.value(r) for r in same]
        question = asked.ask(link.np.format(n=subject.name))
        meta["link"] = link.name
        return Draft([sentences + second], question, [value], answer_type, question_type, wrong, meta=meta)
