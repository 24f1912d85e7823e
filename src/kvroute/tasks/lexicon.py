"""The shared fictional vocabulary of every task family.

Names, towns, organisations, creatures, things and events are invented (or invented
combinations), so no model can answer a question from world knowledge. Pools are plain tuples in
a fixed order; every draw goes through an explicit ``random.Random``. The filler grammar builds
neutral sentences with no names, numbers or dates, so filler never contains an answer-like value.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

FEMALE_NAMES: tuple[str, ...] = (
    "Maren", "Liss", "Brisa", "Odile", "Senna", "Ysolde", "Tamsin", "Idra", "Wenna", "Calla", "Ferra", "Nessa",
    "Orla", "Sabeth", "Elowen", "Runa", "Vesna", "Merrit", "Ilse", "Juna", "Keira", "Lorna", "Mirela", "Neve",
    "Oona", "Perrin", "Quilla", "Rosalind", "Saffi", "Thea", "Ulla", "Vanya", "Willa", "Yara", "Zelda", "Agnet",
)
MALE_NAMES: tuple[str, ...] = (
    "Tobin", "Oswin", "Ansel", "Corvin", "Dorran", "Emrick", "Fennick", "Galen", "Harlan", "Ivo", "Jorund",
    "Kasimir", "Lorcan", "Matthis", "Niall", "Orrin", "Piet", "Quent", "Rurik", "Soren", "Tarquin", "Ulric",
    "Varo", "Wendel", "Yorick", "Zander", "Aldric", "Bram", "Cassian", "Desmond", "Evander", "Florian",
)
SURNAMES: tuple[str, ...] = (
    "Oskvold", "Hale", "Varnell", "Quillan", "Brackwater", "Dunmore", "Ashcombe", "Fenwright", "Gallowmere",
    "Harrowgate", "Ingleby", "Jessop", "Kettleby", "Larkspur", "Morrowind", "Netherby", "Orlov", "Pennock",
    "Quarrel", "Rookwood", "Saltmarsh", "Thistlewood", "Umbright", "Vantreck", "Whitlock", "Yarrow",
    "Zellweger", "Amberly", "Blackthorn", "Copperfield", "Dovecote", "Elderwick", "Foxley", "Greymane",
    "Holloway", "Ironside", "Juniper", "Kestrel", "Lindqvist", "Marchetti", "Northcott", "Ostrander",
)
TOWNS: tuple[str, ...] = (
    "Velkirra", "Dunmarrow", "Quarrystead", "Ferravik", "Ostrelle", "Brenmoor", "Calderwick", "Thornmere",
    "Marrowdale", "Kestrin", "Ulvanne", "Yarrowby", "Pellmarsh", "Sorvik", "Halvenport", "Gildersee",
    "Irongate", "Lowenmark", "Mirefield", "Nettlecombe", "Oakhollow", "Pinecrest", "Ravensholt", "Saltreach",
    "Tamberlin", "Umberfall", "Vossberg", "Wyndhaven", "Zarenburg", "Amberlake", "Blackmire", "Cindervale",
    "Dawnmere", "Emberton", "Frosthold", "Greywater", "Hollowmere", "Isenwold", "Jorvala", "Kelmarsh",
)
ORG_HEADS: tuple[str, ...] = ("Bell", "Iron", "Silver", "Amber", "Copper", "Ember", "Frost", "Willow", "Harbor",
                              "Lantern", "Raven", "Thistle", "Cobalt", "Marble")
ORG_TAILS: tuple[str, ...] = ("wind", "leaf", "gate", "hollow", "stone", "field", "crest", "brook", "spire", "wick")
ORG_KINDS: tuple[str, ...] = ("Guild", "Company", "Society", "Trust", "Institute", "Collective", "League",
                              "Foundation")
CREATURE_HEADS: tuple[str, ...] = ("moon", "ember", "frost", "marsh", "glass", "thorn", "cinder", "mist", "dusk",
                                   "salt", "storm", "velvet")
CREATURE_TAILS: tuple[str, ...] = ("otter", "beetle", "drake", "newt", "heron", "lynx", "moth", "tortoise",
                                   "serpent", "hare", "owl", "toad")
MATERIALS: tuple[str, ...] = ("brass", "silver", "copper", "oak", "glass", "iron", "clay", "pewter", "bronze",
                              "walnut", "ivory", "tin")
OBJECTS: tuple[str, ...] = ("compass", "lantern", "violin", "telescope", "kettle", "hourglass", "flute", "chisel",
                            "mirror", "music box", "spyglass", "sundial", "thimble", "inkwell")
EVENT_HEADS: tuple[str, ...] = ("Lantern", "Frost", "Harvest", "Ember", "Salt", "Willow", "Copper", "Thistle",
                                "Moonrise", "Driftwood", "Starfall", "Hearth")
EVENT_TAILS: tuple[str, ...] = ("Regatta", "Fair", "Moot", "Games", "Festival", "Parade", "Tournament", "Carnival",
                                "Race", "Pageant")
MONTHS: tuple[str, ...] = ("January", "February", "March", "April", "May", "June", "July", "August", "September",
                           "October", "November", "December")

# the filler grammar: "<subject> <predicate> <coda>." — no names, numbers, dates or answer-like values
FILLER_SUBJECTS: tuple[str, ...] = (
    "The old mill", "The northern road", "The market square", "The river", "The orchard", "The harbour wall",
    "The village green", "The stone bridge", "The bell tower", "The eastern meadow", "The narrow lane",
    "The covered well", "The long barn", "The hill path", "The little chapel", "The boat shed",
    "The old granary", "The toll house", "The town library", "The quiet inn", "The rope walk", "The tannery",
)
FILLER_PREDICATES: tuple[str, ...] = (
    "was quiet", "was repaired again", "grew busy", "filled with fog", "looked grey", "smelled of rain",
    "stood empty", "echoed with voices", "was swept clean", "drew a few visitors", "was closed for a while",
    "seemed smaller than before", "caught the light", "was covered in leaves", "stayed cold", "was talked about",
    "felt peaceful", "lay under a thin layer of frost", "was busy with workers", "looked much as it always had",
)
FILLER_CODAS: tuple[str, ...] = (
    "after the long winter", "before the first snow", "during the rainy season", "for most of the year",
    "as the evening came", "when the tide turned", "on market days", "in the early morning", "through the summer",
    "while the carts went by", "once the harvest was in", "under a pale sky", "as people remembered it",
    "without anyone noticing", "in the weeks that followed", "until the spring returned",
)

PRONOUNS = {"f": ("she", "her", "her"), "m": ("he", "him", "his"), "n": ("it", "it", "its")}
"""gender -> (subject, object, possessive)."""


@dataclass(frozen=True)
class Person:
    first: str
    last: str
    gender: str  # "f" | "m"

    @property
    def name(self) -> str:
        return f"{self.first} {self.last}"

    @property
    def subj(self) -> str:
        return PRONOUNS[self.gender][0]

    @property
    def obj(self) -> str:
        return PRONOUNS[self.gender][1]

    @property
    def poss(self) -> str:
        return PRONOUNS[self.gender][2]


def article(phrase: str) -> str:
    """'a' or 'an' for ``phrase``."""
    return "an" if phrase[:1].lower() in "aeiou" else "a"


def cap(text: str) -> str:
    return text[:1].upper() + text[1:]


def _org(rng: random.Random) -> str:
    return f"{rng.choice(ORG_HEADS)}{rng.choice(ORG_TAILS)} {rng.choice(ORG_KINDS)}"


def _creature(rng: random.Random) -> str:
    return f"{rng.choice(CREATURE_HEADS)} {rng.choice(CREATURE_TAILS)}"


def _thing(rng: random.Random) -> str:
    return f"{rng.choice(MATERIALS)} {rng.choice(OBJECTS)}"


def _event(rng: random.Random) -> str:
    return f"{rng.choice(EVENT_HEADS)} {rng.choice(EVENT_TAILS)}"


def _date(rng: random.Random) -> str:
    return f"{rng.randint(1, 28)} {rng.choice(MONTHS)} {rng.randint(1901, 2019)}"


def _numeral(rng: random.Random) -> str:
    return str(rng.randint(3, 98))


def _town(rng: random.Random) -> str:
    return rng.choice(TOWNS)


SAMPLERS: dict[str, Callable[[random.Random], str]] = {
    "Location": _town, "Organization": _org, "Creature": _creature, "Thing": _thing, "Event": _event,
    "Date/Time": _date, "Numeral": _numeral,
}
"""answer type -> value sampler (Person values are drawn as :class:`Person` by :class:`Draw`)."""


class Draw:
    """Distinct draws within one instance: no value, first name or surname is used twice."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.used: set[str] = set()

    def value(self, answer_type: str) -> str:
        if answer_type == "Person":
            return self.person().name
        sampler = SAMPLERS[answer_type]
        for _ in range(1000):
            v = sampler(self.rng)
            # no value may contain another (e.g. "12 May 1950" vs numeral "12") — check words both ways
            if v not in self.used and not any(_overlaps(v, u) for u in self.used):
                self.used.add(v)
                return v
        raise RuntimeError(f"lexicon exhausted for {answer_type}")  # pragma: no cover - pools are large

    def values(self, answer_type: str, k: int) -> list[str]:
        return [self.value(answer_type) for _ in range(k)]

    def person(self, gender: str | None = None) -> Person:
        for _ in range(1000):
            g = gender or self.rng.choice(("f", "m"))
            first = self.rng.choice(FEMALE_NAMES if g == "f" else MALE_NAMES)
            last = self.rng.choice(SURNAMES)
            if first not in self.used and last not in self.used:
                self.used.update((first, last))
                return Person(first, last, g)
        raise RuntimeError("lexicon exhausted for persons")  # pragma: no cover

    def people(self, k: int, genders: list[str] | None = None) -> list[Person]:
        return [self.person(genders[i] if genders else None) for i in range(k)]


def _overlaps(a: str, b: str) -> bool:
    """Whether one value occurs as a whole-word part of the other (both directions)."""
    wa, wb = f" {a} ", f" {b} "
    return wa in wb or wb in wa


def filler_sentence(rng: random.Random) -> str:
    return f"{rng.choice(FILLER_SUBJECTS)} {rng.choice(FILLER_PREDICATES)} {rng.choice(FILLER_CODAS)}."
