"""The task-family contract: a validated spec of knobs, a base class, and the ``FAMILIES`` registry.

A family turns ``(spec, index)`` into one instance with its own ``random.Random`` seeded from
``(family, seed, index)``, so instance ``i`` does not depend on ``n`` (the first five of
``n=10`` equal ``n=5``) and no global random state is read or changed. Answer and question types
cycle through the family's valid combinations in a seeded order, so even small ``n`` covers them.
"""

from __future__ import annotations

import hashlib
import random
import re
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

from kvroute.bounds import MAX_SEED
from kvroute.errors import ConfigError
from kvroute.registry import Registry
from kvroute.tasks.instance import ANSWER_TYPES, IDK, QUESTION_TYPES, TaskInstance
from kvroute.tasks.text import Draft, TokenCounter, assemble, find_answer_spans

MAX_N = 10_000_000
MIN_TARGET_TOKENS = 16
#: the longest padded context: 2**20 tokens, beyond any model kvroute runs (a context is ~5 bytes per token)
MAX_TARGET_TOKENS = 2**20
#: the most filler one spec may ask for, n × target_tokens: 2**27 tokens, about 650 MB of task file
MAX_TOTAL_TOKENS = 2**27
#: the most questions one context of the multi-question form carries
MAX_QUESTIONS = 16
#: draws of a draft before a conversation gives up finding one that shares no name or answer with the others
_CONVERSATION_TRIES = 50


@dataclass(frozen=True)
class TaskSpec:
    """The knobs of one generation run; validated on construction (``ConfigError`` names the field).

    Attributes:
        family: registered family name (``kvroute tasks list``).
        n: number of instances.
        seed: generator seed; the same spec always gives byte-identical instances.
        difficulty: the family's level (1 = easiest; see ``Family.levels``).
        target_tokens: pad the context with neutral filler to about this many tokens (measured with
            the tokenizer passed to :meth:`Family.generate`, else estimated from words); ``None``
            keeps the natural length (``long_context`` then uses its level's default).
        depth: where the facts sit inside the filler, 0 = start, 1 = end; ``None`` draws it
            uniformly per instance. Needs filler (``target_tokens`` or ``long_context``).
        distractors: number of distractor entities/values; ``None`` = the level's default.
        unanswerable_share: share of unanswerable items (families that have them); ``None`` = default.
        answer_types / question_types: restrict to these tags (``None`` = all the family allows).
        questions: questions asked over one context (the multi-question form, for "compress once, ask
            many"): each of the ``n`` contexts joins this many drafts about different entities, and
            ``n × questions`` instances come out, turn by turn, sharing the context; their
            ``meta`` holds ``conversation`` (the context's id), ``turn`` (1-based) and ``turns``.
    """

    family: str
    n: int = 10
    seed: int = 0
    difficulty: int = 1
    target_tokens: int | None = None
    depth: float | None = None
    distractors: int | None = None
    unanswerable_share: float | None = None
    answer_types: tuple[str, ...] | None = None
    question_types: tuple[str, ...] | None = None
    questions: int = 1

    def __post_init__(self) -> None:
        def need(ok: bool, fld: str, msg: str) -> None:
            if not ok:
                raise ConfigError(f"task spec {fld}={getattr(self, fld)!r}: {msg}")

        need(_is_int(self.n) and 1 <= self.n <= MAX_N, "n", f"must be an integer in 1..{MAX_N}")
        need(_is_int(self.seed) and 0 <= self.seed <= MAX_SEED, "seed", f"must be an integer from 0 to {MAX_SEED}")
        need(_is_int(self.difficulty), "difficulty", "must be an integer level")
        need(self.target_tokens is None or (_is_int(self.target_tokens)
                                            and MIN_TARGET_TOKENS <= self.target_tokens <= MAX_TARGET_TOKENS),
             "target_tokens", f"must be an integer from {MIN_TARGET_TOKENS} to {MAX_TARGET_TOKENS} or None")
        need(self.target_tokens is None or self.n * self.target_tokens <= MAX_TOTAL_TOKENS, "target_tokens",
             f"times n={self.n} asks for {self.n * (self.target_tokens or 0):,} tokens of context; at most "
             f"{MAX_TOTAL_TOKENS:,} per spec (fewer instances or shorter contexts)")
        need(self.depth is None or (isinstance(self.depth, int | float) and 0.0 <= self.depth <= 1.0),
             "depth", "must be a number in [0, 1] or None")
        need(self.distractors is None or (_is_int(self.distractors) and self.distractors >= 0),
             "distractors", "must be a non-negative integer or None")
        need(self.unanswerable_share is None or (isinstance(self.unanswerable_share, int | float)
                                                 and 0.0 <= self.unanswerable_share <= 1.0),
             "unanswerable_share", "must be a number in [0, 1] or None")
        need(_is_int(self.questions) and 1 <= self.questions <= MAX_QUESTIONS, "questions",
             f"must be an integer from 1 to {MAX_QUESTIONS}")
        for fld, allowed in (("answer_types", ANSWER_TYPES), ("question_types", QUESTION_TYPES)):
            val = getattr(self, fld)
            if val is not None:
                object.__setattr__(self, fld, tuple(val))
                bad = [v for v in val if v not in allowed]
                need(bool(val) and not bad, fld, f"allowed values are {', '.join(allowed)}")
        get_family(self.family).check(self)


