"""Scorers: importance of every context KV entry, per layer and KV head, from one prefill.

A scorer sees exactly what a kvpress press sees in its forward hook (the attention module, its
input hidden states, the post-RoPE keys and values of the layer) and returns ``[1, Hkv, T]``
scores, higher = more important. Selection strategies turn scores into a KeepMask.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import nn

from kvroute.errors import ConfigError, EngineError, UnknownNameError
from kvroute.presses.params import Param
from kvroute.presses.spec import DEFAULT_SELECTION, Component, ComponentSpec, parse_component
from kvroute.registry import Registry


@dataclass
class ScoreInputs:
    """What a scorer may read for one layer of the prefill (batch size 1)."""

    module: nn.Module  # the attention module of layer ℓ
    layer_idx: int
    hidden_states: torch.Tensor  # [1, T, hidden]: the attention module's input
    keys: torch.Tensor  # [1, Hkv, T, D]: post-RoPE keys of the layer
    values: torch.Tensor  # [1, Hkv, T, D]
    kwargs: dict[str, Any]  # the attention forward's kwargs (position_embeddings, ...)
    attentions: torch.Tensor | None = None  # [1, H, T, T]: only for scorers with needs_attentions
    evidence: torch.Tensor | None = None  # long [n]: evidence token positions in [0, T) (oracle controls)
    seed: int = 0
    question_window: int = 0  # the question's tokens at the end of the prefix (question-aware regime), else 0


@dataclass
class ModelScoreInputs:
    """What a scorer that scores after the prefill (``scores_after_prefill``) may read: the whole model."""

    model: nn.Module  # the causal LM
    context_ids: torch.Tensor  # long [1, T]: the prefilled prefix
    keys: list[torch.Tensor]  # per layer [1, Hkv, T, D], post-RoPE (read only: copy before changing)
    values: list[torch.Tensor]  # per layer [1, Hkv, T, D]
    seed: int = 0


class Scorer(Component, ABC):
    """Base class. Subclasses are dataclasses whose fields are their user-visible parameters."""

    name: ClassVar[str]
    description: ClassVar[str] = ""
    needs_attentions: ClassVar[bool] = False  # needs the full [H, T, T] prefill attention map
    ratio_dependent: ClassVar[bool] = False  # scores change with the compression ratio
    needs_evidence: ClassVar[bool] = False  # reads the instance's evidence positions
    needs_question_window: ClassVar[bool] = False  # reads the question inside the prefix (question-aware regime)
    # scores the whole model after the prefill (its own extra forward passes) instead of layer by layer
    scores_after_prefill: ClassVar[bool] = False
    extra_cost: ClassVar[str] = ""  # extra compute beyond the one prefill, in words (`presses list`)
    default_selection: ClassVar[str] = DEFAULT_SELECTION  # the selection used when a press names none
    schema: ClassVar[dict[str, Param]] = {}  # allowed range of each numeric parameter (checked at build time)

    def setup(self, model: nn.Module) -> None:
        """Called once per model before the first prefill."""
        return None

    def setup_tokenizer(self, tokenizer: Any) -> None:
        """Called once per model with its tokenizer, after :meth:`setup` (for scorers that write text)."""
        return None

    def min_tokens(self) -> int:
        """The fewest context tokens this scorer can score (its precondition)."""
        return 1

    def check(self, num_tokens: int) -> None:
        """Raise :class:`~kvroute.errors.EngineError` if a context of ``num_tokens`` cannot be scored."""
        return None

    @abstractmethod
    def score(self, x: ScoreInputs, ratio: float) -> torch.Tensor:
        """Scores ``[1, Hkv, T]`` (float); ``ratio`` matters only when ``ratio_dependent``."""

    def kvpress_press(self, ratio: float, question_window: int = 0) -> Any:
        """The kvpress press that scores as this scorer does, set to ``ratio`` (the equivalence reference).

        Raises :class:`~kvroute.errors.EngineError` saying why when kvpress has none.
        """
        raise EngineError(f"{self.name} is a kvroute Scorer, not a kvpress press: kvpress has no press to compare "
                          "it with")

    def score_model(self, x: ModelScoreInputs, ratio: float) -> torch.Tensor:
        """Scores ``[L, Hkv, T]`` of every layer at once, after the prefill (only when ``scores_after_prefill``)."""
        raise NotImplementedError(f"{self.name} scores layer by layer (score), not after the prefill")

# names not registered here are looked up as an import path (module:Class) or an installed plugin: the fallback
# is set by kvroute.presses.plugins (which builds on this module), imported by the scorers package
SCORERS: Registry[type[Scorer]] = Registry(
    "scorer", "A press of your own: module:Class (a kvpress ScorerPress or kvroute Scorer subclass).")


def check_params(kind: str, name: str, given: dict[str, Any], allowed: dict[str, Any],
                 schema: Mapping[str, Param] | None = None) -> dict[str, Any]:
    """Validate ``given`` against ``allowed`` (name → default) and ``schema``; cast to the default's type.

    Types come from the defaults (from ``Param.kind`` where the default is None, which stays allowed);
    every float must be finite; ``schema`` adds each parameter's range and a string's choices
    (:class:`~kvroute.presses.params.Param`).
    """
    schema = schema or {}
    out = {}
    for k, v in given.items():
        if k not in allowed:
            raise UnknownNameError(f"parameter of {kind} {name!r}", k, allowed, plural="parameters")
        default = allowed[k]
        kind_of = schema[k].kind if k in schema else None
        if default is None and kind_of is not None and v is not None:
            default = kind_of()  # an optional parameter (default None): typed by its schema
        if isinstance(default, str) and k in schema:
            schema[k].check_choice(kind, name, k, v)
        if isinstance(default, bool) and not isinstance(v, bool):
            raise ConfigError(f"{kind} {name!r}: parameter {k} must be true or false, got {v!r}")
        if isinstance(default, int) and not isinstance(default, bool):
            if not isinstance(v, int) or isinstance(v, bool):
                raise ConfigError(f"{kind} {name!r}: parameter {k} must be an integer, got {v!r}")
        if isinstance(default, float) and (not isinstance(v, (int, float)) or isinstance(v, bool)):
            raise ConfigError(f"{kind} {name!r}: parameter {k} must be a number, got {v!r}")
        v = float(v) if isinstance(default, float) else v
        if isinstance(v, float) and not math.isfinite(v):
            raise ConfigError(f"{kind} {name!r}: parameter {k} must be a finite number, got {v!r}")
        if k in schema and isinstance(v, int | float) and not isinstance(v, bool):
            schema[k].check(kind, name, k, v)
        out[k] = v
    return out


def build_scorer(spec: ComponentSpec | str) -> Scorer:
    if isinstance(spec, str):
        spec = parse_component(spec, "scorer")
    cls = SCORERS.get(spec.name)
    params = check_params("scorer", spec.name, spec.kwargs, cls.parameters(), cls.schema)
    return cls(**params)
