"""Any kvpress ``ScorerPress`` as a kvroute scorer.

The adapter calls the press's own ``score()`` with the arguments kvpress's forward hook would give
it, so kvroute's scores are kvpress's scores. Parameters are the press's dataclass fields (without
``compression_ratio`` and private fields such as CompactorPress's child presses) with kvpress's
defaults.

Random presses. Some kvpress scorers draw from torch's global generator inside ``score()``
(LeverageScorePress's and so CompactorPress's Gaussian sketch, CURPress with
``use_random_leverage``). kvpress leaves that generator unseeded, so its own answers change from run
to run; one prefill scoring several such presses would also interleave their draws. kvroute fixes
the draw: every ``score()`` call of a scorer with ``random_draws`` runs with torch's generator seeded
by :func:`layer_seed` (sweep seed, layer) and restored afterwards (the chunks of one layer under a
chunked selection continue one stream, as in kvpress's ChunkPress). :func:`seeded_kvpress_layers`
seeds kvpress's own run the same way (before each attention layer, so before its hook scores), which
is what makes the two token-for-token comparable.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
from collections.abc import Callable, Iterator
from typing import Any, ClassVar

import torch
from torch import nn

from kvroute.errors import ConfigError, EngineError, error_reason
from kvroute.presses.params import Param
from kvroute.presses.scorers.base import SCORERS, ScoreInputs, Scorer
from kvroute.presses.scorers.guard import guard
from kvroute.presses.scorers.kvpress_fields import KVPRESS_FIELDS, live_fields


@contextlib.contextmanager
def quiet_kvpress(module: str) -> Iterator[None]:
    """Silence the warnings of kvpress module ``module`` (e.g. ``"kvzip_press"``) inside the block.

    For warnings kvroute states itself, once and where it matters (``presses list``, its own log),
    rather than once per press object built.
    """
    log = logging.getLogger(f"kvpress.presses.{module}")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(level)


def layer_seed(seed: int, layer_idx: int) -> int:
    """The seed of torch's generator when a random scorer scores layer ``layer_idx`` (same rule as ``random``)."""
    return seed * 100_003 + layer_idx


class KvpressClass:
    """A kvpress press class named by its export name and imported on first use.

    Importing kvpress imports transformers' model code and patches every attention function (seconds);
    a built-in scorer names its press this way, so listing presses and checking a config never pay
    that. ``cls.press_cls`` (on the class or an instance) is the class itself.
    """

    def __init__(self, name: str) -> None:
        self.name = name

    def __get__(self, obj: object, owner: type | None = None) -> type:
        import kvpress

        return getattr(kvpress, self.name)  # type: ignore[no-any-return]


