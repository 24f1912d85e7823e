"""``niah``: needle in a haystack — one fact sentence at a chosen depth of a long text, over grids.

The picture every compression paper shows: retrieval of one "needle" sentence as a function of
context length × needle depth. kvroute adds GER and reachability per cell (``kvroute tasks grid``).

The haystack is any text a user gives (``haystack=``: a UTF-8 file) or the essays shipped with
kvroute (``kvroute/tasks/data/haystack.txt``: twenty short original essays, ~2,000 words, written
for kvroute and dedicated to the public domain; no digits, so a numeric needle is unique). The
text is split into sentences and paragraphs; a context of ``L`` tokens takes sentences from a
seeded starting paragraph on, cycling through the paragraphs in a seeded shuffled order when the
text is shorter than ``L``. Lengths are measured with the tokenizer given to the generator
(``TokenCounter``: the needle plus the haystack sentences, each counted with its leading space),
else estimated from words. ``depth`` d puts the needle at the sentence boundary nearest to d × the
haystack's tokens (0 = first sentence, 1 = after the last).

The needle (default ``"The special magic number for {key} is {value}."``) gets a fictional key
(e.g. ``frost-heron``) and a random 7-digit value; the question asks for the key's value. The
answer span is the value inside the needle, the evidence span is the needle sentence.
``distractors=k`` (RULER's multi-key variant) adds k more needles with other keys and other
values at other, seeded sentence boundaries; their values are the instance's ``distractors``, so
answering takes binding the asked key to its value, not finding the one number in the text.
``meta`` records ``depth`` and ``target_length`` (the grid cell), ``depth_realised``,
``context_tokens`` and ``tokens_counted_with``, so reports can group by depth × length.
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from kvroute.errors import ConfigError, TaskFormatError
from kvroute.tasks.family import FAMILIES, Family, TaskSpec
from kvroute.tasks.instance import TaskInstance
from kvroute.tasks.lexicon import CREATURE_HEADS, CREATURE_TAILS
from kvroute.tasks.text import Draft, TokenCounter

VERSION = 1
SHIPPED = "kvroute-essays"
NEEDLE = "The special magic number for {key} is {value}."
QUESTION = "What is the special magic number for {key} mentioned in the provided text?"
ANSWER_PREFIX = "The special magic number for {key} mentioned in the provided text is"
_LEVEL_LENGTH = {1: 500, 2: 2000, 3: 8000}
MAX_DISTRACTORS = 8
_SENTENCE = re.compile(r"(?<=[.!?])[\"')\]]*\s+")


@dataclass(frozen=True)
class NiahSpec:
    """A needle-in-a-haystack grid; validated on construction (``ConfigError`` names the field).

    Attributes:
        lengths: context lengths in tokens (haystack + needle), one grid axis.
        depths: needle depths in [0, 1], the other axis.
        n: instances per (length, depth) cell (different keys, values and haystack offsets).
        seed: generator seed; the same spec and tokenizer always give the same bytes.
        haystack: a UTF-8 text file, or ``None`` for the shipped essays.
        needle / question / answer_prefix: templates with ``{key}`` (and ``{value}`` in the needle).
        distractors: needles with other keys and values (multi-key NIAH); 0 = the single needle.
    """

    lengths: tuple[int, ...] = (1000,)
    depths: tuple[float, ...] = (0.0, 0.25, 0.5, 0.75, 1.0)
    n: int = 1
    seed: int = 0
    haystack: Path | None = None
    needle: str = NEEDLE
    question: str = QUESTION
    answer_prefix: str = ANSWER_PREFIX
    distractors: int = 0

    def __post_init__(self) -> None:
        def need(ok: bool, fld: str, msg: str) -> None:
            if not ok:
                raise ConfigError(f"niah spec {fld}={getattr(self, fld)!r}: {msg}")

        object.__setattr__(self, "lengths", tuple(self.lengths))
        object.__setattr__(self, "depths", tuple(float(d) for d in self.depths))
        need(bool(self.lengths) and all(_is_int(x) and x >= 32 for x in self.lengths), "lengths",
             "must be integers >= 32 (tokens)")
        need(bool(self.depths) and all(0.0 <= d <= 1.0 for d in self.depths), "depths", "must be numbers in [0, 1]")
        need(_is_int(self.n) and self.n >= 1, "n", "must be a positive integer")
        need(_is_int(self.seed) and self.seed >= 0, "seed", "must be a non-negative integer")
        need(_is_int(self.distractors) and 0 <= self.distractors <= MAX_DISTRACTORS, "distractors",
             f"must be an integer in [0, {MAX_DISTRACTORS}]")
        need(_fields(self.needle) == {"key", "value"} and self.needle.count("{value}") == 1, "needle",
             "must contain {key} and exactly one {value}, and no other {...} fields")
        need(_fields(self.question) == {"key"}, "question", "must contain {key} (and not {value})")
        need(_fields(self.answer_prefix) <= {"key"}, "answer_prefix", "may contain only {key}")
        if self.haystack is not None:
            object.__setattr__(self, "haystack", Path(self.haystack))
            need(Path(self.haystack).is_file(), "haystack", "no such file")

    @property
    def haystack_name(self) -> str:
        return SHIPPED if self.haystack is None else Path(self.haystack).name


def _is_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _fields(template: str) -> set[str]:
    return set(re.findall(r"\{(\w*)\}", template))


@cache
def _paragraphs(path: str | None) -> tuple[tuple[str, ...], ...]:
    """The haystack as paragraphs of sentences (blank lines separate paragraphs)."""
    if path is None:
        text = resources.files("kvroute.tasks").joinpath("data/haystack.txt").read_text(encoding="utf-8")
    else:
        try:
            text = Path(path).read_text(encoding="utf-8-sig")
        except UnicodeDecodeError as e:
            raise TaskFormatError(f"haystack is not UTF-8 text ({e.reason} at byte {e.start})", path=path) from None
    paras = []
    for block in re.split(r"\n\s*\n", text):
        sents = tuple(s for s in (x.strip() for x in _SENTENCE.split(" ".join(block.split()))) if s)
        if sents:
            paras.append(sents)
    if not paras:
        raise TaskFormatError("haystack has no text", path=path)
    return tuple(paras)


def _sentences(paras: tuple[tuple[str, ...], ...], rng: random.Random) -> Iterator[tuple[str, bool]]:
    """(sentence, starts a paragraph) forever: from a seeded paragraph on, then seeded shuffled cycles."""
    order = list(range(len(paras)))
    start = rng.randrange(len(paras))
    cycle = order[start:] + order[:start]
    while True:
        for p in cycle:
            for k, s in enumerate(paras[p]):
                yield s, k == 0
        cycle = order[:]
        rng.shuffle(cycle)


def _distractor_pairs(drng: random.Random, n: int, key: str, value: str) -> list[tuple[str, str]]:
    """``n`` (key, value) pairs for distractor needles, each key and value unlike the needle's and each other's."""
    others: list[tuple[str, str]] = []
    while len(others) < n:
        k = f"{drng.choice(CREATURE_HEADS)}-{drng.choice(CREATURE_TAILS)}"
        v = str(drng.randrange(1_000_000, 10_000_000))
        if k != key and k not in {o[0] for o in others} and v != value and v not in {o[1] for o in others}:
            others.append((k, v))
    return others


def _haystack(paras: tuple[tuple[str, ...], ...], rng: random.Random, budget: int,
              count: TokenCounter) -> tuple[list[tuple[str, bool]], list[int]]:
    """Haystack sentences (each with "starts a paragraph") up to about ``budget`` tokens, and their token counts."""
    pieces: list[tuple[str, bool]] = []
    tokens: list[int] = []
    total = 0
    for sent, para in _sentences(paras, rng):
        if total >= budget:
            break
        t = count(" " + sent) if count.exact else count(sent)
        if pieces and total + t - budget > budget - total:  # adding it would overshoot more than stopping short
            break
        pieces.append((sent, para))
        tokens.append(t)
        total += t
    return pieces, tokens


def niah_instance(spec: NiahSpec, *, length: int, depth: float, index: int, count: TokenCounter,
                  difficulty: int | None = None) -> TaskInstance:
    """One instance of the (``length``, ``depth``) cell; ``index`` numbers it within the whole grid."""
    rng = random.Random(f"kvroute/niah/{spec.seed}/{length}/{depth}/{index}")
    paras = _paragraphs(None if spec.haystack is None else str(spec.haystack))
    key = f"{rng.choice(CREATURE_HEADS)}-{rng.choice(CREATURE_TAILS)}"
    value = str(rng.randrange(1_000_000, 10_000_000))
    needle = spec.needle.format(key=key, value=value)
    # multi-key distractor needles: their own generator, so the single-needle instances stay byte-identical
    drng = random.Random(f"kvroute/niah/{spec.seed}/{length}/{depth}/{index}/distractors")
    others = _distractor_pairs(drng, spec.distractors, key, value)  # (key, value) of each distractor needle
    extra = [spec.needle.format(key=k, value=v) for k, v in others]
    budget = length - count(needle) - sum(count(" " + x) for x in extra)
    pieces, tokens = _haystack(paras, rng, budget, count)
    total = sum(tokens)
    cum = [0]
    for t in tokens:
        cum.append(cum[-1] + t)
    at = min(range(len(cum)), key=lambda i: (abs(cum[i] - depth * total), i))
    # each distractor needle at a seeded boundary other than the needle's (several may share one)
    slots = [i for i in range(len(cum)) if i != at] or [at]
    placed: dict[int, list[str]] = {}
    for x in extra:
        placed.setdefault(drng.choice(slots), []).append(x)
    parts: list[str] = []
    answer = evidence = (0, 0)
    pos = 0
    for i in range(len(pieces) + 1):
        for x in placed.get(i, []) if i != at else []:
            sep = " " if parts else ""
            parts.append(sep + x)
            pos += len(sep) + len(x)
        if i == at:
            sep = " " if parts else ""
            start = pos + len(sep)
            evidence = (start, start + len(needle))
            value_at = start + len(spec.needle[:spec.needle.index("{value}")].format(key=key))
            answer = (value_at, value_at + len(value))
            parts.append(sep + needle)
            pos += len(sep) + len(needle)
            for x in placed.get(i, []):  # the only boundary (a haystack of nothing): after the needle
                parts.append(" " + x)
                pos += 1 + len(x)
        if i < len(pieces):
            sent, para = pieces[i]
            sep = ("\n\n" if para else " ") if parts else ""
            parts.append(sep + sent)
            pos += len(sep) + len(sent)
    context = "".join(parts)
    for v in (value, *(o[1] for o in others)):
        if context.count(v) != 1:  # pragma: no cover - a user haystack that contains a drawn value
            raise ConfigError(f"niah: the haystack already contains the value {v}; use another seed")
    meta: dict[str, Any] = {"target_length": length, "depth": depth,
                            "depth_realised": round(cum[at] / total, 4) if total else 0.0,
                            "context_tokens": count(context), "tokens_counted_with": count.name,
                            "haystack": spec.haystack_name, "key": key, "index": index,
                            "answer_prefix_template": spec.answer_prefix.format(key=key)}
    if others:
        meta["distractor_keys"] = [o[0] for o in others]
    if difficulty is not None:
        meta["difficulty"] = difficulty
    return TaskInstance.create(
        family="niah", version=VERSION, seed=spec.seed, context=context, question=spec.question.format(key=key),
        answers=[value], unanswerable=False, answer_spans=[answer], evidence_spans=[evidence],
        distractors=[o[1] for o in others],
        answer_type="Numeral", question_type="Standard", meta=meta)


def generate_niah(spec: NiahSpec, tokenizer: Any | None = None) -> list[TaskInstance]:
    """The whole grid: for each length, each depth, ``spec.n`` instances (in that order)."""
    count = TokenCounter(tokenizer)
    out: list[TaskInstance] = []
    for length in spec.lengths:
        for depth in spec.depths:
            for _ in range(spec.n):
                out.append(niah_instance(spec, length=length, depth=depth, index=len(out), count=count))
    return out


@FAMILIES.add
class Niah(Family):
    """The ``niah`` family for ``TaskSpec`` users (``kvroute tasks generate niah``, sweep configs).

    ``target_tokens`` is the length (default per level), ``depth`` the needle depth (default: drawn
    per instance); the shipped essays are the haystack. For grids, other haystacks and templates use
    :class:`NiahSpec` (``kvroute tasks niah``).
    """

    name = "niah"
    VERSION = VERSION
    summary = "Needle in a haystack: one fact sentence at a chosen depth of a long text; depth × length grids."
    levels = {k: f"about {v} tokens of haystack" for k, v in _LEVEL_LENGTH.items()}
    answer_types = ("Numeral",)
    question_types = ("Standard",)
    max_distractors = MAX_DISTRACTORS
    always_filler = True

    def level_distractors(self, difficulty: int) -> int:
        return 0  # the single needle at every level; ask for multi-key needles with ``distractors``

    def draft(self, rng: random.Random, spec: TaskSpec, *, answer_type: str, question_type: str,
              unanswerable: bool, distractors: int) -> Draft:  # pragma: no cover - niah lays out its own text
        raise NotImplementedError("niah builds its instances in iter_instances")

    def iter_instances(self, spec: TaskSpec, tokenizer: Any | None = None) -> Iterator[TaskInstance]:
        if spec.family != self.name:
            raise ConfigError(f"spec is for family {spec.family!r}, not {self.name!r}")
        length = spec.target_tokens or _LEVEL_LENGTH[spec.difficulty]
        niah = NiahSpec(lengths=(length,), seed=spec.seed, distractors=spec.distractors or 0)
        count = TokenCounter(tokenizer)
        for i in range(spec.n):
            depth = spec.depth if spec.depth is not None else round(
                random.Random(f"kvroute/niah/{spec.seed}/depth/{i}").random(), 4)
            yield niah_instance(niah, length=length, depth=depth, index=i, count=count, difficulty=spec.difficulty)


RULER_HEADER = ("Some special magic numbers are hidden within the following text. Make sure to memorize it. "
                "I will quiz you about the numbers afterwards.\n")
"""RULER's niah instruction, put before the haystack when a grid is written in RULER or kvpress layout."""
EXPORT_LAYOUTS = ("kvroute", "ruler", "kvpress")


