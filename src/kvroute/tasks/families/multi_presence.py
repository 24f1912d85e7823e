"""``multi_presence``: the same entity appears several times, in different roles.

A chain of links (``A → B → C → D``) is stated one link per sentence, so every inner entity is
mentioned twice: once as the receiver, once as the giver. Questions must pick the right mention:

    Maren Oskvold paid Tobin Hale 40 coins. Tobin Hale paid Liss Varnell 17 coins.
    forward  Q: Whom did Tobin Hale pay?          A: Liss Varnell   (distractor: Maren Oskvold)
    reverse  Q: Who paid Tobin Hale?              A: Maren Oskvold  (distractor: Liss Varnell)
    link     Q: How many coins did Tobin Hale pay Liss Varnell?   A: 17   (distractor: 40)

Chains of people, towns (voyages, roads), organisations and creatures cover the entity answer
types; the link's own value covers Date/Time, Numeral, Thing and Event. At level 1 neighbouring
links are of different kinds (a payment, then a letter), so the verb tells the two mentions
apart; from level 2 all links are of one kind and only the direction does.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from kvroute.tasks.family import FAMILIES, Family, TaskSpec
from kvroute.tasks.lexicon import Draw, article
from kvroute.tasks.relations import Manipulation, _first, _material, _month, _plus_one, _year
from kvroute.tasks.text import Draft, Sentence, render

VERSION = 2


@dataclass(frozen=True)
class ChainKind:
    entity: str  # answer type of the chain's entities
    value: str | None  # answer type of each link's own value
    statement: str  # {a} -> {b}, with value {x} (article {ax})
    forward: str  # asks for b given a
    reverse: str  # asks for a given b
    link: str | None  # asks for the link's value given a and b
    two_step: str  # asks for the entity two links after a
    manipulations: tuple[Manipulation, ...] = ()  # of the link's value (or of the entity for Person)


_KINDS: tuple[ChainKind, ...] = (
    ChainKind("Person", "Date/Time", "{a} sent a letter to {b} on {x}.", "To whom did {a} send a letter?",
              "Who sent a letter to {b}?", "On what date did {a} send a letter to {b}?",
              "To whom did the person who got a letter from {a} send a letter?",
              (Manipulation("In which year did {a} send a letter to {b}?", _year),
               Manipulation("In which month did {a} send a letter to {b}?", _month))),
    ChainKind("Person", "Numeral", "{a} paid {b} {x} coins.", "Whom did {a} pay?", "Who paid {b}?",
              "How many coins did {a} pay {b}?", "Whom did the person who was paid by {a} pay?",
              (Manipulation("If {a} had paid {b} one coin more, how many coins would that have been?", _plus_one),)),
    ChainKind("Person", "Thing", "{a} gave {b} {ax} {x}.", "To whom did {a} give a present?",
              "Who gave a present to {b}?", "What did {a} give {b}?",
              "To whom did the person who got a present from {a} give a present?",
              (Manipulation("What material is the present that {a} gave {b} made of?", _material),)),
    ChainKind("Location", "Thing", "A ship carried {ax} {x} from {a} to {b}.",
              "Where did the ship sail to from {a}?", "From which town did the ship sail to {b}?",
              "What did the ship carry from {a} to {b}?",
              "Where did the ship sail to from the town it reached from {a}?",
              (Manipulation("What material is the cargo the ship carried from {a} to {b} made of?", _material),)),
    ChainKind("Organization", "Event", "The {a} challenged the {b} at the {x}.",
              "Which organization did the {a} challenge?", "Which organization challenged the {b}?",
              "At which event did the {a} challenge the {b}?",
              "Which organization did the organization challenged by the {a} challenge?"),
    ChainKind("Creature", None, "The {a} hunts the {b}.", "What does the {a} hunt?", "What hunts the {b}?", None,
              "What does the creature hunted by the {a} hunt?"),
    # second kinds per entity type: level 1 mixes kinds, so the verb tells the two mentions apart
    ChainKind("Location", "Numeral", "A road of {x} miles runs from {a} to {b}.",
              "Where does the road from {a} lead?", "From which town does a road lead to {b}?",
              "How many miles long is the road from {a} to {b}?",
              "Where does the road from the town that the road from {a} reaches lead?",
              (Manipulation("If the road from {a} to {b} were one mile longer, how many miles long would it be?",
                            _plus_one),)),
    ChainKind("Organization", "Date/Time", "The {a} bought the {b} on {x}.", "Which organization did the {a} buy?",
              "Which organization bought the {b}?", "On what date did the {a} buy the {b}?",
              "Which organization did the organization bought by the {a} buy?",
              (Manipulation("In which year did the {a} buy the {b}?", _year),)),
    ChainKind("Creature", None, "The {a} is afraid of the {b}.", "What is the {a} afraid of?",
              "What is afraid of the {b}?", None, "What is the creature feared by the {a} afraid of?"),
)
_PERSON_MANIPS = (Manipulation("What is the first name of the person {a} paid?", _first),)


@FAMILIES.add
class MultiPresence(Family):
    name = "multi_presence"
    VERSION = VERSION
    summary = "One entity mentioned several times in different roles (chains of links); forward and reverse questions."
    levels = {
        1: "2 links of different kinds (the verb tells the mentions apart), reading order; Standard questions",
        2: "4 links of one kind in shuffled order (only the direction tells them apart); + Manipulated",
        3: "6 links of one kind, shuffled; + Part (two links along the chain)",
    }
    max_distractors = 8  # extra links beyond the minimum two

    def level_distractors(self, difficulty: int) -> int:
        return {1: 0, 2: 2, 3: 4}[difficulty]

    def valid_combo(self, answer_type: str, question_type: str) -> bool:
        if question_type == "Manipulated":
            return any(k.value == answer_type and k.manipulations for k in _KINDS) or answer_type == "Person"
        if question_type == "Part":
            return any(k.entity == answer_type for k in _KINDS)
        return True

    def draft(self, rng: random.Random, spec: TaskSpec, *, answer_type: str, question_type: str,
              unanswerable: bool, distractors: int) -> Draft:
        draw = Draw(rng)
        n_links = 2 + distractors
        manip_person = question_type == "Manipulated" and answer_type == "Person"
        if manip_person:
            kinds = [k for k in _KINDS if k.value == "Numeral" and k.entity == "Person"]
        elif question_type == "Standard":
            kinds = [k for k in _KINDS if k.entity == answer_type or k.value == answer_type]
        elif question_type == "Manipulated":
            kinds = [k for k in _KINDS if k.value == answer_type and k.manipulations]
        else:
            kinds = [k for k in _KINDS if k.entity == answer_type]
        kind = rng.choice(kinds)
        nodes = draw.values(kind.entity, n_links + 1)
        # the link the question is about (for Part: the first of two); its kind is the chosen one
        if question_type == "Part":
            i = rng.randrange(n_links - 1)
        else:
            i = rng.randrange(1, n_links)  # a link whose giver is also a receiver: two presences
        direction = None
        if question_type != "Part":
            if kind.value == answer_type and not manip_person:
                direction = "link"
            else:
                direction = "forward" if (manip_person or rng.random() < 0.5) else "reverse"
        asked_link = i - 1 if direction == "reverse" else i
        kinds_of = [kind] * n_links
        if spec.difficulty == 1:  # neighbouring links of another kind over the same entity type
            other = [k for k in _KINDS if k.entity == kind.entity and k is not kind]
            kinds_of = [kind if j == asked_link or (question_type == "Part" and j == i + 1) else rng.choice(other)
                        for j in range(n_links)]
        values = [draw.value(k.value) if k.value else "" for k in kinds_of]
        links = [(nodes[j], nodes[j + 1], values[j]) for j in range(n_links)]
        sentences = [render(kinds_of[j].statement, {"a": a, "b": b, "x": x, "ax": article(x) if x else ""})
                     for j, (a, b, x) in enumerate(links)]
        order = list(range(n_links))
        if spec.difficulty >= 2:
            rng.shuffle(order)
        same = [values[j] for j in range(n_links) if kinds_of[j].value == kind.value and j != asked_link]

        meta: dict[str, object] = {"chain": kind.statement, "links": n_links}
        if question_type == "Part":
            ev, answers = {i, i + 1}, [nodes[i + 2]]
            question = kind.two_step.format(a=nodes[i])
            wrong = [nodes[i + 1]] + ([nodes[i + 3]] if i + 3 <= n_links else [])
        else:
            a, b, x = links[i]
            if direction == "link":
                ev = {i}
                if question_type == "Manipulated":
                    m = rng.choice(kind.manipulations)
                    question, answers = m.question.format(a=a, b=b), [m.derive(x)]
                    wrong = [m.derive(v) for v in same] + same
                else:
                    question, answers = kind.link.format(a=a, b=b), [x]  # type: ignore[union-attr]
                    wrong = same
            elif direction == "forward":
                ev = {i}
                question, answers, wrong = kind.forward.format(a=a), [b], [nodes[i - 1]]
                if manip_person:
                    m = _PERSON_MANIPS[0]
                    question, answers = m.question.format(a=a), [m.derive(b)]
                    wrong = [m.derive(nodes[i - 1]), nodes[i - 1]]
            else:
                ev = {i - 1}
                question, answers = kind.reverse.format(b=a), [nodes[i - 1]]
                wrong = [b]
            meta["direction"] = direction
        sentences = [Sentence(s.text, evidence=j in ev) for j, s in enumerate(sentences)]
        return Draft([[sentences[j] for j in order]], question, answers, answer_type, question_type, wrong,
                     meta=meta)
