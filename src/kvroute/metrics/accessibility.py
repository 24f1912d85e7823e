"""Accessibility: can attention still reach the evidence?

- evidence (answer) attention mass: attention from the last prompt token onto T_ev (T_ans), per
  layer and query head, compressed and full cache; also from each generated token;
- direct reachability: some (layer, query head) gives a *kept* evidence token attention above ε;
- routed reachability: the same through any kept token that carries evidence content, where a
  token's evidence content at layer ℓ is its share under attention rollout over the prefill
  (Abnar & Zuidema, with the residual: r⁽ℓ⁺¹⁾ = ½ r⁽ℓ⁾ + ½ Ā⁽ℓ⁾ r⁽ℓ⁾, Ā the head-averaged causal
  attention, r⁽⁰⁾ = 1 on evidence tokens). This catches answers that survive through information
  the prefill already copied into other tokens ("leakage") when the evidence itself is evicted.

ε is relative: ``κ / n_visible`` (n_visible = keys the head can see: kept context + suffix), i.e.
κ times what uniform attention would give; κ = 5 by default. A kept token carries evidence when its
rollout share is at least τ (default ½) times the largest share among the evidence tokens.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from kvroute.metrics.base import CellContext, Metric, register
from kvroute.models.queries import rotated_queries


class EvidenceRollout:
    """Prefill capture: evidence share ``r[ℓ, t]`` of every context token's input to layer ℓ.

    Memory is linear in T: the head-averaged attention is applied to the vector r as the values of a
    fused attention call, never materialising the T×T map; the queries are the ones the model
    computed in the prefill (handed over by the prefill's ``q_proj`` hook).
    """

    def __init__(self, evidence: list[int], num_tokens: int) -> None:
        self.r = torch.zeros(num_tokens)
        if evidence:
            self.r[evidence] = 1.0
        self.rows: list[torch.Tensor] = []

    def on_layer(self, layer_idx: int, module: Any, hidden_states: torch.Tensor, keys: torch.Tensor,
                 values: torch.Tensor, kwargs: dict[str, Any], queries: torch.Tensor | None = None) -> None:
        r = self.r.to(keys.device)
        self.rows.append(r.cpu().clone())  # share in the input of layer `layer_idx`
        T = hidden_states.shape[1]
        q = queries if queries is not None else rotated_queries(module, hidden_states, kwargs["position_embeddings"])
        H, Hkv = q.shape[1], keys.shape[1]
        # Ā r with Ā the head-averaged causal attention: attention whose values are r, averaged over heads.
        # r sits in column 0 of values as wide as the queries: with a narrower value head the CPU kernel
        # falls back to the math path and materialises the T×T map (10x slower and quadratic memory at 4k)
        D = q.shape[-1]
        v = torch.zeros(1, Hkv, T, D, dtype=torch.float32, device=keys.device)
        v[..., 0] = r.float()
        mixed = F.scaled_dot_product_attention(q.float(), keys.float(), v, is_causal=True, scale=module.scaling,
                                               enable_gqa=H != Hkv)  # [1, H, T, D]
        self.r = (0.5 * r + 0.5 * mixed[..., 0].mean(dim=1)[0]).cpu()

    def shares(self) -> torch.Tensor:
        """``[L, T]``: evidence share of each token's input to each layer."""
        return torch.stack(self.rows)


def visible_threshold(ctx: CellContext) -> torch.Tensor:
    """ε per (layer, query head) ``[L, H]``: κ / (kept context entries of the head's KV head + suffix keys)."""
    kept = ctx.mask.kept_per_head.repeat_interleave(ctx.group_size, dim=1)  # [L, H]
    suffix = ctx.output.last_attention.shape[-1] - ctx.T  # question tokens visible to the last prompt token
    return ctx.settings.reach_kappa / (kept + suffix).clamp(min=1).float()


def mass(attn_row: torch.Tensor, positions: list[int]) -> torch.Tensor:
    """``[L, H]`` attention mass onto ``positions`` from rows ``[L, H, K]``."""
    if not positions:
        return torch.zeros(attn_row.shape[:2])
    return attn_row[..., positions].sum(-1)


@register
class Accessibility(Metric):
    name = "accessibility"
    needs = frozenset({"attention"})
    fields = ("evidence_attention_mass", "evidence_attention_mass_full", "answer_attention_mass",
              "answer_attention_mass_full", "evidence_mass_layer", "evidence_mass_layer_full", "reachable",
              "generated_evidence_mass")

    def compute(self, ctx: CellContext) -> dict[str, Any]:
        ev = ctx.context_positions(ctx.prompt.evidence_positions)
        ans = ctx.context_positions(ctx.prompt.answer_positions)
        a, f = ctx.output.last_attention, ctx.full.last_attention  # [L, H, T+Q]
        if not ev:
            return {k: None for k in self.fields}
        m_ev, f_ev = mass(a, ev), mass(f, ev)  # [L, H]
        eps = visible_threshold(ctx)  # [L, H]
        reach = bool((a[..., ev].max(-1).values > eps.to(a.device)).any())
        gen = ctx.output.generated_mass.get("evidence")
        return {
            "evidence_attention_mass": float(m_ev.mean()),
            "evidence_attention_mass_full": float(f_ev.mean()),
            "answer_attention_mass": float(mass(a, ans).mean()) if ans else None,
            "answer_attention_mass_full": float(mass(f, ans).mean()) if ans else None,
            "evidence_mass_layer": m_ev.mean(1).tolist(),
            "evidence_mass_layer_full": f_ev.mean(1).tolist(),
            "reachable": reach,
            "generated_evidence_mass": float(gen.mean()) if gen is not None and gen.numel() else None,
        }


@register
class RoutedReachability(Metric):
    name = "routes"
    needs = frozenset({"attention", "routes"})
    fields = ("routed_reachable", "routed_evidence_mass")

    def compute(self, ctx: CellContext) -> dict[str, Any]:
        ev = ctx.context_positions(ctx.prompt.evidence_positions)
        if not ev or ctx.evidence_share is None:
            return {"routed_reachable": None, "routed_evidence_mass": None}
        T = ctx.T
        share = ctx.evidence_share  # [L, T]
        best = share[:, ev].max(dim=1, keepdim=True).values.clamp(min=1e-12)  # [L, 1]
        carries = share >= ctx.settings.route_tau * best  # [L, T]
        a = ctx.output.last_attention[..., :T]  # [L, H, T]; evicted entries have exactly 0
        eps = visible_threshold(ctx)  # [L, H]
        hit = (a > eps[..., None]) & carries[:, None, :]  # [L, H, T]
        routed = (a * share[:, None, :]).sum(-1)  # [L, H]: evidence content read through all kept entries
        return {"routed_reachable": bool(hit.any()), "routed_evidence_mass": float(routed.mean())}
