"""kvpress presses with learned weights, loaded from a local folder instead of a model hub.

kvpress's QFilterPress, KVzapPress and ExpectedAttentionStatsPress download their weights in
``post_init_from_model`` by model name (``nthngdy/<model>_qfilt``, ...). kvroute never downloads: the
user names a folder holding the checkpoint (as kvpress's ``save_pretrained`` writes it) with the
scorer's weights parameter, and kvroute loads it with the same kvpress class, offline
(``local_files_only``).

- build time (config time, before any model loads): the parameter is given, and names a folder;
- :meth:`LocalWeightsScorer.setup`: the folder loads, its shapes fit the model (layers, heads,
  head_dim), and the weights are put on the scorer's press as kvpress's ``post_init_from_model``
  would put them (the same dtype and device);
- :meth:`LocalWeightsScorer.kvpress_press`: the kvpress press already holding the same loaded weights.
  Its own ``post_init_from_model`` (the hub loader, which the pipeline and every wrapper press call)
  is replaced on that instance by the shape check and the dtype/device move, so the reference run
  never reaches the network either.

A subclass says what its folder holds (:attr:`~LocalWeightsScorer.holds`, :attr:`~LocalWeightsScorer.hub_copy`)
and implements :meth:`load`, :meth:`shape` / :meth:`model_shape`, :meth:`hold`, :meth:`fit` and
:meth:`save_random` (random weights of the right shape, written by kvpress's own class: what the tests,
``kvroute presses check`` and ``benchmarks/equivalence.py`` compare against kvpress with, since no real
checkpoint can be downloaded here).
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

from torch import nn

from kvroute.errors import ConfigError, error_reason
from kvroute.presses.scorers.kvpress_adapter import KvpressScorer


class LocalWeightsScorer(KvpressScorer):
    """A kvpress press whose hub weights come from the folder named by :attr:`weights_param`."""

    weights_param: ClassVar[str] = "weights"  # the parameter naming the folder
    holds: ClassVar[str]  # what the folder holds, in words ("its learned Q-filters")
    hub_copy: ClassVar[str]  # the hub repository kvpress would download, e.g. "nthngdy/<model>_qfilt"
    hub_only: ClassVar[tuple[str, ...]] = ()  # press fields that only name the hub repository: not parameters

    def __init__(self, **params: Any) -> None:
        folder = params.get(self.weights_param)
        if folder is None:
            raise ConfigError(f"{self.name} needs {self.holds}: give {self.weights_param}=FOLDER (a local copy of "
                              f"{self.hub_copy_of(params)}, saved with save_pretrained); kvroute does not download "
                              "from a model hub")
        self.folder = Path(str(folder)).expanduser()
        if not self.folder.is_dir():
            what = "is a file, not a folder" if self.folder.exists() else "does not exist"
            raise ConfigError(f"{self.name}: {self.weights_param}={folder} {what}; give the folder save_pretrained "
                              f"wrote (a local copy of {self.hub_copy_of(params)})")
        super().__init__(**params)  # the user's parameters (the folder included)
        self._weights: Any = None

    def press_params(self) -> dict[str, Any]:
        """The user's parameters the kvpress press takes (the folder only where it is the press's own field)."""
        fields = self.press_fields()
        return {k: v for k, v in self.params.items() if k in fields}

    @classmethod
    def parameters(cls) -> dict[str, Any]:
        fields = cls.press_fields()
        return {cls.weights_param: None, **{k: v for k, v in fields.items()
                                            if k != cls.weights_param and k not in cls.hub_only}}

    def hub_copy_of(self, params: dict[str, Any]) -> str:
        """The hub repository the folder stands in for (subclasses fill in their parameters)."""
        return self.hub_copy

    # --- what a subclass implements -------------------------------------------------------------
    def load(self, folder: Path) -> Any:
        """The weights in ``folder``, loaded with kvpress's class (offline); raise on anything else."""
        raise NotImplementedError

    def shape(self, weights: Any) -> str:
        """The shape of ``weights``, in words (e.g. ``[L=3, Hkv=2, D=16]``)."""
        raise NotImplementedError

    def model_shape(self, model: nn.Module) -> str:
        """The shape weights for ``model`` must have, in the words of :meth:`shape`."""
        raise NotImplementedError

    def hold(self, press: Any, weights: Any) -> None:
        """Put ``weights`` on the kvpress ``press`` where its hub loader puts them (no model needed)."""
        raise NotImplementedError

    def fit(self, press: Any, model: nn.Module) -> None:
        """What kvpress's ``post_init_from_model`` does to the loaded weights for ``model`` (dtype, device)."""
        return None

    @classmethod
    def save_random(cls, model: nn.Module, folder: Path, *, seed: int = 0, **params: Any) -> Path:
        """Write random weights shaped for ``model`` to ``folder`` with kvpress's class; return ``folder``.

        They stand in for a real checkpoint where none can be downloaded: scoring with them is as
        meaningful as a random scorer, but masked evaluation must still equal kvpress's run exactly."""
        raise NotImplementedError

    # --- shared ---------------------------------------------------------------------------------
    def loaded(self) -> Any:
        """The folder's weights, loaded once (a folder that does not load raises ConfigError)."""
        if self._weights is None:
            if not (self.folder / "config.json").is_file():
                raise ConfigError(f"{self.name}: {self.weights_param}={self.folder} holds no config.json, so it is not "
                                  f"a checkpoint folder; give the folder save_pretrained wrote (a local copy of "
                                  f"{self.hub_copy_of(self.params)})")
            try:
                with _quiet_loading():
                    self._weights = self.load(self.folder)
            except ConfigError:
                raise
            except Exception as e:  # any failure of kvpress's loader is the folder's: say which and why
                raise ConfigError(f"{self.name}: {self.weights_param}={self.folder} does not load ({error_reason(e)}); "
                                  f"give the folder save_pretrained wrote (a local copy of "
                                  f"{self.hub_copy_of(self.params)})") from None
        return self._weights

    def check_fits(self, model: nn.Module) -> None:
        """Raise ConfigError naming both shapes when the folder's weights are not for ``model``."""
        have, need = self.shape(self.loaded()), self.model_shape(model)
        if have != need:
            raise ConfigError(f"{self.name}: the weights in {self.folder} have shape {have}, this model needs {need}; "
                              f"give weights made for this model")

    def setup(self, model: nn.Module) -> None:
        self.check_fits(model)
        self.hold(self.press, self.loaded())
        self.fit(self.press, model)

    def kvpress_press(self, ratio: float, question_window: int = 0) -> Any:
        press = self.new_press(ratio)
        self.hold(press, self.loaded())

        def post_init_from_model(model: nn.Module) -> None:  # replaces the hub loader on this instance only
            self.check_fits(model)
            self.fit(press, model)

        press.post_init_from_model = post_init_from_model
        return press


