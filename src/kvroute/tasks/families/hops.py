"""``hops``: chained facts — follow links between people, then read an attribute.

    Maren Oskvold was trained by Tobin Hale. Tobin Hale lives in Dunmarrow. Maren Oskvold lives
    in Velkirra.      Q: In which town does Maren Oskvold's teacher live?   A: Dunmarrow

From level 2 every person on the chain has the asked attribute, so stopping one hop early (or
following the wrong link to a side person) answers with a distractor. Level 1 is the floor: only
the linked person has a value of the asked type, so matching the type suffices. Levels 1-2 state
the chain in reading order; from level 3 the facts are shuffled and side people hang off the chain.
"""

from __future__ import annotations

import random

from kvroute.tasks.family import FAMILIES, Family, TaskSpec
from kvroute.tasks.lexicon import Draw
from kvroute.tasks.people import derived, manipulation, state
from kvroute.tasks.relations import BY_TYPE, MANIPULABLE_TYPES, RELATIONS
from kvroute.tasks.text import Draft

VERSION = 2


@FAMILIES.add
class Hops(Family):
    name = "hops"
    VERSION = VERSION
    summary = "Chained facts (A's teacher is B; B lives in C); the number of links is the level."
    levels = {
        1: "1 link in reading order; only the linked person has the asked attribute (the floor)",
        2: "1 link in reading order; the start person has the attribute too (a competing value)",
        3: "2 links, facts shuffled; 1 side person",
        4: "3 links, shuffled; 2 side people; + Manipulated (transform the final value)",
    }
    _LINKS = {1: 1, 2: 1, 3: 2, 4: 3}
    question_types = ("Manipulated", "Part")
    max_distractors = 5  # side people linked off the chain (level 1 has 5 free links)

    def level_question_types(self, difficulty: int) -> tuple[str, ...]:
        return ("Part",) if difficulty < 4 else ("Manipulated", "Part")

    def level_distractors(self, difficulty: int) -> int:
        return {1: 0, 2: 0, 3: 1, 4: 2}[difficulty]

    def valid_combo(self, answer_type: str, question_type: str) -> bool:
        return question_type == "Part" or (question_type == "Manipulated" and answer_type in MANIPULABLE_TYPES)

    def draft(self, rng: random.Random, spec: TaskSpec, *, answer_type: str, question_type: str,
              unanswerable: bool, distractors: int) -> Draft:
        draw = Draw(rng)
        n_links = self._LINKS[spec.difficulty]
        link_rels = BY_TYPE["Person"]
        asked = rng.choice(BY_TYPE[answer_type])
        chain = draw.people(n_links + 1)
        links = [rng.choice(link_rels) for _ in range(n_links)]
        values = [draw.value(answer_type) for _ in chain]
        # reading order: each person's attribute, then the link to the next person
        sentences = []
        for i, (p, v) in enumerate(zip(chain, values, strict=True)):
            if i == n_links or spec.difficulty >= 2:
                sentences.append(state(asked, p, v, evidence=i == n_links))
            else:  # level 1: the start person gets another attribute instead (same length, no competitor)
                other = rng.choice([r for r in RELATIONS if r.answer_type not in (answer_type, "Person")])
                sentences.append(state(other, p, draw.value(other.answer_type)))
            if i < n_links:
                sentences.append(state(links[i], p, chain[i + 1].name, evidence=True))
        wrong = values[:-1] if spec.difficulty >= 2 else []
        # side people: a link of another kind from a chain person (never the one the question follows)
        free = [(i, r) for i in range(n_links + 1) for r in link_rels if i == n_links or r is not links[i]]
        rng.shuffle(free)
        for i, r in free[:distractors]:
            side, v = draw.person(), draw.value(answer_type)
            sentences += [state(r, chain[i], side.name), state(asked, side, v)]
            wrong.append(v)
        if spec.difficulty >= 3:
            rng.shuffle(sentences)
        elif rng.random() < 0.5:  # the start's own attribute last, so "the last value" is not the answer
            sentences.append(sentences.pop(0))

        phrase = chain[0].name
        for r in links:
            phrase = r.np.format(n=phrase)
        value = values[-1]
        meta = {"relation": asked.name, "links": [r.name for r in links]}
        if question_type == "Manipulated":
            m = manipulation(rng, asked)
            question, answers, wrong = m.question.format(n=phrase), [m.derive(value)], derived(m, wrong)
            meta["manipulation"] = m.question
        else:
            question, answers = asked.ask(phrase), [value]
        return Draft([sentences], question, answers, answer_type, question_type, wrong, meta=meta)
