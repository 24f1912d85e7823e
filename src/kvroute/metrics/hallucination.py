"""The hallucination taxonomy: correct, partial, abstained, distractor, fabricated.

Rules, in order, for an answerable item:
1. ``abstained``: the answer declines (see kvroute.metrics.abstention).
2. ``correct``: a normalised gold answer occurs as whole words in the answer, or exact match.
3. ``partial``: token F1 with the gold answers above ``partial_f1`` (default 0) but not correct.
4. ``distractor``: the answer contains another value present in the instance (a wrong binding).
5. ``fabricated``: anything else.
For an unanswerable item (gold "I don't know"): abstaining is ``correct``; otherwise the answer is a
``distractor`` if it names a value of the instance, else ``fabricated``.
Hallucinated = distractor or fabricated (so any non-abstention on an unanswerable item counts).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvroute.metrics.abstention import is_abstention
from kvroute.metrics.base import CellContext, Metric, register
from kvroute.metrics.utilization import contains_answer, exact_match, f1_score, normalize_answer

OUTCOMES = ("correct", "partial", "abstained", "distractor", "fabricated")
HALLUCINATIONS = ("distractor", "fabricated")


def classify(answer: str, golds: Sequence[str], distractors: Sequence[str] = (), *, unanswerable: bool = False,
             partial_f1: float = 0.0) -> str:
    """The taxonomy class of ``answer`` (see the module docstring for the rules)."""
    abstained = is_abstention(answer)
    wrong_binding = any(normalize_answer(d) and contains_answer(answer, [d]) and not contains_answer(d, golds)
                        for d in distractors)
    if unanswerable:
        if abstained:
            return "correct"
        return "distractor" if wrong_binding else "fabricated"
    if abstained:
        return "abstained"
    if contains_answer(answer, golds) or exact_match(answer, golds):
        return "correct"
    if f1_score(answer, golds) > partial_f1:
        return "partial"
    if wrong_binding:
        return "distractor"
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
