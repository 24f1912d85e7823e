"""KVzap (kvpress KVzapPress) with its learned surrogate loaded from a local folder.

A small model per layer (linear, or a 2-layer MLP) maps each token's attention input ``[hidden]`` to
one score per KV head ``[Hkv]``: kvpress's own ``score()``. kvpress downloads the surrogate per
model (``KVzapModel.from_pretrained("nvidia/KVzap-<model_type>-<model>")``); kvroute reads the folder
``weights=FOLDER`` that ``KVzapModel(...).save_pretrained`` wrote (see
:mod:`kvroute.presses.scorers.local_weights`). ``model_type`` says which surrogate the folder holds
(``mlp``: a hidden layer, ``linear``: none) and is checked against it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import nn

from kvroute.errors import ConfigError
from kvroute.models.loading import model_info
from kvroute.presses.params import Param
from kvroute.presses.scorers.base import SCORERS
from kvroute.presses.scorers.kvpress_adapter import KvpressClass
from kvroute.presses.scorers.local_weights import LocalWeightsScorer


@SCORERS.add
class KVzapScorer(LocalWeightsScorer):
    name: ClassVar[str] = "kvzap"
    description: ClassVar[str] = ("A learned surrogate of KVzip scoring each token's hidden state per KV head (KVzap, "
                                  "kvpress KVzapPress); surrogate from a local folder: weights=FOLDER.")
    press_cls: ClassVar[Any] = KvpressClass("KVzapPress")
    holds: ClassVar[str] = "its learned surrogate model"
    hub_copy: ClassVar[str] = "nvidia/KVzap-<model_type>-<model>"
    schema: ClassVar[dict[str, Param]] = {
        "weights": Param(kind=str, why="the folder KVzapModel.save_pretrained wrote"),
        "model_type": Param(choices=("mlp", "linear"), why="the surrogate the folder holds: mlp or linear")}

    def hub_copy_of(self, params: dict[str, Any]) -> str:
        return f"nvidia/KVzap-{params.get('model_type', 'mlp')}-<model>"

    def load(self, folder: Path) -> Any:
        from kvpress.presses.kvzap_press import KVzapModel

        surrogate, info = KVzapModel.from_pretrained(folder, local_files_only=True, output_loading_info=True)
        # transformers initialises what the checkpoint lacks at random: refuse that instead of scoring with it
        missing = sorted(info["missing_keys"]) + sorted(info["mismatched_keys"])
        if missing:
            raise ConfigError(f"kvzap: weights={folder} lacks {', '.join(map(str, missing[:4]))}"
                              f"{' …' if len(missing) > 4 else ''} for the KVzap model its config.json describes; "
                              "give the folder KVzapModel.save_pretrained wrote")
        surrogate.eval()
        kind = "linear" if surrogate.config.hidden_dim is None else "mlp"
        want = self.params.get("model_type", "mlp")
        if kind != want:
            raise ConfigError(f"kvzap: the surrogate in {folder} is {kind}, not {want}; give model_type={kind} "
                              f"(or the folder of the {want} surrogate)")
        return surrogate

    @classmethod
    def save_random(cls, model: nn.Module, folder: Path, *, seed: int = 0, **params: Any) -> Path:
        """``model_type=linear``: a linear surrogate; otherwise an MLP with a hidden layer of 8."""
        from kvpress.presses.kvzap_press import KVzapConfig, KVzapModel

        info = model_info(model)
        config: Any = model.config
        kvzap = KVzapConfig(input_dim=getattr(config, "text_config", config).hidden_size, output_dim=info.num_kv_heads,
                            n_modules=info.num_layers,
                            hidden_dim=None if params.get("model_type") == "linear" else 8)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)  # the Linear layers' own initialisation
            KVzapModel(kvzap).save_pretrained(folder)
        return folder

    def shape(self, weights: Any) -> str:
        c = weights.config
        return f"[layers={c.n_modules}, hidden={c.input_dim} -> kv_heads={c.output_dim}]"

    def model_shape(self, model: nn.Module) -> str:
        info = model_info(model)
        config: Any = model.config
        hidden = getattr(config, "text_config", config).hidden_size
        return f"[layers={info.num_layers}, hidden={hidden} -> kv_heads={info.num_kv_heads}]"

    def hold(self, press: Any, weights: Any) -> None:
        press.kvzap_model = weights  # score() moves each layer's module to the hidden states' device and dtype
