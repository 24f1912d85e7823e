"""The engine: one prefill per prompt, a KeepMask per (press, ratio) cell, batched masked decoding."""

from __future__ import annotations

import logging
import time
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from kvroute.engine.decode import CellOutput, DecodeSettings, decode_cells
from kvroute.engine.prefill import PrefillCapture, PrefillResult, ScoreRequest, prefill
from kvroute.errors import EngineError, PromptTooLongError
from kvroute.presses import KeepMask, Press, build_press, check_ratio

log = logging.getLogger(__name__)

NO_PRESS = "none"


class PromptLike(Protocol):
    """What the engine reads from a prompt (kvroute.tasks.prompt.Prompt has these)."""

    @property
    def context_ids(self) -> Sequence[int]: ...  # the compressible prefix

    @property
    def question_ids(self) -> Sequence[int]: ...  # the uncompressed suffix


@dataclass(frozen=True)
class Cell:
    """One (press, ratio) perturbation of a prompt's cache. ``press="none"`` is the full cache."""

    press: str
    ratio: float


@dataclass
class EngineResult:
    prefill: PrefillResult
    cells: list[Cell]
    masks: list[KeepMask]
    outputs: list[CellOutput]
    full: CellOutput | None  # the uncompressed cache, decoded alongside (the metrics' reference) unless skipped
    full_mask: KeepMask
    seconds: dict[str, float] = field(default_factory=dict)


class Engine:
    """Runs cells for prompts on one loaded model.

    >>> engine = Engine(lm)                                           # doctest: +SKIP
    >>> res = engine.run(prompt, [Cell("snapkv", 0.5), Cell("expected_attention+adakv", 0.9)])  # doctest: +SKIP
    >>> res.outputs[0].text                                           # doctest: +SKIP
    """

    def __init__(self, lm: Any, settings: DecodeSettings = DecodeSettings()) -> None:
        self.lm = lm
        self.settings = settings
        self._presses: dict[str, Press] = {}
        self._setup_done: set[int] = set()

    def press(self, spec: str) -> Press:
        if spec not in self._presses:
            p = build_press(spec)
            if id(p.scorer) not in self._setup_done:
                p.scorer.setup(self.lm.model)
                self._setup_done.add(id(p.scorer))
            self._presses[spec] = p
        return self._presses[spec]

    def validate(self, cells: Sequence[Cell]) -> None:
        """Check names and ratios before any compute (unknown names raise with suggestions)."""
        for c in cells:
            check_ratio(c.ratio)
            if c.press != NO_PRESS:
                self.press(c.press)

    def _requests(self, cells: Sequence[Cell]) -> tuple[list[ScoreRequest], dict[int, Hashable]]:
        reqs: dict[Hashable, ScoreRequest] = {}
        cell_key: dict[int, Hashable] = {}
        for i, c in enumerate(cells):
            if c.press == NO_PRESS or c.ratio == 0:
                continue
            p = self.press(c.press)
            variant = p.selection.score_variant()
            ratio = c.ratio if p.scorer.ratio_dependent else None
            key = (str(p.scorer.spec()), variant, ratio)
            reqs.setdefault(key, ScoreRequest(key, p.scorer, variant, ratio))
            cell_key[i] = key
        return list(reqs.values()), cell_key

    def run(self, prompt: PromptLike, cells: Sequence[Cell], *, gold_ids: Sequence[int] | None = None,
            evidence: Sequence[int] | None = None, track: Mapping[str, Sequence[int]] | None = None, seed: int = 0,
            captures: Sequence[PrefillCapture] = (), decode_full: bool = True) -> EngineResult:
        """Prefill ``prompt.context_ids`` once, then decode every cell (plus the full cache) in batches.

        ``decode_full=False`` skips the full-cache reference when no cell keeps everything (answers
        only, no metrics); ``EngineResult.full`` is then None.

        ``evidence``: evidence token positions inside the context (needed by oracle controls);
        ``track``: named sets of prompt positions whose attention mass from each generated token is
        recorded; ``gold_ids``: the gold answer's tokens, teacher-forced for its log-probability.
        """
        cells = list(cells)
        self.validate(cells)
        ctx_ids, q_ids = list(prompt.context_ids), list(prompt.question_ids)
        T = len(ctx_ids)
        total = T + len(q_ids) + max(self.settings.max_new_tokens, len(gold_ids or []))
        window = self.lm.info.context_window
        if window and total > window:
            raise PromptTooLongError(
                f"prompt of {T + len(q_ids)} tokens plus {self.settings.max_new_tokens} new tokens exceeds "
                f"{self.lm.name}'s context window of {window}"
            )
        if T == 0:
            raise EngineError("the compressible part of the prompt is empty")
        requests, cell_key = self._requests(cells)
        for r in requests:
            r.scorer.check(T)
            if r.scorer.needs_evidence and not evidence:
                raise EngineError(f"{r.scorer.name} needs evidence positions; this prompt has none")
        ev = [p for p in (evidence or []) if 0 <= p < T]
        t0 = time.perf_counter()
        pre = prefill(self.lm.model, ctx_ids, requests, evidence=ev if ev else None, seed=seed, captures=captures)
        t1 = time.perf_counter()
        L, Hkv = len(pre.keys), pre.keys[0].shape[1]
        full = KeepMask.full(L, Hkv, T, device=pre.keys[0].device)
        masks = []
        for i, c in enumerate(cells):
            if i not in cell_key:
                masks.append(KeepMask(full.mask, c.press if c.press != NO_PRESS else NO_PRESS, c.ratio))
            else:
                masks.append(self.press(c.press).keep_mask(pre.scores[cell_key[i]], c.ratio))
        t2 = time.perf_counter()
        # cells whose mask keeps everything (ratio 0, "none") share the full-cache decode
        todo = [i for i in range(len(cells)) if i in cell_key]
        with_full = decode_full or len(todo) < len(cells)
        lead = [full] if with_full else []
        outs = decode_cells(self.lm.model, self.lm.tokenizer, pre, q_ids, lead + [masks[i] for i in todo],
                            gold_ids=gold_ids, track=track, settings=self.settings)
        full_out = outs[0] if with_full else None
        by_cell = dict(zip(todo, outs[len(lead):], strict=True))
        t3 = time.perf_counter()
        outputs = [by_cell[i] if i in by_cell else full_out for i in range(len(cells))]
        # cells outside `todo` keep everything, and then the full cache was decoded
        done = [o for o in outputs if o is not None]
        if len(done) != len(cells):  # pragma: no cover - internal invariant
            raise EngineError("internal error: a full-cache cell was not decoded")
        return EngineResult(pre, cells, masks, done, full_out, full,
                            {"prefill": t1 - t0, "select": t2 - t1, "decode": t3 - t2})