class KvpressScorer(Scorer):
    """Wraps ``press_cls`` (a kvpress ScorerPress subclass); subclasses set ``press_cls``.

    ``press_cls`` is either a class (a press of the user's: kvpress is imported already, and the press
    is built, so its own checks run, when the scorer is) or a :class:`KvpressClass` (the built-ins:
    parameters come from the table in :mod:`~kvroute.presses.scorers.kvpress_fields`, checked by each
    parameter's schema, and the press is built on first use).
    """

    press_cls: ClassVar[Any]  # a kvpress ScorerPress subclass, or a KvpressClass naming one
    # The press needs T > the sum of these parameters + min_tokens_extra (it asserts or breaks otherwise).
    min_tokens_param: ClassVar[str | tuple[str, ...] | None] = None
    min_tokens_extra: ClassVar[int] = 0
    random_draws: ClassVar[bool] = False  # score() draws from torch's global generator (seeded per layer here)
    # For presses that read compression_ratio only for some parameter values: params -> ratio dependent?
    ratio_dependent_if: ClassVar[Callable[[dict[str, Any]], bool] | None] = None
    quiet_module: ClassVar[str | None] = None  # a kvpress module whose warnings building the press silences

    def __init__(self, **params: Any) -> None:
        self.params = params
        if not self.lazy():
            _ = self.press  # a user's press class: its own checks of its parameters run now
        rule = type(self).ratio_dependent_if
        if rule is not None:  # instance value; the class keeps True so `presses list` marks it
            self.ratio_dependent = bool(rule({**type(self).parameters(), **params}))  # type: ignore[misc]

    @classmethod
    def lazy(cls) -> bool:
        """Whether the press class is named (imported on first use) rather than given."""
        return isinstance(inspect.getattr_static(cls, "press_cls"), KvpressClass)

    @classmethod
    def press_name(cls) -> str:
        """The kvpress press's class name, without importing kvpress for a named one."""
        named = inspect.getattr_static(cls, "press_cls")
        return named.name if isinstance(named, KvpressClass) else str(cls.press_cls.__name__)

    @classmethod
    def press_fields(cls) -> dict[str, Any]:
        """The kvpress press's own parameters and defaults: its dataclass fields (read from
        :data:`~kvroute.presses.scorers.kvpress_fields.KVPRESS_FIELDS` for a named class)."""
        if cls.lazy():
            return dict(KVPRESS_FIELDS[cls.press_name()])
        return live_fields(cls.press_cls)

    @classmethod
    def parameters(cls) -> dict[str, Any]:
        return cls.press_fields()

    def press_params(self) -> dict[str, Any]:
        """The keyword arguments the kvpress press is built with (besides ``compression_ratio``)."""
        return self.params

    def new_press(self, ratio: float) -> Any:
        """A kvpress press set to ``ratio``; its own refusal of the parameters is a ConfigError."""
        quiet = quiet_kvpress(self.quiet_module) if self.quiet_module else contextlib.nullcontext()
        try:
            with quiet:
                return self.press_cls(compression_ratio=ratio, **self.press_params())
        except (AssertionError, TypeError, ValueError) as e:  # the press's own checks of its parameters
            raise ConfigError(f"scorer {self.name!r}: {self.press_name()} refused the parameters "
                              f"{self.params}: {error_reason(e)}") from None

    @property
    def press(self) -> Any:
        """The kvpress press this scorer scores with (built once, at ratio 0; set per ratio when ratio dependent)."""
        press = self.__dict__.get("_press")
        if press is None:
            press = self.__dict__["_press"] = self.new_press(0.0)
        return press

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

    def kvpress_press(self, ratio: float, question_window: int = 0) -> Any:
        return self.new_press(ratio)

    def _min_params(self) -> tuple[str, ...]:
        p = self.min_tokens_param
        return () if p is None else (p,) if isinstance(p, str) else tuple(p)

    def min_tokens(self) -> int:
        return sum(int(getattr(self, p)) for p in self._min_params()) + self.min_tokens_extra + 1

    def check(self, num_tokens: int) -> None:
        names = self._min_params()
        if not names and self.min_tokens_extra == 0:
            return
        need = self.min_tokens() - 1
        if num_tokens > need:
            return
        what = "+".join(names + ((str(self.min_tokens_extra),) if self.min_tokens_extra else ()))
        hint = ""
        if names:
            hint = f"; use a longer context or e.g. '{self.name}[{names[0]}={max(1, num_tokens // (4 * len(names)))}]'"
        raise EngineError(f"{self.name} needs more than {what}={need} context tokens, this context has "
                          f"{num_tokens}{hint or '; use a longer context'}")

    def score(self, x: ScoreInputs, ratio: float) -> torch.Tensor:
        if self.ratio_dependent:
            self.press.compression_ratio = ratio
        if not self.random_draws:
            return self.press_score(x)
        dev = x.keys.device
        # A later chunk of the same layer (chunked selection slices the layer's hidden states, so only
        # the first chunk starts where they start) continues the layer's draws, as kvpress's ChunkPress
        # does by calling score() chunk after chunk; a whole context or a first chunk reseeds.
        layer_hidden = x.kwargs.get("hidden_states", x.hidden_states)
        first = x.hidden_states.data_ptr() == layer_hidden.data_ptr()
        with torch.random.fork_rng(devices=[dev] if dev.type != "cpu" else [], device_type=dev.type):
            saved = self.__dict__.get("_rng")
            if first or saved is None or saved[0] != (x.seed, x.layer_idx):
                torch.manual_seed(layer_seed(x.seed, x.layer_idx))
            else:
                _set_rng_state(dev, saved[1])
            out = self.press_score(x)
            self.__dict__["_rng"] = ((x.seed, x.layer_idx), _get_rng_state(dev))
            return out

    def press_score(self, x: ScoreInputs) -> torch.Tensor:
        """The kvpress press's own ``score()`` on ``x`` (the one call into the press's code while scoring).

        Guarded (:func:`~kvroute.presses.scorers.guard.guard`): kvpress's code failing on a model it does not
        handle (e.g. SnapKV's window queries on a partial rotary) fails this press's cells, not the run.
        """
        origin = getattr(self, "origin", None) or f"kvpress's {type(self.press).__name__}"  # a fenced plugin's name
        with guard(origin, "score()"):
            return self.press.score(x.module, x.hidden_states, x.keys, x.values, x.attentions, x.kwargs)


