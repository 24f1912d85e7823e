"""The hallucination taxonomy: listed, correct, distractor, abstained, partial, fabricated.

Rules, decided in this order, for an answerable item:
1. ``listed``: the answer names a gold answer (as in 2) *and* one or more other candidate values of the
   instance (distractors, as in 3) — a hedge over the candidates, not an answer ("Maren Osk, Iver Lund and
   Tobin Hale" for gold "Tobin Hale"). Also when it rules the others out ("Tobin Hale, not Maren Osk"):
   it still names them. A distractor counts only where it occurs outside the gold's own words and does not
   itself contain a gold ("Tobin Hale Jr" for gold "Tobin Hale" is not a second candidate).
2. ``correct``: a normalised gold answer occurs as whole words in the answer, or exact match — even
   with hedging words around it ("The text does not say exactly, but it is Pellmarsh").
3. ``distractor``: the answer names another value present in the instance (a wrong binding), even
   when it shares a word with the gold ("Frostfield League" for gold "Cobaltwick League").
4. ``abstained``: the answer declines (see kvroute.metrics.abstention) and names no candidate value
   (gold or distractor; a named gold or distractor was already decided by 1–3).
5. ``partial``: token F1 with the gold answers above ``partial_f1`` (default 0) but none of the above.
6. ``fabricated``: anything else.
For an unanswerable item (gold "I don't know"): an answer naming a value of the instance is a
``distractor`` (also when hedged: "I don't know, maybe Tobin Hale", and when it names several); otherwise
abstaining is ``correct`` and anything else ``fabricated``. ``listed`` never occurs there.
Hallucinated = distractor or fabricated, so on an unanswerable item any answer other than a clean
abstention (one that names no candidate value) counts. ``listed`` is a failure (not ``correct``) but not a
hallucination: the hallucination rate stays (distractor + fabricated) / answerable items.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from kvroute.metrics.abstention import is_abstention
from kvroute.metrics.base import CellContext, Metric, register
from kvroute.metrics.utilization import contains_answer, exact_match, f1_score, normalize_answer

OUTCOMES = ("listed", "correct", "distractor", "abstained", "partial", "fabricated")  # the order of the rules
HALLUCINATIONS = ("distractor", "fabricated")  # listed is a failure, not a hallucination


def names_distractor(answer: str, golds: Sequence[str], distractors: Sequence[str]) -> bool:
    """Whether ``answer`` names (as whole words) a distractor value that does not itself contain a gold."""
    return any(normalize_answer(d) and contains_answer(answer, [d]) and not contains_answer(d, golds)
               for d in distractors)


def _outside_golds(answer: str, golds: Sequence[str]) -> list[str]:
    """The pieces of the normalised ``answer`` left between whole-word occurrences of the gold answers."""
    pieces = [f" {normalize_answer(answer)} "]
    for g in sorted({normalize_answer(g) for g in golds} - {""}, key=len, reverse=True):  # longest first
        gold = re.compile(rf"(?<= ){re.escape(g)}(?= )")  # whole words; the spaces stay, so repeats are cut too
        pieces = [part for piece in pieces for part in gold.split(piece)]
    return pieces


def classify(answer: str, golds: Sequence[str], distractors: Sequence[str] = (), *, unanswerable: bool = False,
             partial_f1: float = 0.0) -> str:
    """The taxonomy class of ``answer`` (see the module docstring for the rules and their order)."""
    wrong_binding = names_distractor(answer, golds, distractors)
    if unanswerable:
        if wrong_binding:
            return "distractor"
        return "correct" if is_abstention(answer) else "fabricated"
    if contains_answer(answer, golds) or exact_match(answer, golds):
        # a distractor named beside the gold, not merely a span inside the gold's own words
        if wrong_binding and any(names_distractor(p, golds, distractors) for p in _outside_golds(answer, golds)):
            return "listed"
        return "correct"
    if wrong_binding:
        return "distractor"
    if is_abstention(answer):
        return "abstained"
    if f1_score(answer, golds) > partial_f1:
        return "partial"
    return "fabricated"


@register
class Utilization(Metric):
    name = "utilization"
    needs = frozenset({"gold"})
    fields = ("answer", "f1", "exact", "outcome", "hallucinated", "gold_logprob", "gold_logprob_full",
              "gold_logprob_delta", "answer_tokens")

    def compute(self, ctx: CellContext) -> dict[str, Any]:
        inst = ctx.instance
        text = ctx.output.text.strip()
        outcome = classify(text, inst.answers, inst.distractors, unanswerable=inst.unanswerable,
                           partial_f1=ctx.settings.partial_f1)
        if inst.unanswerable:
            f1 = em = float(outcome == "correct")
        else:
            f1, em = f1_score(text, inst.answers), exact_match(text, inst.answers)
        lp, lp_full = ctx.output.gold_logprob, ctx.full.gold_logprob
        return {
            "answer": text, "f1": f1, "exact": em, "outcome": outcome, "hallucinated": outcome in HALLUCINATIONS,
            "gold_logprob": lp, "gold_logprob_full": lp_full,
            "gold_logprob_delta": (lp - lp_full) if lp is not None and lp_full is not None else None,
            "answer_tokens": len(ctx.output.tokens),
        }