def with_random_weights(spec: str, model: nn.Module, folder: Path) -> str:
    """``spec`` with a weights folder of random weights for ``model`` (written under ``folder``) when its
    scorer reads learned weights and the spec names none; otherwise ``spec`` unchanged.

    For checks against kvpress where no real checkpoint can be had (the reference tests,
    ``benchmarks/equivalence.py``): both sides then score with the same weights."""
    from kvroute.presses.scorers.base import SCORERS

    name = spec.split("+")[0].split("[")[0]
    cls = SCORERS.get(name) if name in SCORERS.names() else None
    if cls is None or not issubclass(cls, LocalWeightsScorer) or f"{cls.weights_param}=" in spec:
        return spec
    path = cls.save_random(model, folder / name)
    head, sep, rest = spec.partition("+")
    given = f"{cls.weights_param}={path}"
    head = f"{head[:-1]},{given}]" if head.endswith("]") else f"{head}[{given}]"
    return head + sep + rest


@contextlib.contextmanager
def _quiet_loading() -> Iterator[None]:
    """No output from the loaders: huggingface_hub prints "Loading weights from local directory", transformers
    draws a progress bar (a folder of a few small tensors loads at once)."""
    from transformers.utils import logging as hf_logging

    bar_on = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            yield
    finally:
        if bar_on:
            hf_logging.enable_progress_bar()
