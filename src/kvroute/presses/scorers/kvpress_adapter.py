"""Any kvpress ``ScorerPress`` as a kvroute scorer.

The adapter calls the press's own ``score()`` with the arguments kvpress's forward hook would give
it, so kvroute's scores are kvpress's scores. Parameters are the press's dataclass fields (without
``compression_ratio``) with kvpress's defaults.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import torch
from torch import nn

from kvroute.errors import EngineError
from kvroute.presses.params import Param
from kvroute.presses.scorers.base import SCORERS, ScoreInputs, Scorer


class KvpressScorer(Scorer):
    """Wraps ``press_cls`` (a kvpress ScorerPress subclass); subclasses set ``press_cls``."""

    press_cls: ClassVar[type]
    min_tokens_param: ClassVar[str | None] = None  # the press asserts T > this parameter

    def __init__(self, **params: Any) -> None:
        self.params = params
        self.press = self.press_cls(compression_ratio=0.0, **params)

    @classmethod
    def parameters(cls) -> dict[str, Any]:
        out = {}
        for f in dataclasses.fields(cls.press_cls):
            if f.name == "compression_ratio":
                continue
            out[f.name] = f.default if f.default is not dataclasses.MISSING else None
        return out

    def __getattr__(self, item: str) -> Any:  # parameters read as attributes (for spec())
        params = self.__dict__.get("params", {})
        if item in params:
            return params[item]
        defaults = type(self).parameters()
        if item in defaults:
            return defaults[item]
        raise AttributeError(item)

    def setup(self, model: nn.Module) -> None:
        self.press.post_init_from_model(model)

    def min_tokens(self) -> int:
        return 1 if self.min_tokens_param is None else int(getattr(self, self.min_tokens_param)) + 1

    def check(self, num_tokens: int) -> None:
        if self.min_tokens_param is None:
            return
        need = getattr(self, self.min_tokens_param)
        if num_tokens <= need:
            raise EngineError(
                f"{self.name} needs more than {self.min_tokens_param}={need} context tokens, this context has "
                f"{num_tokens}; use a longer context or e.g. '{self.name}[{self.min_tokens_param}={max(1, num_tokens // 4)}]'"
            )

    def score(self, x: ScoreInputs, ratio: float) -> torch.Tensor:
        if self.ratio_dependent:
            self.press.compression_ratio = ratio
        return self.press.score(x.module, x.hidden_states, x.keys, x.values, x.attentions, x.kwargs)


def register_kvpress(name: str, press_cls: type, description: str, *, needs_attentions: bool = False,
                     ratio_dependent: bool = False, min_tokens_param: str | None = None,
                     schema: dict[str, Param] | None = None) -> type[KvpressScorer]:
    """Register ``press_cls`` under ``name`` as a kvroute scorer and return the adapter class.

    ``schema``: the allowed range of each numeric parameter of the press (see :mod:`kvroute.presses.params`).
    """
    cls = type(f"{press_cls.__name__}Scorer", (KvpressScorer,), {
        "name": name, "description": description, "press_cls": press_cls,
        "needs_attentions": needs_attentions, "ratio_dependent": ratio_dependent,
        "min_tokens_param": min_tokens_param, "schema": dict(schema or {}),
    })
    SCORERS.register(name, cls)
    return cls
