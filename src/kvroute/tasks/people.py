"""Helpers the person-centred families share: choosing relations, stating them, asking about them."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from kvroute.tasks.lexicon import Draw, Person
from kvroute.tasks.relations import BY_TYPE, RELATIONS, Manipulation, Relation
from kvroute.tasks.text import Sentence, render


@dataclass
class Profile:
    """A person and their attribute values, in the order they are stated."""

    person: Person
    facts: dict[str, str] = field(default_factory=dict)  # relation name -> value

    def value(self, rel: Relation) -> str:
        return self.facts[rel.name]


def state(rel: Relation, person: Person, value: str, *, pronoun: bool = False, variant: int = 0,
          evidence: bool = False, para: bool = False, name: str | None = None) -> Sentence:
    """One sentence stating ``person``'s ``rel`` is ``value`` (by ``name`` — default the full name — or
    by pronoun)."""
    name = name or person.name
    subj = person.subj if pronoun else name
    poss = person.poss if pronoun else f"{name}'s"
    template, slots = rel.state(subj, poss, value, variant)
    return render(template, slots, evidence=evidence, para=para)


def choose_relations(rng: random.Random, answer_type: str, *, same_type: int, others: int,
                     exclude: tuple[str, ...] = ()) -> tuple[Relation, list[Relation], list[Relation]]:
    """The asked relation of ``answer_type``, up to ``same_type`` other relations of that type
    (distractors), and ``others`` relations of other types (background attributes)."""
    pool = [r for r in BY_TYPE[answer_type] if r.name not in exclude]
    rng.shuffle(pool)
    asked, same = pool[0], pool[1:1 + same_type]
    rest = [r for r in RELATIONS if r.answer_type != answer_type and r.name not in exclude]
    rng.shuffle(rest)
    # at most one background relation per answer type keeps values of a type few and distinct
    chosen: list[Relation] = []
    seen: set[str] = set()
    for r in rest:
        if r.answer_type not in seen and len(chosen) < others:
            chosen.append(r)
            seen.add(r.answer_type)
    return asked, same, chosen


def fill(draw: Draw, person: Person, relations: list[Relation]) -> Profile:
    """A profile of ``person`` with a fresh distinct value for every relation."""
    return Profile(person, {r.name: draw.value(r.answer_type) for r in relations})


def manipulation(rng: random.Random, rel: Relation) -> Manipulation:
    return rng.choice(rel.manipulations)


def derived(m: Manipulation, values: list[str]) -> list[str]:
    """Each value's manipulated form, followed by the raw values (likely wrong answers)."""
    return [m.derive(v) for v in values] + list(values)
