"""``multi_entity``: several linked people whose attributes must not be swapped.

    Maren Oskvold and Tobin Hale are neighbours. Maren was born in Velkirra, while Tobin was born
    in Dunmarrow. Tobin works for the Brasswind Guild, while Maren works for the Ironleaf Trust.
    Q: Which organization does Maren Oskvold work for?   A: Ironleaf Trust  (distractor: Brasswind Guild)

Facts of the same attribute are stated side by side in one sentence, so the binding of value to
person is the whole task. Each clause is its own evidence unit.
"""

from __future__ import annotations

import random

from kvroute.tasks.family import FAMILIES, Family, TaskSpec
from kvroute.tasks.lexicon import Draw
from kvroute.tasks.people import choose_relations, derived, fill, manipulation, state
from kvroute.tasks.relations import MANIPULABLE_TYPES, Relation
from kvroute.tasks.text import Draft, Sentence

VERSION = 2
_ATTRIBUTES = {1: 2, 2: 3, 3: 4}
_LINKS = ("neighbours", "cousins", "colleagues", "old classmates", "business partners")


@FAMILIES.add
class MultiEntity(Family):
    name = "multi_entity"
    VERSION = VERSION
    summary = "Several linked people with the same attributes stated side by side; values must not be swapped."
    levels = {
        1: "2 people, 2 attributes each, full names; Standard questions",
        2: "3 people, 3 attributes each, first names after the introduction; + Manipulated",
        3: "4 people, 4 attributes each, varied wording; + Part (find the person by one attribute)",
    }
    max_distractors = 5  # other people

    def level_distractors(self, difficulty: int) -> int:
        return difficulty

    def valid_combo(self, answer_type: str, question_type: str) -> bool:
        return question_type != "Manipulated" or answer_type in MANIPULABLE_TYPES

    def draft(self, rng: random.Random, spec: TaskSpec, *, answer_type: str, question_type: str,
              unanswerable: bool, distractors: int) -> Draft:
        draw = Draw(rng)
        level = spec.difficulty
        asked, _, others = choose_relations(rng, answer_type, same_type=0, others=_ATTRIBUTES[level] - 1)
        if question_type == "Part" and not others:
            others = choose_relations(rng, answer_type, same_type=0, others=1)[2]
        rels: list[Relation] = [asked, *others]
        rng.shuffle(rels)
        people = draw.people(1 + distractors)
        profiles = [fill(draw, p, rels) for p in people]
        target = rng.randrange(len(people))
        key = rng.choice(others) if others else asked
        evidence = {(target, asked.name)} | ({(target, key.name)} if question_type == "Part" else set())

        names = [p.name for p in people]
        intro = ", ".join(names[:-1]) + f" and {names[-1]} are {rng.choice(_LINKS)}."
        sentences = [Sentence(intro, evidence=level >= 2)]  # introduces the first names at level 2+
        for r in rels:
            order = list(range(len(people)))
            rng.shuffle(order)
            for j, k in enumerate(order):
                label = people[k].first if level >= 2 else people[k].name
                text = state(r, people[k], profiles[k].value(r), name=label,
                             variant=rng.randrange(2) if level >= 3 else 0).text
                text = text[:-1]  # drop the full stop; clauses are paired below
                last = j == len(order) - 1 or j % 2 == 1
                if j % 2 == 1:  # second clause: "..., while tobin ..." keeps names capitalised
                    text = "while " + (text if text.startswith(label) else text[:1].lower() + text[1:])
                sentences.append(Sentence(text + ("." if last else ","), evidence=(k, r.name) in evidence))

        value = profiles[target].value(asked)
        wrong = [prof.value(asked) for k, prof in enumerate(profiles) if k != target]
        meta = {"relation": asked.name, "people": len(people)}
        subject = people[target]
        if question_type == "Manipulated":
            m = manipulation(rng, asked)
            question, answers, wrong = m.question.format(n=subject.name), [m.derive(value)], derived(m, wrong)
            meta["manipulation"] = m.question
        elif question_type == "Part":
            question, answers = asked.ask(key.who(profiles[target].value(key))), [value]
            meta["identified_by"] = key.name
        else:
            question, answers = asked.ask(subject.name), [value]
        return Draft([sentences], question, answers, answer_type, question_type, wrong, meta=meta)
