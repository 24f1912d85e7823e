"""What a decoding batch captures from its attention for the metrics: buffers and the observers that fill them.

:class:`Observers` is registered on a batch's :class:`~kvroute.engine.attention.MaskedContext` from what the settings
ask for, and only that, so the masked attention computes no capture nobody reads:

- the question forward: the last prompt token's rows (``CellOutput.last_attention``), ``on_probs`` for query ``Q - 1``
  (one row of the forward's Q + G: the other queries run on the fast backend, the row is computed beside it);
- every generated token fed back (decode steps, a draft forward): the probability mass on each tracked position set
  (``generated_mass``) through ``on_masses``, which needs the scores at those positions only (a fast backend's
  log-sum-exp gives the normaliser), and, where asked, the whole rows through ``on_probs``: their context argmax
  (``generated_argmax``) and the rows themselves (``generated_rows``, float16). Whole rows of every query keep such a
  forward on the ``reference`` backend (kvroute.engine.attention.forward.choose).

The decode loop (:func:`kvroute.engine.decode.decode_cells`) sets :attr:`Observers.rows`, :attr:`Observers.fed` and
:attr:`Observers.forward` as cells advance and leave the batch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

import torch

from kvroute.errors import EngineError

if TYPE_CHECKING:
    from kvroute.engine.attention import MaskedContext


class CellCaptures(Protocol):
    """The fields of a cell's output the observers fill (:class:`kvroute.engine.decode.CellOutput` has them)."""

    tokens: list[int]
    last_attention: torch.Tensor | None
    hidden: torch.Tensor | None
    generated_mass: dict[str, torch.Tensor]
    generated_rows: list[torch.Tensor] | None
    generated_argmax: torch.Tensor | None


class Observers:
    """One decoding batch's capture buffers (B cells, L layers, H query heads, T context and Q question tokens, at
    most ``new`` generated tokens), for the captures ``DecodeSettings`` asks: ``capture`` (the last prompt token's
    rows and hidden states, the masses on the ``track`` sets), ``argmax`` and ``keep_rows`` (keep_generated_rows)."""

    def __init__(self, B: int, L: int, H: int, T: int, Q: int, track: Mapping[str, torch.Tensor],
                 device: torch.device, *, new: int, capture: bool, argmax: bool, keep_rows: bool) -> None:
        self.L, self.T, self.Q = L, T, Q
        self.capture = capture
        self.track = dict(track)  # name -> int64 positions into the prompt (context, then question)
        #: per active batch row, its cell; per active row, the generated tokens already fed back (the generated-token
        #: index of a forward's first query); the decode forwards so far (-1: the question forward)
        self.rows = torch.arange(B, device=device)
        self.fed = torch.zeros(B, dtype=torch.long, device=device)
        self.forward = -1
        # the last prompt token's attention rows, written layer by layer into one buffer (no second copy to stack)
        self.last = torch.empty(B, L, H, T + Q, device=device) if self.capture else None
        self.seen: set[int] = set()
        self.mass = {k: torch.zeros(B, new, L, H, device=device) for k in self.track}  # name -> [B, steps, L, H]
        self.argmax = torch.zeros(B, new, L, H, dtype=torch.long, device=device) if argmax else None
        self.keep_rows = keep_rows
        self.steps_rows: list[list[torch.Tensor | None]] = []  # per decode step, per layer [b, H, T + s] float16

    def question(self, ctx: MaskedContext) -> None:
        """Register for the question forward: the row of its last prompt token."""
        ctx.on_probs = self._on_last if self.capture else None
        ctx.on_masses, ctx.mass_sets = None, ()
        ctx.capture_query = self.Q - 1

    def generated(self, ctx: MaskedContext) -> None:
        """Register for the forwards that feed generated tokens back: what the settings ask of each such token."""
        rows = self.capture and (self.argmax is not None or self.keep_rows)
        ctx.on_probs = self._on_rows if rows else None
        masses = self.capture and bool(self.track)
        ctx.on_masses, ctx.mass_sets = (self._on_masses, tuple(self.track.values())) if masses else (None, ())

    def _on_last(self, layer: int, row: torch.Tensor, query: int) -> None:  # row [B, H, T + s] float32
        assert self.last is not None
        self.last[:, layer] = row[..., : self.T + self.Q]
        self.seen.add(layer)

    def _on_masses(self, layer: int, masses: torch.Tensor, query: int) -> None:  # masses [b, H, n], one query per cell
        steps = self.fed + query  # per active row: the generated token this query is
        for k, name in enumerate(self.track):
            self.mass[name][self.rows, steps, layer] = masses[..., k]  # [b, H]

    def _on_rows(self, layer: int, row: torch.Tensor, query: int) -> None:  # row [b, H, T + s] float32
        steps = self.fed + query
        if self.argmax is not None:
            self.argmax[self.rows, steps, layer] = row[..., : self.T].argmax(-1)  # [b, H]
        if self.keep_rows:
            self.steps_rows[self.forward][layer] = row.half()

    def question_done(self, results: Sequence[CellCaptures], hidden_states: Sequence[torch.Tensor]) -> None:
        """After the question forward: each cell's last prompt token's rows and hidden states ``[L + 1, hidden]``."""
        if not self.capture:
            return
        hs = torch.stack([h[:, self.Q - 1] for h in hidden_states], dim=1)  # [B, L + 1, hidden]
        if missing := sorted(set(range(self.L)) - self.seen):
            raise EngineError(f"the masked attention reported no probabilities for layers {missing}")
        assert self.last is not None
        for b, r in enumerate(results):
            r.last_attention, r.hidden = self.last[b], hs[b].float()

    def step(self) -> None:
        """Before a decode step's forward (``forward`` already advanced)."""
        if self.keep_rows:
            self.steps_rows.append([None] * self.L)

    def step_done(self, results: Sequence[CellCaptures]) -> None:
        """After a decode step's forward: the active cells' whole rows of the token fed, where they are kept."""
        if not self.keep_rows:
            return
        missing = [i for i, t in enumerate(self.steps_rows[self.forward]) if t is None]
        if missing:
            raise EngineError(f"the masked attention reported no probabilities for layers {missing}")
        stacked = torch.stack([t for t in self.steps_rows[self.forward] if t is not None], dim=1)  # [b, L, H, K]
        for j, r in enumerate(self.rows.tolist()):
            if results[r].generated_rows is None:
                results[r].generated_rows = []
            results[r].generated_rows.append(stacked[j])

    def done(self, results: Sequence[CellCaptures]) -> None:
        """After the batch: each cell's generated-token masses and argmax, one per generated token fed back."""
        for b, r in enumerate(results):
            n = max(len(r.tokens) - 1, 0)  # generated tokens that were fed back in
            if self.capture and self.track:
                r.generated_mass = {k: v[b, :n].clone() for k, v in self.mass.items()}
            if self.argmax is not None:
                r.generated_argmax = self.argmax[b, :n].clone()


def positions(track: Mapping[str, Sequence[int]], device: torch.device) -> dict[str, torch.Tensor]:
    """The tracked position sets as int64 tensors on ``device``."""
    return {k: torch.as_tensor(list(v), dtype=torch.long, device=device) for k, v in track.items()}
