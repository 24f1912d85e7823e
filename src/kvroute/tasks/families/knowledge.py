"""``knowledge``: template-filled biographies of fictional people, many attributes each.

Every person has the same attributes (born in, works for, keeps a pet, ...), one paragraph per
person, so a wrong binding answers with another person's value. Manipulated questions transform
the stated fact (year of a date, first name, material, +1) or search it inversely ("Who was born
in Velkirra?"); Part questions identify the person by one attribute and ask another.
"""

from __future__ import annotations

import random

from kvroute.tasks.family import FAMILIES, Family, TaskSpec
from kvroute.tasks.lexicon import Draw, article
from kvroute.tasks.people import choose_relations, derived, fill, manipulation, state
from kvroute.tasks.relations import MANIPULABLE_TYPES
from kvroute.tasks.text import Draft

VERSION = 2
_ATTRIBUTES = {1: 4, 2: 6, 3: 8}


@FAMILIES.add
class Knowledge(Family):
    name = "knowledge"
    VERSION = VERSION
    summary = "Biographies of fictional people with the same attributes each; knowledge manipulation questions."
    levels = {
        1: "2 biographies of 4 attributes, names in every sentence; Standard questions",
        2: "3 biographies of 6 attributes, pronouns; + Manipulated (incl. inverse search)",
        3: "4 biographies of 8 attributes; + Part (find the person by one attribute, ask another)",
    }
    max_distractors = 7  # other biographies

    def level_distractors(self, difficulty: int) -> int:
        return difficulty

    def valid_combo(self, answer_type: str, question_type: str) -> bool:
        return question_type != "Manipulated" or answer_type in MANIPULABLE_TYPES

    def draft(self, rng: random.Random, spec: TaskSpec, *, answer_type: str, question_type: str,
              unanswerable: bool, distractors: int) -> Draft:
        draw = Draw(rng)
        level = spec.difficulty
        n_attr = _ATTRIBUTES[level]
        asked, _, others = choose_relations(rng, answer_type, same_type=0, others=n_attr - 1)
        rels = [asked, *others]
        people = draw.people(1 + distractors)
        profiles = [fill(draw, p, rels) for p in people]
        target = rng.randrange(len(people))
        subject, profile = people[target], profiles[target]
        # inverse search needs an attribute to search by; Part needs one to identify the person
        key = rng.choice(others) if others else asked
        meta = {"relation": asked.name, "people": len(people)}

        inverse = (question_type == "Manipulated" and answer_type == "Person" and key is not asked
                   and rng.random() < 0.5)
        evidence = {key.name} if inverse else {asked.name, key.name} if question_type == "Part" else {asked.name}
        blocks = []
        for i, (p, prof) in enumerate(zip(people, profiles, strict=True)):
            order = list(rels)
            rng.shuffle(order)
            blocks.append([state(r, p, prof.value(r), pronoun=level >= 2 and j > 0,
                                 variant=rng.randrange(2) if level >= 2 else 0,
                                 evidence=i == target and (r.name in evidence or (inverse and j == 0)),
                                 para=j == 0 and i > 0)
                           for j, r in enumerate(order)])
        value = profile.value(asked)
        wrong = [prof.value(asked) for k, prof in enumerate(profiles) if k != target]
        if inverse:  # inverse search: who holds this value? (the name is in the biography's first sentence)
            kv = profile.value(key)
            question = f"Who {key.describe.format(v=kv, a=article(kv))}?"
            meta["inverse"] = key.name
            wrong = [p.name for k, p in enumerate(people) if k != target]
            return Draft(blocks, question, [subject.name], answer_type, question_type, wrong, meta=meta)
        if question_type == "Manipulated":
            m = manipulation(rng, asked)
            question, answers, wrong = m.question.format(n=subject.name), [m.derive(value)], derived(m, wrong)
            meta["manipulation"] = m.question
        elif question_type == "Part":
            question, answers = asked.ask(key.who(profile.value(key))), [value]
            meta["identified_by"] = key.name
        else:
            question, answers = asked.ask(subject.name), [value]
        return Draft(blocks, question, answers, answer_type, question_type, wrong, meta=meta)
