"""The fence around presses kvroute did not write, and the finiteness check of every scorer's scores.

A press by import path or entry point (:mod:`kvroute.presses.plugins`) is code kvroute hosts but did
not write; its scorer class is :func:`fenced` before anything uses it:

* **Its errors are its cells' errors.** Every call kvroute makes into it (building it,
  ``parameters``, ``setup``, ``setup_tokenizer``, ``min_tokens``, ``check``, ``score``,
  ``score_model``, ``kvpress_press``)
  runs under :func:`guard`: any ``Exception`` or ``SystemExit`` it raises becomes a
  :class:`~kvroute.errors.PressPluginError` ("press plugin 'x' (mod:Cls, from dist) raised
  ZeroDivisionError in score(): division by zero"), an :class:`~kvroute.errors.EngineError` and so
  a per-cell error of ``run`` and ``sweep`` (:data:`~kvroute.errors.CELL_ERRORS`): the cells that
  needed that call are recorded with ``status="error"``, every other cell is computed.
  ``KeyboardInterrupt``, ``MemoryError`` and torch's out-of-memory error still stop the run; one of
  kvroute's own errors raised inside (a precondition the adapter checks) passes as it is.
* **Its inputs are its own.** ``score`` gets copies of the layer's hidden states, keys, values,
  attention map and of the tensors among the forward's kwargs (position embeddings, ...);
  ``score_model`` copies of every layer's keys and values. Copies rather than a checksum of the
  shared prefill's tensors: a checksum that catches every change needs a copy to compare with
  anyway, and a copy costs one layer's tensors (freed after the call, small beside the scorer's own
  work) while a checksum alone would still let one press's edit reach the presses scored after it
  in the same prefill. Built-in scorers are trusted and get the shared tensors uncopied. After the
  call the copies are compared with the originals: a press that changed them fails its cell
  ("changed its values in place"), because kvpress would have compressed the changed cache, so the
  press's results could not be kvpress's. Not copied (too large, or not tensors): the attention
  module with its weights, the model given to ``setup``/``score_model``, and the cache object in
  ``kwargs["past_key_values"]``; a press writing through those is not caught. The attention map
  (``needs_attentions``) is copied too, so such a press holds two ``[1, H, T, T]`` maps at once.
* **Its output is checked** before use: a floating-point tensor on the keys' device, of shape
  ``[B, Hkv, T]`` (``score``) or ``[L, Hkv, T]`` (``score_model``), every value finite.

:func:`finite_scores` is the last check for every scorer, built-in or not (the prefill applies it to
each request's scores of all layers, once the forward is done): a NaN or infinite score fails its
cell with one line, so no NaN ever reaches a keep mask (``topk`` ranks NaN first: an all-NaN press
would otherwise look like a perfect one).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, ClassVar

import torch
from torch import nn

from kvroute.errors import EngineError, PressPluginError, with_article
from kvroute.presses.scorers.base import ModelScoreInputs, ScoreInputs, Scorer
from kvroute.presses.scorers.guard import FATAL, guard
from kvroute.presses.scorers.kvpress_adapter import KvpressScorer

__all__ = ["FATAL", "FencedKvpressScorer", "FencedScorer", "checked_scores", "fenced", "finite_scores", "guard"]

class FencedScorer(Scorer):
    """The fence for a kvroute :class:`Scorer` of one's own; :func:`fenced` puts it before the class in its MRO.

    ``origin``: how messages name the press (its import path, or its plugin's label).
    """

    origin: ClassVar[str] = "a press from outside kvroute"

    def __init__(self, **params: Any) -> None:
        with guard(self.origin, "building it"):
            super().__init__(**params)

    @classmethod
    def parameters(cls) -> dict[str, Any]:  # a Scorer's dataclass default_factory is its code
        with guard(cls.origin, "parameters()"):
            return super().parameters()

    def setup(self, model: nn.Module) -> None:
        with guard(self.origin, "setup()"):
            super().setup(model)

    def setup_tokenizer(self, tokenizer: Any) -> None:
        with guard(self.origin, "setup_tokenizer()"):
            super().setup_tokenizer(tokenizer)

    def min_tokens(self) -> int:
        with guard(self.origin, "min_tokens()"):
            n = super().min_tokens()
        if not isinstance(n, int) or isinstance(n, bool):
            raise PressPluginError(f"{self.origin}: min_tokens() returned {n!r}, not an integer")
        return n

    def check(self, num_tokens: int) -> None:
        with guard(self.origin, "check()"):
            super().check(num_tokens)

    def kvpress_press(self, ratio: float, question_window: int = 0) -> Any:
        with guard(self.origin, "building its kvpress press"):
            return super().kvpress_press(ratio, question_window)

    def score(self, x: ScoreInputs, ratio: float) -> torch.Tensor:
        """The scorer's scores ``[B, Hkv, T]``, from copies of ``x``'s tensors, checked (module doc)."""
        with guard(self.origin, "score()"):
            out = self.outside_score(x, ratio)
        return checked_scores(out, self.origin, "score()", x.keys.shape[:-1], x.keys.device)

    def outside_score(self, x: ScoreInputs, ratio: float) -> torch.Tensor:
        """The class's own ``score`` on copies of ``x``'s tensors (the adapter copies at the press's call instead)."""
        own, copies = own_inputs(x)
        out = super().score(own, ratio)  # type: ignore[safe-super]  # the fenced class's own score
        unchanged(copies, self.origin, "score()")
        return out

    def score_model(self, x: ModelScoreInputs, ratio: float) -> torch.Tensor:
        keys, values = [k.clone() for k in x.keys], [v.clone() for v in x.values]
        with guard(self.origin, "score_model()"):
            out = super().score_model(replace(x, keys=list(keys), values=list(values),
                                              context_ids=x.context_ids.clone()), ratio)
        unchanged([("keys", a, b) for a, b in zip(x.keys, keys, strict=True)]
                  + [("values", a, b) for a, b in zip(x.values, values, strict=True)], self.origin, "score_model()")
        L, (_, Hkv, T, _) = len(x.keys), x.keys[0].shape
        return checked_scores(out, self.origin, "score_model()", torch.Size((L, Hkv, T)), x.keys[0].device)


class FencedKvpressScorer(FencedScorer, KvpressScorer):
    """The fence for a kvpress ScorerPress of one's own: the adapter (kvroute's code: seeding, ratio) runs on the
    shared tensors; only the press's own ``score()`` call gets copies."""

    def outside_score(self, x: ScoreInputs, ratio: float) -> torch.Tensor:
        return KvpressScorer.score(self, x, ratio)

    def press_score(self, x: ScoreInputs) -> torch.Tensor:
        own, copies = own_inputs(x)
        out = super().press_score(own)
        unchanged(copies, self.origin, "score()")
        return out


def fenced(cls: type[Scorer], origin: str) -> type[Scorer]:
    """``cls`` (an outside press's scorer class) behind the fence, named and documented as ``cls`` is."""
    mixin = FencedKvpressScorer if issubclass(cls, KvpressScorer) else FencedScorer
    return type(cls.__name__, (mixin, cls), {"origin": origin, "__module__": cls.__module__,
                                             "__qualname__": cls.__qualname__, "__doc__": cls.__doc__})


def own_inputs(x: ScoreInputs) -> tuple[ScoreInputs, list[tuple[str, torch.Tensor, torch.Tensor]]]:
    """``x`` with copies of its tensors (and of the tensors in its kwargs, at the top level or in a tuple such as
    the position embeddings), and each copy as ``(what, original, copy)`` for :func:`unchanged`; a tensor given
    twice (the hidden states, also in the kwargs) is copied once."""
    memo: dict[int, torch.Tensor] = {}
    copies: list[tuple[str, torch.Tensor, torch.Tensor]] = []

    def own(v: Any, what: str) -> Any:
        if isinstance(v, torch.Tensor):
            if id(v) not in memo:
                memo[id(v)] = v.clone()
                copies.append((what, v, memo[id(v)]))
            return memo[id(v)]
        if isinstance(v, tuple):
            return tuple(own(t, what) for t in v)
        return v

    mine = replace(x, hidden_states=own(x.hidden_states, "hidden states"), keys=own(x.keys, "keys"),
                   values=own(x.values, "values"), attentions=own(x.attentions, "attention map"),
                   evidence=own(x.evidence, "evidence positions"),
                   kwargs={k: own(v, f"kwargs[{k!r}]") for k, v in x.kwargs.items()})
    return mine, copies


def unchanged(copies: list[tuple[str, torch.Tensor, torch.Tensor]], origin: str, call: str) -> None:
    """Raise :class:`PressPluginError` when the press changed a copy :func:`own_inputs` gave it (a copy it
    replaced by another tensor of its own is no change to anything shared)."""
    for what, original, copy in copies:
        if not _same(original, copy):
            raise PressPluginError(_changed(origin, call, what))


def _changed(origin: str, call: str, what: str) -> str:
    return (f"{origin} changed its {what} in place in {call}; a press must not edit the cache it scores "
            "(kvroute gave it a copy, so the other presses are unaffected)")


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal shape and values, NaN equal to NaN (a model's NaN is not the press's change)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if torch.equal(a, b):
        return True
    if not (a.is_floating_point() or a.is_complex()):
        return False
    return bool(torch.where(a.isnan(), b.isnan(), a == b).all())


def checked_scores(out: Any, origin: str, call: str, shape: torch.Size, device: torch.device) -> torch.Tensor:
    """``out`` when it is a floating-point tensor of ``shape`` on ``device`` with finite values; else a one-line
    :class:`PressPluginError` saying what it is."""
    want = "[" + ", ".join(str(n) for n in shape) + "]"
    if not isinstance(out, torch.Tensor):
        what = "None" if out is None else with_article(type(out).__name__)
        raise PressPluginError(f"{origin}: {call} returned {what}, not a tensor of scores {want}")
    if not out.is_floating_point():
        raise PressPluginError(f"{origin}: {call} returned scores of dtype {out.dtype}; scores must be floating "
                               "point")
    if out.shape != shape:
        raise PressPluginError(f"{origin}: {call} returned scores of shape {list(out.shape)}, expected {want}")
    if out.device != device:
        raise PressPluginError(f"{origin}: {call} returned scores on {out.device}, the keys are on {device}")
    if (why := nonfinite(out)) is not None:
        raise PressPluginError(f"{origin}: {call} returned non-finite scores ({why}); a keep mask needs finite scores")
    return out


def finite_scores(scores: torch.Tensor, who: str) -> torch.Tensor:
    """``scores`` ``[L, Hkv, T]`` when every value is finite; else an :class:`~kvroute.errors.EngineError` (a
    per-cell error) naming the layers and counting the NaN and infinite scores. ``who`` names the scorer, e.g.
    ``scorer 'knorm'``."""
    if (why := nonfinite(scores)) is not None:
        bad = (~torch.isfinite(scores)).flatten(1).any(dim=1).nonzero().flatten().tolist()  # layers
        layers = f"layer{'s' if len(bad) > 1 else ''} {', '.join(str(i) for i in bad)}"
        raise EngineError(f"{who} gave non-finite scores in {layers} ({why}); a keep mask needs finite scores")
    return scores


def nonfinite(scores: torch.Tensor) -> str | None:
    """None when every score is finite, else how many are not: ``"3 NaN and 1 infinite of 148"``."""
    finite = torch.isfinite(scores)
    if bool(finite.all()):
        return None
    nan = int(torch.isnan(scores).sum())
    inf = scores.numel() - int(finite.sum()) - nan
    parts = [f"{n} {what}" for n, what in ((nan, "NaN"), (inf, "infinite")) if n]
    return f"{' and '.join(parts)} of {scores.numel()}"
