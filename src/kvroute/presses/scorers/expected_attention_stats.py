"""Expected attention with stored query statistics (kvpress ExpectedAttentionStatsPress), from a local folder.

ExpectedAttentionPress scores each entry by the attention that future queries are expected to pay
it; this variant takes the queries' mean and covariance per layer and query head (pre-RoPE,
``[L, H, D]`` and ``[L, H, D, D]``) from statistics computed beforehand on a corpus instead of from
the context itself: kvpress's own ``score()``. kvpress downloads the statistics per model
(``alessiodevoto/exp_att_stats_<model>_<dataset>_<num_samples>_<sample_seq_len>_<n_sink>``) unless
its ``stats_folder`` names a folder; kvroute always reads ``stats_folder=FOLDER``, the folder
``ExpectedAttentionStats(...).save_pretrained`` wrote (see :mod:`kvroute.presses.scorers.local_weights`).
kvpress's ``dataset_name``, ``num_samples`` and ``sample_seq_len`` only name the hub repository, so
they are no parameters here; the scoring parameters are ExpectedAttentionPress's.
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
class ExpectedAttentionStatsScorer(LocalWeightsScorer):
    name: ClassVar[str] = "expected_attention_stats"
    description: ClassVar[str] = ("Expected attention of future queries from stored query statistics, times ||V|| "
                                  "(kvpress ExpectedAttentionStatsPress); statistics from a local folder: "
                                  "stats_folder=FOLDER.")
    press_cls: ClassVar[Any] = KvpressClass("ExpectedAttentionStatsPress")
    weights_param: ClassVar[str] = "stats_folder"
    holds: ClassVar[str] = "its query statistics"
    hub_copy: ClassVar[str] = "alessiodevoto/exp_att_stats_<model>_<dataset>_<num_samples>_<sample_seq_len>_<n_sink>"
    hub_only: ClassVar[tuple[str, ...]] = ("dataset_name", "num_samples", "sample_seq_len")
    min_tokens_param: ClassVar[str | tuple[str, ...] | None] = "n_sink"
    schema: ClassVar[dict[str, Param]] = {
        "stats_folder": Param(kind=str, why="the folder ExpectedAttentionStats.save_pretrained wrote"),
        "n_sink": Param(lo=0, why="a count of sink tokens"),
        "n_future_positions": Param(lo=1, why="the expectation averages over at least one future position"),
        "epsilon": Param(lo=0, why="a non-negative offset added to the scores")}

    def load(self, folder: Path) -> Any:
        from kvpress.presses.expected_attention_with_stats import ExpectedAttentionStats

        # strict: a checkpoint without the statistics fails here instead of leaving the zeros they start as
        stats = ExpectedAttentionStats.from_pretrained(folder, local_files_only=True, strict=True)
        return stats.query_mean.detach(), stats.query_cov.detach()  # [L, H, D], [L, H, D, D]

    @classmethod
    def save_random(cls, model: nn.Module, folder: Path, *, seed: int = 0, **params: Any) -> Path:
        """Random query means, and random positive semi-definite covariances."""
        from kvpress.presses.expected_attention_with_stats import ExpectedAttentionStats

        info = model_info(model)
        L, H, D = info.num_layers, info.num_heads, info.head_dim
        g = torch.Generator().manual_seed(seed)
        stats = ExpectedAttentionStats(num_layers=L, num_heads=H, head_dim=D, dataset_name="random",
                                       model_name=str(getattr(model.config, "name_or_path", "model")), num_samples=1,
                                       sample_seq_len=1, n_sink=int(params.get("n_sink", 4)))
        a = torch.randn(L, H, D, D, generator=g)
        stats.query_mean.data = torch.randn(L, H, D, generator=g)  # [L, H, D]
        stats.query_cov.data = a @ a.transpose(-1, -2) / D  # [L, H, D, D]
        stats.save_pretrained(folder)
        return folder

    def shape(self, weights: Any) -> str:
        mean, cov = weights
        return (f"[layers={mean.shape[0]}, query_heads={mean.shape[1]}, head_dim={mean.shape[2]}] (mean), "
                f"[{', '.join(str(n) for n in cov.shape)}] (covariance)")

    def model_shape(self, model: nn.Module) -> str:

        info = model_info(model)
        L, H, D = info.num_layers, info.num_heads, info.head_dim
        return f"[layers={L}, query_heads={H}, head_dim={D}] (mean), [{L}, {H}, {D}, {D}] (covariance)"

    def hold(self, press: Any, weights: Any) -> None:
        press.mu, press.cov = weights

    def fit(self, press: Any, model: nn.Module) -> None:
        # as ExpectedAttentionStatsPress.post_init_from_model does with what it loads
        m: Any = model
        press.mu = press.mu.to(m.device, dtype=m.dtype)
        press.cov = press.cov.to(m.device, dtype=m.dtype)