def niah_rows(instances: list[TaskInstance], layout: str, *, count: TokenCounter | None = None,
              max_new_tokens: int = 16) -> list[dict[str, Any]]:
    """NIAH instances as rows of another tool's layout (``ruler``: RULER's prepared JSONL; ``kvpress``).

    Both put :data:`RULER_HEADER` before the haystack and keep ``depth`` and ``target_length`` as
    extra columns (``kvroute tasks import`` carries them into ``meta``). RULER's ``length`` is the
    token count of ``input`` (measured with ``count``, else estimated); its ``answer_prefix``
    starts with a space, as RULER writes it.
    """
    if layout not in ("ruler", "kvpress"):
        raise ConfigError(f"niah rows: layout {layout!r} must be ruler or kvpress")
    count = count or TokenCounter(None)
    rows: list[dict[str, Any]] = []
    for i, inst in enumerate(instances):
        if inst.family != "niah":
            raise ConfigError(f"niah rows: instance {inst.id} is of family {inst.family!r}, not niah")
        context = RULER_HEADER + inst.context + "\n"
        prefix = str(inst.meta.get("answer_prefix_template", ""))
        cell = {"depth": inst.meta.get("depth"), "target_length": inst.meta.get("target_length")}
        if layout == "ruler":
            prompt = context + inst.question
            rows.append({"index": i, "input": prompt, "outputs": list(inst.answers), "length": count(prompt),
                         "answer_prefix": " " + prefix, **cell})
        else:
            rows.append({"context": context, "question": inst.question, "answer": list(inst.answers),
                         "answer_prefix": prefix, "max_new_tokens": max_new_tokens, "task": "niah", **cell})
    return rows
