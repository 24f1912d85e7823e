"""``coreference``: facts told with pronouns; some questions cannot be answered from the text.

    Maren Oskvold met Tobin Hale at the harbour. He joined the Brasswind Guild. She sailed to ...
    Q: Which organization did Tobin Hale join?   A: Brasswind Guild

Unanswerable items (gold "I don't know", ``meta.reason``):

* ``ambiguous`` — both people have the same gender, so "She was born in Velkirra" can be either;
* ``absent`` — the asked fact is stated only for the other person (who is the distractor).

Every item carries ``meta.abstain = true``, so the prompt tells the model it may say "I don't know".
"""

from __future__ import annotations

import random

from kvroute.tasks.family import FAMILIES, Family, TaskSpec
from kvroute.tasks.lexicon import Draw
from kvroute.tasks.people import choose_relations, derived, manipulation, state
from kvroute.tasks.relations import MANIPULABLE_TYPES, Relation
from kvroute.tasks.text import Draft, Sentence, render

VERSION = 2
_FACTS = {1: 2, 2: 3, 3: 4}
_PLACES = ("the harbour", "the market", "the library", "a wedding", "the railway station", "a village dance")
_INTERACTIONS = ("{p} waved to {o}.", "{p} asked {o} for directions.", "{p} laughed at one of {op} jokes.",
                 "{p} lent {o} an umbrella.", "{p} wrote {o} a short note.", "{p} admired {op} old coat.")


@FAMILIES.add
class Coreference(Family):
    name = "coreference"
    VERSION = VERSION
    summary = ("Pronoun chains about two people; unanswerable items (ambiguous or absent referent) "
               "expect \"I don't know\".")
    levels = {
        1: "2 people of different genders, 2 facts each, grouped by person; Standard questions",
        2: "3 facts each, interleaved, same-type facts for both people; + Manipulated",
        3: "4 facts each, interleaved with object-pronoun sentences; + Part",
    }
    max_distractors = 2  # same-type facts of the other person
    has_unanswerable = True
    default_unanswerable_share = 0.25

    def valid_combo(self, answer_type: str, question_type: str) -> bool:
        return question_type != "Manipulated" or answer_type in MANIPULABLE_TYPES

    def draft(self, rng: random.Random, spec: TaskSpec, *, answer_type: str, question_type: str,
              unanswerable: bool, distractors: int) -> Draft:
        draw = Draw(rng)
        level = spec.difficulty
        reason = rng.choice(("ambiguous", "absent")) if unanswerable else None
        same_gender = reason == "ambiguous" or (reason is None and level >= 2 and rng.random() < 0.3)
        g = rng.choice(("f", "m"))
        a, b = draw.person(g), draw.person(g if same_gender else ("m" if g == "f" else "f"))
        n = _FACTS[level]
        asked, same, others = choose_relations(rng, answer_type, same_type=max(distractors, reason == "absent"),
                                               others=2 * n)
        if reason == "absent":  # the other person holds the asked relation; nobody says it for A
            same = [asked, *same[: max(distractors - 1, 0)]]
        key = others[0] if question_type == "Part" else None
        facts_a: list[Relation] = ([] if reason == "absent" else [asked]) + others[: n - 1]
        facts_b: list[Relation] = (same + others[n - 1:])[:n]
        values = {(p, r.name): draw.value(r.answer_type) for p, rs in (("a", facts_a), ("b", facts_b)) for r in rs}

        # every fact as (person, relation); an answerable asked fact is named when genders cannot resolve it
        items_a, items_b = [("a", r) for r in facts_a], [("b", r) for r in facts_b]
        rng.shuffle(items_a)
        rng.shuffle(items_b)
        if level == 1:  # grouped by person, either person first
            items = items_a + items_b if rng.random() < 0.5 else items_b + items_a
        else:
            items = items_a + items_b
            rng.shuffle(items)
        intro = (f"{a.name} and {b.name} met at {rng.choice(_PLACES)}." if reason == "ambiguous"
                 else f"{a.name} met {b.name} at {rng.choice(_PLACES)}.")
        evidence = {("a", asked.name)} if reason is None else set()
        if key is not None and reason is None:
            evidence.add(("a", key.name))
        if reason == "ambiguous":
            evidence = {("a", asked.name)}
        sentences = [Sentence(intro, evidence=bool(evidence))]
        for who, r in items:
            person = a if who == "a" else b
            named = same_gender and reason is None and (who, r.name) in evidence
            sentences.append(state(r, person, values[(who, r.name)], pronoun=not named,
                                   variant=rng.randrange(2) if level >= 2 else 0, evidence=(who, r.name) in evidence))
            if level >= 3 and rng.random() < 0.4:
                p, o = (a, b) if rng.random() < 0.5 else (b, a)
                sentences.append(render(rng.choice(_INTERACTIONS), {"p": p.subj, "o": o.obj, "op": o.poss}))

        meta: dict[str, object] = {"relation": asked.name, "abstain": True, "same_gender": same_gender}
        if reason:
            meta["reason"] = reason
        held = values.get(("a", asked.name), values.get(("b", asked.name), ""))
        wrong = [values[("b", r.name)] for r in facts_b if r.answer_type == answer_type]
        if reason == "ambiguous":
            wrong = [held, *wrong]
        if question_type == "Manipulated":
            m = manipulation(rng, asked)
            question, answers, wrong = m.question.format(n=a.name), [m.derive(held)], derived(m, wrong)
            meta["manipulation"] = m.question
        elif key is not None:
            question, answers = asked.ask(key.who(values[("a", key.name)])), [held]
            meta["identified_by"] = key.name
        else:
            question, answers = asked.ask(a.name), [held]
        return Draft([sentences], question, answers, answer_type, question_type, wrong,
                     unanswerable=unanswerable, meta=meta)