def _is_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


class Family(ABC):
    """Base of every task family: subclasses set the class attributes and write :meth:`draft`."""

    name: ClassVar[str]
    VERSION: ClassVar[int]
    summary: ClassVar[str]
    levels: ClassVar[dict[int, str]]  # difficulty -> what changes
    answer_types: ClassVar[tuple[str, ...]] = ANSWER_TYPES
    question_types: ClassVar[tuple[str, ...]] = QUESTION_TYPES
    max_distractors: ClassVar[int] = 6
    has_unanswerable: ClassVar[bool] = False
    default_unanswerable_share: ClassVar[float] = 0.0
    always_filler: ClassVar[bool] = False  # long_context: always lays facts inside filler

    # --- per-level defaults (override) -------------------------------------------------------------
    def level_question_types(self, difficulty: int) -> tuple[str, ...]:
        """Question types used at ``difficulty`` unless the spec names its own."""
        return {1: ("Standard",), 2: ("Standard", "Manipulated")}.get(difficulty, self.question_types)

    def level_distractors(self, difficulty: int) -> int:
        return min(difficulty - 1, self.max_distractors)

    def level_target_tokens(self, difficulty: int) -> int | None:
        return None

    def valid_combo(self, answer_type: str, question_type: str) -> bool:
        """Whether this family can ask a ``question_type`` question with an ``answer_type`` answer."""
        return answer_type in self.answer_types and question_type in self.question_types

    # --- the generator ------------------------------------------------------------------------------
    @abstractmethod
    def draft(self, rng: random.Random, spec: TaskSpec, *, answer_type: str, question_type: str,
              unanswerable: bool, distractors: int) -> Draft:
        """One instance's story, question and answers (the layout is done by :meth:`instance`)."""

    def check(self, spec: TaskSpec) -> None:
        """Family-specific validation of ``spec`` (raises ``ConfigError``)."""
        if spec.difficulty not in self.levels:
            raise ConfigError(f"task spec difficulty={spec.difficulty}: family {self.name!r} has levels "
                              f"{', '.join(map(str, self.levels))}")
        if spec.distractors is not None and spec.distractors > self.max_distractors:
            raise ConfigError(f"task spec distractors={spec.distractors}: family {self.name!r} supports at most "
                              f"{self.max_distractors}")
        if spec.unanswerable_share and not self.has_unanswerable:
            raise ConfigError(f"task spec unanswerable_share={spec.unanswerable_share}: family {self.name!r} has no "
                              "unanswerable items (coreference has); use 0 or leave it unset")
        if spec.depth is not None and spec.target_tokens is None and not self.always_filler:
            raise ConfigError(f"task spec depth={spec.depth}: depth places the facts inside filler text, so it "
                              "needs target_tokens (or the long_context family)")
        if spec.questions > 1 and type(self).iter_instances is not Family.iter_instances:
            raise ConfigError(f"task spec questions={spec.questions}: family {self.name!r} lays out its own contexts "
                              "and has no multi-question form; use 1")
        if not self.combos(spec):
            raise ConfigError(f"family {self.name!r} has no questions with answer_types={spec.answer_types} and "
                              f"question_types={spec.question_types} (it covers answer types "
                              f"{', '.join(self.answer_types)}; question types {', '.join(self.question_types)})")

    def combos(self, spec: TaskSpec) -> list[tuple[str, str]]:
        """The (answer type, question type) pairs instances cycle through, in a fixed order."""
        qts = spec.question_types or self.level_question_types(spec.difficulty)
        ats = spec.answer_types or self.answer_types
        return [(a, q) for q in QUESTION_TYPES if q in qts for a in ANSWER_TYPES if a in ats
                and self.valid_combo(a, q)]

    def generate(self, spec: TaskSpec, tokenizer: Any | None = None) -> list[TaskInstance]:
        """``spec.n`` instances; ``tokenizer`` measures ``target_tokens`` (else a word estimate)."""
        return list(self.iter_instances(spec, tokenizer))

    def iter_instances(self, spec: TaskSpec, tokenizer: Any | None = None) -> Iterator[TaskInstance]:
        if spec.family != self.name:
            raise ConfigError(f"spec is for family {spec.family!r}, not {self.name!r}")
        combos = self.combos(spec)
        random.Random(f"kvroute/{self.name}/{spec.seed}/combos").shuffle(combos)
        count = TokenCounter(tokenizer)
        for i in range(spec.n):
            if spec.questions > 1:
                yield from self.conversation(spec, i, combos, count)
            else:
                yield self.instance(spec, i, combos[i % len(combos)], count)

    def instance(self, spec: TaskSpec, index: int, combo: tuple[str, str], count: TokenCounter) -> TaskInstance:
        rng = random.Random(f"kvroute/{self.name}/{spec.seed}/{spec.difficulty}/{index}")
        share = self.default_unanswerable_share if spec.unanswerable_share is None else spec.unanswerable_share
        unanswerable = self.has_unanswerable and rng.random() < share
        k = self.level_distractors(spec.difficulty) if spec.distractors is None else spec.distractors
        draft = self.draft(rng, spec, answer_type=combo[0], question_type=combo[1], unanswerable=unanswerable,
                           distractors=k)
        target = spec.target_tokens or self.level_target_tokens(spec.difficulty)
        depth = spec.depth if spec.depth is not None else round(rng.random(), 4)
        lay = assemble(draft, rng=rng, target_tokens=target, depth=depth, count=count)
        answers = [IDK] if draft.unanswerable else _dedupe(draft.answers)
        spans = () if draft.unanswerable else find_answer_spans(lay.context, answers, lay.evidence_spans)
        distractors = [d for d in _dedupe(draft.distractors)
                       if _occurs(d, lay.context) and not _contains_any(d, answers)]
        meta: dict[str, Any] = {"difficulty": spec.difficulty, "index": index, "distractors": k, **draft.meta}
        if target is not None:
            meta.update(target_tokens=target, depth=lay.depth, filler_sentences=lay.n_filler,
                        context_tokens=count(lay.context), tokens_counted_with=count.name)
        return TaskInstance.create(
            family=self.name, version=self.VERSION, seed=spec.seed, context=lay.context, question=draft.question,
            answers=answers, unanswerable=draft.unanswerable, answer_spans=spans,
            evidence_spans=lay.evidence_spans, distractors=distractors, answer_type=draft.answer_type,
            question_type=draft.question_type, meta=meta)

    def conversation(self, spec: TaskSpec, index: int, combos: list[tuple[str, str]],
                     count: TokenCounter) -> list[TaskInstance]:
        """The multi-question form: ``spec.questions`` drafts about different entities laid out in one context
        (their blocks scattered through the filler), one instance per draft's question, in turn order.

        A draft is drawn again (up to ``_CONVERSATION_TRIES`` times) while one of its answers or the
        names its question asks about occur in another draft's sentences, so every question has one
        reading in the joined context."""
        if self.has_unanswerable and (spec.unanswerable_share or 0) > 0:
            raise ConfigError(f"task spec questions={spec.questions}: the multi-question form has no unanswerable "
                              "turns; set unanswerable_share=0")
        k = self.level_distractors(spec.difficulty) if spec.distractors is None else spec.distractors
        drafts: list[Draft] = []
        for j in range(spec.questions):
            combo = combos[(index * spec.questions + j) % len(combos)]
            for attempt in range(_CONVERSATION_TRIES):
                rng = random.Random(f"kvroute/{self.name}/{spec.seed}/{spec.difficulty}/{index}/q{j}/{attempt}")
                d = self.draft(rng, spec, answer_type=combo[0], question_type=combo[1], unanswerable=False,
                               distractors=k)
                if all(_separate(d, other) and _separate(other, d) for other in drafts):
                    drafts.append(d)
                    break
            else:
                raise ConfigError(f"family {self.name!r}: no draft for question {j + 1} of context {index} shares no "
                                  f"name or answer with the others after {_CONVERSATION_TRIES} draws; ask fewer "
                                  "questions per context")
        rng = random.Random(f"kvroute/{self.name}/{spec.seed}/{spec.difficulty}/{index}/layout")
        merged = Draft([b for d in drafts for b in d.blocks], drafts[0].question, drafts[0].answers,
                       drafts[0].answer_type, drafts[0].question_type, scatter=True)
        target = spec.target_tokens or self.level_target_tokens(spec.difficulty)
        depth = spec.depth if spec.depth is not None else round(rng.random(), 4)
        lay = assemble(merged, rng=rng, target_tokens=target, depth=depth, count=count)
        conversation = hashlib.sha256(lay.context.encode("utf-8", "surrogatepass")).hexdigest()[:16]
        out = []
        for j, d in enumerate(drafts):
            own = {s.text for b in d.blocks for s in b if s.evidence}
            evidence = tuple(sp for sp in lay.evidence_spans if lay.context[sp[0]:sp[1]] in own)
            answers = _dedupe(d.answers)
            distractors = [x for x in _dedupe(d.distractors)
                           if _occurs(x, lay.context) and not _contains_any(x, answers)]
            meta: dict[str, Any] = {"difficulty": spec.difficulty, "index": index, "distractors": k, **d.meta,
                                    "conversation": conversation, "turn": j + 1, "turns": spec.questions}
            if target is not None:
                meta.update(target_tokens=target, depth=lay.depth, filler_sentences=lay.n_filler,
                            context_tokens=count(lay.context), tokens_counted_with=count.name)
            out.append(TaskInstance.create(
                family=self.name, version=self.VERSION, seed=spec.seed, context=lay.context, question=d.question,
                answers=answers, unanswerable=False, answer_spans=find_answer_spans(lay.context, answers, evidence),
                evidence_spans=evidence, distractors=distractors, answer_type=d.answer_type,
                question_type=d.question_type, meta=meta))
        return out

    def describe(self) -> dict[str, Any]:
        """What ``kvroute tasks list`` shows."""
        return {"name": self.name, "version": self.VERSION, "summary": self.summary, "levels": dict(self.levels),
                "answer_types": list(self.answer_types), "question_types": list(self.question_types),
                "max_distractors": self.max_distractors, "unanswerable": self.has_unanswerable,
                "knobs": list(TaskSpec.__dataclass_fields__)[1:]}


