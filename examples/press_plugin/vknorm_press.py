"""An example press of your own: a kvpress ScorerPress in a few lines, usable by kvroute unchanged."""

from dataclasses import dataclass
from typing import ClassVar

import torch
from kvpress import ScorerPress


@dataclass
class ValueKeyNormPress(ScorerPress):
    """Keep entries whose value is large and whose key is small: score = ||v|| - alpha * ||k||."""

    alpha: float = 1.0  # a dataclass field is a parameter: vknorm[alpha=0.5]

    # Optional hints for kvroute (the keywords of kvroute's kvpress_scorer). score() never reads
    # compression_ratio, so one scoring serves every ratio; without this kvroute scores once per ratio.
    kvroute_options: ClassVar[dict] = {"ratio_dependent": False}

    def score(self, module, hidden_states, keys, values, attentions, kwargs) -> torch.Tensor:
        dtype = torch.promote_types(keys.dtype, torch.float32)  # norms in float32: bf16 would tie scores
        v = torch.linalg.vector_norm(values, dim=-1, dtype=dtype)  # [B, Hkv, T]
        k = torch.linalg.vector_norm(keys, dim=-1, dtype=dtype)  # [B, Hkv, T]
        return v - self.alpha * k
