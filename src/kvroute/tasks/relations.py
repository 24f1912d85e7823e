"""The catalogue of person attributes (relations) the families state and ask about.

Each answer type has three relations, so a passage can hold several values of the same type (the
distractors a wrong binding would produce). A relation knows how to state itself, how to ask for
its value (Standard), how to describe its holder ("the person who ..." for Part questions), and
which simple transformations of its value can be asked (Manipulated).

Templates use ``{s}`` (subject: a name or a pronoun), ``{sp}`` (the subject's possessive), ``{n}``
(the name in questions), ``{v}`` (the value) and ``{a}`` (the article of the value).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from kvroute.tasks.lexicon import article


@dataclass(frozen=True)
class Manipulation:
    """A Manipulated question: ``question`` (with ``{n}``) and the answer derived from the value."""

    question: str
    derive: Callable[[str], str]


@dataclass(frozen=True)
class Relation:
    name: str
    answer_type: str
    statements: tuple[str, ...]  # variants; the first is the plainest
    question: str
    describe: str  # "the person who ..." clause, with {v}
    manipulations: tuple[Manipulation, ...] = ()
    np: str = ""  # Person relations: the noun phrase for the value, e.g. "the person who trained {n}"

    def state(self, subject: str, possessive: str, value: str, variant: int = 0) -> tuple[str, dict[str, str]]:
        """The template and its slots for stating this relation."""
        t = self.statements[variant % len(self.statements)]
        return t, {"s": subject, "sp": possessive, "v": value, "a": article(value)}

    def ask(self, name: str) -> str:
        return self.question.format(n=name)

    def who(self, value: str) -> str:
        """The noun phrase that identifies the holder of ``value``: 'the person who was born in X'."""
        return "the person who " + self.describe.format(v=value, a=article(value))


def _year(v: str) -> str:
    return v.split()[-1]


def _month(v: str) -> str:
    return v.split()[1]


def _first(v: str) -> str:
    return v.split()[0]


def _last(v: str) -> str:
    return v.split()[-1]


def _plus_one(v: str) -> str:
    return str(int(v) + 1)


def _material(v: str) -> str:
    return v.split()[0]


def _date_manips(what: str) -> tuple[Manipulation, ...]:
    return (Manipulation(f"In which year {what}?", _year), Manipulation(f"In which month {what}?", _month))


def _person_manips(who: str) -> tuple[Manipulation, ...]:
    return (Manipulation(f"What is the first name of {who}?", _first),
            Manipulation(f"What is the family name of {who}?", _last))


def _thing_manips(what: str) -> tuple[Manipulation, ...]:
    return (Manipulation(f"What material is {what} made of?", _material),)


RELATIONS: tuple[Relation, ...] = (
    # Location
    Relation("born_in", "Location", ("{s} was born in {v}.", "{s} was born in the town of {v}."),
             "In which town was {n} born?", "was born in {v}"),
    Relation("lives_in", "Location", ("{s} lives in {v}.", "These days {s} lives in {v}."),
             "In which town does {n} live?", "lives in {v}"),
    Relation("studied_in", "Location", ("{s} studied in {v}.", "As a student, {s} spent four years in {v}."),
             "In which town did {n} study?", "studied in {v}"),
    # Organization
    Relation("works_for", "Organization", ("{s} works for the {v}.", "{s} is employed by the {v}."),
             "Which organization does {n} work for?", "works for the {v}"),
    Relation("member_of", "Organization", ("{s} is a member of the {v}.", "{s} joined the {v} as a member."),
             "Which society is {n} a member of?", "is a member of the {v}"),
    Relation("founded", "Organization", ("{s} founded the {v}.", "{s} was the founder of the {v}."),
             "Which organization did {n} found?", "founded the {v}"),
    # Creature
    Relation("pet", "Creature", ("{s} keeps {a} {v} as a pet.", "{s} has a pet {v}."),
             "What creature does {n} keep as a pet?", "keeps {a} {v} as a pet"),
    Relation("rescued", "Creature", ("{s} once rescued {a} {v}.", "{s} nursed a wounded {v} back to health."),
             "What creature did {n} rescue?", "rescued {a} {v}"),
    Relation("studies", "Creature", ("{s} studies the {v}.", "{s} spends every summer studying the {v}."),
             "Which creature does {n} study?", "studies the {v}"),
    # Thing
    Relation("carries", "Thing", ("{s} always carries {a} {v}.", "{s} never goes out without {a} {v}."),
             "What does {n} always carry?", "always carries {a} {v}",
             _thing_manips("the object that {n} always carries")),
    Relation("lost", "Thing", ("{s} once lost {a} {v}.", "{s} lost {a} {v} on a journey."),
             "What did {n} once lose?", "once lost {a} {v}", _thing_manips("the object that {n} lost")),
    Relation("made", "Thing", ("{s} made {a} {v}.", "{s} built {a} {v} by hand."),
             "What did {n} make?", "made {a} {v}",
             (Manipulation("What material was used for the object that {n} made?", _material),)),
    # Person
    Relation("mentor", "Person", ("{s} was trained by {v}.", "{sp} teacher was {v}."),
             "Who trained {n}?", "was trained by {v}", _person_manips("the person who trained {n}"),
             "{n}'s teacher"),
    Relation("friend", "Person", ("{sp} closest friend is {v}.", "{s} is close friends with {v}."),
             "Who is the closest friend of {n}?", "is close friends with {v}",
             _person_manips("{n}'s closest friend"), "{n}'s closest friend"),
    Relation("rival", "Person", ("{sp} old rival is {v}.", "{s} has a long rivalry with {v}."),
             "Who is the old rival of {n}?", "has a rivalry with {v}", _person_manips("{n}'s old rival"),
             "{n}'s old rival"),
    # Numeral
    Relation("goats", "Numeral", ("{s} owns {v} goats.", "{s} keeps a herd of {v} goats."),
             "How many goats does {n} own?", "owns {v} goats",
             (Manipulation("If {n} bought one more goat, how many goats would {n} own?", _plus_one),)),
    Relation("books", "Numeral", ("{s} has written {v} books.", "{s} is the author of {v} books."),
             "How many books has {n} written?", "has written {v} books",
             (Manipulation("If {n} wrote one more book, how many books would {n} have written?", _plus_one),)),
    Relation("trees", "Numeral", ("{s} planted {v} trees.", "Over the years {s} planted {v} trees."),
             "How many trees did {n} plant?", "planted {v} trees",
             (Manipulation("If {n} planted one more tree, how many trees would {n} have planted?", _plus_one),)),
    # Date/Time
    Relation("born_on", "Date/Time", ("{s} was born on {v}.", "{sp} date of birth is {v}."),
             "On what date was {n} born?", "was born on {v}", _date_manips("was {n} born")),
    Relation("moved_on", "Date/Time", ("{s} moved house on {v}.", "On {v}, {s} moved to a new house."),
             "On what date did {n} move house?", "moved house on {v}", _date_manips("did {n} move house")),
    Relation("married_on", "Date/Time", ("{s} got married on {v}.", "{s} married on {v}."),
             "On what date did {n} get married?", "got married on {v}", _date_manips("did {n} get married")),
    # Event
    Relation("won", "Event", ("{s} won the {v}.", "{s} took first prize at the {v}."),
             "Which event did {n} win?", "won the {v}"),
    Relation("organized", "Event", ("{s} organized the {v}.", "{s} was in charge of organizing the {v}."),
             "Which event did {n} organize?", "organized the {v}"),
    Relation("attended", "Event", ("{s} attended the {v}.", "{s} travelled to see the {v}."),
             "Which event did {n} attend?", "attended the {v}"),
)
BY_NAME: dict[str, Relation] = {r.name: r for r in RELATIONS}
BY_TYPE: dict[str, tuple[Relation, ...]] = {}
for _r in RELATIONS:
    BY_TYPE[_r.answer_type] = (*BY_TYPE.get(_r.answer_type, ()), _r)
MANIPULABLE_TYPES: tuple[str, ...] = tuple(t for t, rs in BY_TYPE.items() if all(r.manipulations for r in rs))
