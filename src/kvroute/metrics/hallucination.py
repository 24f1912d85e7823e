"""The hallucination taxonomy: correct, distractor, abstained, partial, fabricated.

Rules, decided in this order, for an answerable item:
1. ``correct``: a normalised gold answer occurs as whole words in the answer, or exact match — even
   with hedging words around it ("The text does not say exactly, but it is Pellmarsh").
2. ``distractor``: the answer names another value present in the instance (a wrong binding), even
   when it shares a word with the gold ("Frostfield League" for gold "Cobaltwick League").
3. ``abstained``: the answer declines (see kvroute.metrics.abstention) and names no candidate value
   (gold or distractor; a named gold or distractor was already decided by 1 or 2).
4. ``partial``: token F1 with the gold answers above ``partial_f1`` (default 0) but none of the above.
5. ``fabricated``: anything else.
For an unanswerable item (gold "I don't know"): an answer naming a value of the instance is a
``distractor`` (also when hedged: "I don't know, maybe Tobin Hale"); otherwise abstaining is
``correct`` and anything else ``fabricated``.
Hallucinated = distractor or fabricated, so on an unanswerable item any answer other than a clean
abstention (one that names no candidate value) counts.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvroute.metrics.abstention import is_abstention
from kvroute.metrics.base import CellContext, Metric, register
from kvroute.metrics.utilization import contains_answer, exact_match, f1_score, normalize_answer

OUTCOMES = ("correct", "distractor", "abstained", "partial", "fabricated")  # the order of the rules
HALLUCINATIONS = ("distractor", "fabricated")


def names_distractor(answer: str, golds: Sequence[str], distractors: Sequence[str]) -> bool:
    """Whether ``answer`` names (as whole words) a distractor value that does not itself contain a gold."""
    return any(normalize_answer(d) and contains_answer(answer, [d]) and not contains_answer(d, golds)
               for d in distractors)


def classify(answer: str, golds: Sequence[str], distractors: Sequence[str] = (), *, unanswerable: bool = False,
             partial_f1: float = 0.0) -> str:
    """The taxonomy class of ``answer`` (see the module docstring for the rules and their order)."""
    wrong_binding = names_distractor(answer, golds, distractors)
    if unanswerable:
        if wrong_binding:
            return "distractor"
        return "correct" if is_abstention(answer) else "fabricated"
    if contains_answer(answer, golds) or exact_match(answer, golds):
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