_QUESTION_WORDS = frozenset({"What", "Where", "Which", "Who", "Whom", "Whose", "When", "How", "In", "On", "At", "For",
                             "The", "A", "An", "Of", "To", "Did", "Does", "Do", "Is", "Was", "By", "From", "With"})


def _separate(draft: Draft, other: Draft) -> bool:
    """Whether neither ``draft``'s answers nor the capitalised names of its question occur in ``other``'s story."""
    text = " ".join(s.text for b in other.blocks for s in b)
    names = {w.strip("?,.'s") for w in re.findall(r"[A-Z][\w'-]+", draft.question)} - _QUESTION_WORDS
    return not any(_occurs(v, text) for v in [*draft.answers, *sorted(n for n in names if len(n) > 1)])


def _occurs(value: str, context: str) -> bool:
    """Whether ``value`` occurs in ``context`` as whole words ("5" does not occur in "54 coins")."""
    return re.search(r"(?<!\w)" + re.escape(value) + r"(?!\w)", context) is not None


def _contains_any(value: str, answers: list[str]) -> bool:
    """Whether ``value`` equals or contains (as whole words) one of ``answers``."""
    v = f" {value.lower()} "
    return any(f" {a.lower()} " in v for a in answers)


def _dedupe(values: list[str]) -> list[str]:
    out: list[str] = []
    for v in values:
        if v not in out:
            out.append(v)
    return out


FAMILIES: Registry[type[Family]] = Registry("task family", hint="List them with `kvroute tasks list`.")


def get_family(name: str) -> Family:
    """The family registered as ``name`` (did-you-mean error otherwise).

    The built-in families are registered by ``kvroute.tasks`` (this module's package), which imports
    ``kvroute.tasks.families`` first: Python runs it before any import of this module can finish.
    """
    return FAMILIES.get(name)()
