"""Q-Filter (kvpress QFilterPress) with its learned filters loaded from a local folder.

An entry's score is minus the dot product of its key with the layer's learned filter of its KV head:
``-(q_filters[ℓ, h] · k)``, kvpress's own ``score()``. kvpress downloads the filters per model
(``QFilters.from_pretrained("nthngdy/<model>_qfilt")``); kvroute reads the folder ``weights=FOLDER``
that ``QFilters(...).save_pretrained`` wrote, and casts the filters to the model's dtype as kvpress
does (see :mod:`kvroute.presses.scorers.local_weights`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import nn

from kvroute.models.loading import model_info
from kvroute.presses.params import Param
from kvroute.presses.scorers.base import SCORERS
from kvroute.presses.scorers.kvpress_adapter import KvpressClass
from kvroute.presses.scorers.local_weights import LocalWeightsScorer


@SCORERS.add
class QFilterScorer(LocalWeightsScorer):
    name: ClassVar[str] = "qfilter"
    description: ClassVar[str] = ("Minus the key's dot product with a learned per-head filter (Q-Filter, kvpress "
                                  "QFilterPress); filters from a local folder: weights=FOLDER.")
    press_cls: ClassVar[Any] = KvpressClass("QFilterPress")
    holds: ClassVar[str] = "its learned Q-filters"
    hub_copy: ClassVar[str] = "nthngdy/<model>_qfilt"
    schema: ClassVar[dict[str, Param]] = {
        "weights": Param(kind=str, why="the folder QFilters.save_pretrained wrote")}

    def load(self, folder: Path) -> Any:
        from kvpress.presses.qfilter_press import QFilters

        # strict: a checkpoint without the filters fails here instead of leaving QFilters' random init
        return QFilters.from_pretrained(folder, local_files_only=True, strict=True).q_filters.detach()  # [L, Hkv, D]

    @classmethod
    def save_random(cls, model: nn.Module, folder: Path, *, seed: int = 0, **params: Any) -> Path:
        from kvpress.presses.qfilter_press import QFilters

        info = model_info(model)
        filters = QFilters(info.num_layers, info.num_kv_heads, info.head_dim)
        filters.q_filters.data = torch.randn(info.num_layers, info.num_kv_heads, info.head_dim,
                                             generator=torch.Generator().manual_seed(seed))  # [L, Hkv, D]
        filters.save_pretrained(folder)
        return folder

    def shape(self, weights: Any) -> str:
        L, Hkv, D = weights.shape
        return f"[layers={L}, kv_heads={Hkv}, head_dim={D}]"

    def model_shape(self, model: nn.Module) -> str:
        info = model_info(model)
        return f"[layers={info.num_layers}, kv_heads={info.num_kv_heads}, head_dim={info.head_dim}]"

    def hold(self, press: Any, weights: Any) -> None:
        press.q_filters = weights

    def fit(self, press: Any, model: nn.Module) -> None:
        m: Any = model
        press.q_filters = press.q_filters.to(m.dtype)  # as QFilterPress.post_init_from_model (device: in score())