def _get_rng_state(dev: torch.device) -> torch.Tensor:
    return torch.get_rng_state() if dev.type == "cpu" else torch.get_device_module(dev.type).get_rng_state(dev)


def _set_rng_state(dev: torch.device, state: torch.Tensor) -> None:
    if dev.type == "cpu":
        torch.set_rng_state(state)
    else:
        torch.get_device_module(dev.type).set_rng_state(state, dev)


@contextlib.contextmanager
def seeded_kvpress_layers(model: nn.Module, seed: int = 0) -> Iterator[None]:
    """Seed torch's generator with :func:`layer_seed` before each attention layer runs (kvpress's side).

    For comparing a random kvpress press with kvroute: kvpress scores a layer in a forward hook right
    after the layer's attention, so seeding in a pre-hook gives its ``score()`` the generator state
    kvroute's adapter gives it. The generator's state is restored on exit.
    """
    from kvroute.models.layers import decoder_layers

    handles = []

    def pre_hook(module: Any, args: Any, kwargs: Any) -> None:
        torch.manual_seed(layer_seed(seed, module.layer_idx))

    dev = next(model.parameters()).device
    with torch.random.fork_rng(devices=[dev] if dev.type != "cpu" else [], device_type=dev.type):
        try:
            for layer in decoder_layers(model):
                attn: Any = layer.self_attn
                handles.append(attn.register_forward_pre_hook(pre_hook, with_kwargs=True))
            yield
        finally:
            for h in handles:
                h.remove()


def kvpress_scorer(name: str, press_cls: type | str, description: str, *, needs_attentions: bool = False,
                   ratio_dependent: bool = False, min_tokens_param: str | tuple[str, ...] | None = None,
                   min_tokens_extra: int = 0, random_draws: bool = False,
                   ratio_dependent_if: Callable[[dict[str, Any]], bool] | None = None,
                   schema: dict[str, Param] | None = None) -> type[KvpressScorer]:
    """The adapter class of ``press_cls`` under ``name`` (not registered; see :func:`register_kvpress`).

    ``press_cls``: a kvpress ScorerPress subclass, or the name kvpress exports it under (imported on first use,
    its parameters read from :data:`~kvroute.presses.scorers.kvpress_fields.KVPRESS_FIELDS`).

    ``schema``: the allowed range of each numeric parameter of the press (see :mod:`kvroute.presses.params`).
    ``ratio_dependent``: ``score()`` reads ``compression_ratio``, so the press is scored once per ratio;
    ``ratio_dependent_if(params)`` narrows that per instance (the class stays marked).
    ``min_tokens_param`` / ``min_tokens_extra``: the context must be longer than their sum.
    ``random_draws``: ``score()`` draws from torch's generator (seeded per (seed, layer), see module doc).
    """
    if ratio_dependent_if is not None:
        ratio_dependent = True
    class_name = press_cls if isinstance(press_cls, str) else press_cls.__name__
    return type(f"{class_name}Scorer", (KvpressScorer,), {
        "name": name, "description": description,
        "press_cls": KvpressClass(press_cls) if isinstance(press_cls, str) else press_cls,
        "needs_attentions": needs_attentions, "ratio_dependent": ratio_dependent,
        "min_tokens_param": min_tokens_param, "min_tokens_extra": min_tokens_extra,
        "random_draws": random_draws,
        "ratio_dependent_if": staticmethod(ratio_dependent_if) if ratio_dependent_if is not None else None,
        "schema": dict(schema or {}),
    })


def register_kvpress(name: str, press_cls: type | str, description: str, **options: Any) -> type[KvpressScorer]:
    """Register ``press_cls`` under ``name`` as a kvroute scorer and return the adapter class.

    ``options`` are :func:`kvpress_scorer`'s (ratio dependence, preconditions, random draws, schema).
    """
    cls = kvpress_scorer(name, press_cls, description, **options)
    SCORERS.register(name, cls)
    return cls
