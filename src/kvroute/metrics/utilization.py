"""Utilization, text side: SQuAD-style normalised exact match and token F1 against gold answers."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from kvroute.text import normalize_answer


def _f1(prediction: str, gold: str) -> float:
    p, g = normalize_answer(prediction).split(), normalize_answer(gold).split()
    if not p or not g:
        return float(p == g)
    common = Counter(p) & Counter(g)
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision, recall = same / len(p), same / len(g)
    return 2 * precision * recall / (precision + recall)


def f1_score(prediction: str, golds: Iterable[str]) -> float:
    """Best token F1 of ``prediction`` over the gold answers (0 when there are none)."""
    return max((_f1(prediction, g) for g in golds), default=0.0)


def exact_match(prediction: str, golds: Iterable[str]) -> float:
    """1.0 when the normalised prediction equals a normalised gold answer."""
    p = normalize_answer(prediction)
    return float(any(p == normalize_answer(g) for g in golds))


def contains_answer(prediction: str, golds: Iterable[str]) -> bool:
    """Whether a normalised gold answer occurs as a whole-word span of the normalised prediction."""
    p = f" {normalize_answer(prediction)} "
    return any(f" {normalize_answer(g)} " in p for g in golds if normalize_answer(g))
