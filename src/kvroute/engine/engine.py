"""The engine: one prefill per prompt, a KeepMask per (press, ratio) cell, batched masked decoding."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Protocol

from kvroute import heap
from kvroute.engine.cell import NO_PRESS, Cell
from kvroute.engine.decode import CellOutput, DecodeSettings, decode_cells
from kvroute.engine.prefill import PrefillCapture, PrefillResult, ScoreKey, ScoreRequest, prefill
from kvroute.engine.window import check_tokens
from kvroute.errors import CELL_ERRORS, EngineError, error_reason
from kvroute.presses import KeepMask, Press, build_press, check_ratio
from kvroute.presses.restore import Restore, consensus_positions, kv_pairs

if TYPE_CHECKING:
    from kvroute.models.loading import LoadedModel

log = logging.getLogger(__name__)

class PromptLike(Protocol):
    """What the engine reads from a prompt (kvroute.tasks.prompt.Prompt has these)."""

    @property
    def context_ids(self) -> Sequence[int]: ...  # the compressible prefix

    @property
    def question_ids(self) -> Sequence[int]: ...  # the uncompressed suffix


@dataclass
class EngineResult:
    prefill: PrefillResult
    cells: list[Cell]
    masks: list[KeepMask | None]  # None only for a cell in ``errors``
    outputs: list[CellOutput | None]  # None only for a cell in ``errors``
    full: CellOutput | None  # the uncompressed cache, decoded alongside (the metrics' reference) unless skipped
    full_mask: KeepMask
    # prefill, select (the keep masks), decode; scoring: the part of prefill spent in the scorers
    seconds: dict[str, float] = field(default_factory=dict)
    #: cell index -> the exception that left it out (one of :data:`kvroute.errors.CELL_ERRORS`)
    failures: dict[int, BaseException] = field(default_factory=dict)

    @property
    def errors(self) -> dict[int, str]:
        """Cell index -> the one-line reason it was left out (a record's ``error`` field)."""
        return {i: error_reason(e) for i, e in sorted(self.failures.items())}

    def raise_for_errors(self) -> EngineResult:
        """This result where every cell was computed; else the first failed cell's own exception (its type and
        message: an unknown press still names the closest ones), with a note naming the cell and how many failed."""
        if not self.failures:
            return self
        i = min(self.failures)
        e = self.failures[i]
        c = self.cells[i]
        at = f"{c.press}@{c.ratio:g}" + (f" restore={c.restore}" if c.restore else "")
        note = f"(cell {i}, {at}; {len(self.failures)} of {len(self.cells)} cells failed)"
        if note not in getattr(e, "__notes__", ()):  # raised again: noted once
            e.add_note(note)
        raise e


class Engine:
    """Runs cells for prompts on one loaded model.

    >>> engine = Engine(lm)                                           # doctest: +SKIP
    >>> res = engine.run(prompt, [Cell("snapkv", 0.5), Cell("expected_attention+adakv", 0.9)])  # doctest: +SKIP
    >>> res.outputs[0].text                                           # doctest: +SKIP
    """

    def __init__(self, lm: LoadedModel, settings: DecodeSettings = DecodeSettings(), *,
                 retrieval_heads: Sequence[tuple[int, int]] | None = None) -> None:
        self.lm = lm
        self.settings = settings
        #: the model's retrieval heads as (layer, query head) pairs, for ``restore=…@heads:retrieval`` (None: unknown)
        self.retrieval_heads = None if retrieval_heads is None else [(int(a), int(b)) for a, b in retrieval_heads]
        self._presses: dict[str, Press] = {}
        self._setup_done: set[int] = set()

    def press(self, spec: str) -> Press:
        if spec not in self._presses:
            p = build_press(spec)
            for scorer in (p.scorer, *p.selection.aux_scorers().values()):
                if id(scorer) not in self._setup_done:
                    scorer.setup(self.lm.model)
                    scorer.setup_tokenizer(self.lm.tokenizer)
                    self._setup_done.add(id(scorer))
            self._presses[spec] = p
        return self._presses[spec]

    def validate(self, cells: Sequence[Cell]) -> None:
        """Check names, ratios and restore conditions before any compute (unknown names raise with suggestions)."""
        for c in cells:
            check_ratio(c.ratio)
            if c.restore:
                Restore.parse(c.restore)
            if c.press != NO_PRESS:
                self.press(c.press)

    def check_memory(self, T: int, q: int, cells: int, *, tracks: int = 0, attention_map: bool = False,
                     score_sets: int = 1) -> None:
        """Refuse (InsufficientMemoryError, with the size needed) an instance of ``T`` context tokens, ``q``
        question and teacher-forced tokens and ``cells`` cells that the free memory would not hold beside the
        model even one cell at a time (kvroute.engine.plan)."""
        from kvroute.engine.attention.streaming import available_memory
        from kvroute.engine.plan import MemoryShape, check_instance

        check_instance(MemoryShape.of(self.lm.model), available=available_memory(self.lm.device), T=T, q=q,
                       new=self.settings.max_new_tokens, cells=cells, capture=self.settings.capture, tracks=tracks,
                       attention_map=attention_map, score_sets=max(score_sets, 1))

    def _requests(self, cells: Sequence[Cell], skip: Mapping[int, object] | None = None,
                  ) -> tuple[list[ScoreRequest], dict[int, ScoreKey], dict[int, dict[str, ScoreKey]]]:
        """The prefill's score requests (equal ones shared), each cell's key, and each cell's aux keys by name."""
        skip = skip or {}
        reqs: dict[ScoreKey, ScoreRequest] = {}
        cell_key: dict[int, ScoreKey] = {}
        aux_keys: dict[int, dict[str, ScoreKey]] = {}
        for i, c in enumerate(cells):
            if c.press == NO_PRESS or c.ratio == 0 or i in skip:
                continue
            p = self.press(c.press)
            req = ScoreRequest.for_press(p, c.ratio)
            reqs.setdefault(req.key, req)
            cell_key[i] = req.key
            for name, scorer in p.selection.aux_scorers().items():  # e.g. CriticalKV's value projections
                aratio = c.ratio if scorer.ratio_dependent else None
                akey = ScoreKey(str(scorer.spec()), None, aratio)
                reqs.setdefault(akey, ScoreRequest(akey, scorer, None, aratio))
                aux_keys.setdefault(i, {})[name] = akey
        return list(reqs.values()), cell_key, aux_keys

    @heap.retaining(lambda self: self.lm.device)  # the forwards' freed tensors reused in place (kvroute.heap)
    def run(self, prompt: PromptLike, cells: Sequence[Cell], *, gold_ids: Sequence[int] | None = None,
            evidence: Sequence[int] | None = None, track: Mapping[str, Sequence[int]] | None = None, seed: int = 0,
            answer: Sequence[int] | None = None, distractors: Sequence[Sequence[int]] = (),
            captures: Sequence[PrefillCapture] = (), decode_full: bool = True,
            lens_ids: Sequence[int] | None = None, lens_seqs: Sequence[Sequence[int]] | None = None,
            question_window: int = 0, prefilled: PrefillResult | None = None) -> EngineResult:
        """Prefill ``prompt.context_ids`` once, then decode every cell (plus the full cache) in batches.

        ``decode_full=False`` skips the full-cache reference when no cell keeps everything (answers
        only, no metrics); ``EngineResult.full`` is then None.

        ``evidence``: evidence token positions inside the context (needed by oracle controls); ``answer``: the
        answer's token positions there (needed by cells with a ``restore`` condition); ``distractors``: per
        occurrence of a distractor value in the context, its token positions (``restore=distractor``);
        ``track``: named sets of prompt positions whose attention mass from each generated token is
        recorded; ``gold_ids``: the gold answer's tokens, teacher-forced for its log-probability;
        ``lens_ids``: tokens whose per-layer logit lens at the last prompt token is recorded;
        ``lens_seqs``: token sequences whose per-layer lens log-likelihood after the prompt is recorded;
        ``question_window``: the question's tokens at the end of the context (question-aware regime;
        ``Prompt.question_window``), read by scorers that score by the question (finch).

        Per-cell errors are returned, not raised: a cell that fails with one of :data:`kvroute.errors.CELL_ERRORS`
        (its name, ratio or restore condition, its press's precondition or scoring, its mask, its decode) is left
        out — ``result.failures[i]`` holds the exception and ``result.errors[i]`` its one-line reason,
        ``masks[i]`` and ``outputs[i]`` are None — and every other cell is computed;
        ``result.raise_for_errors()`` raises the first instead. Errors of the prompt itself (too long, empty, the
        full-cache decode) raise.

        ``prefilled``: the result of an earlier run on the same context (``EngineResult.prefill``), whose
        cache and scores serve these cells without a new prefill — a later turn of a conversation asks its
        question after the same compressed context (kvroute.runner.run_conversation). It must hold every
        score these cells need (run the first turn with all of them); ``captures`` are prefill-time and
        cannot be given with it.
        """
        cells = list(cells)
        failures: dict[int, BaseException] = {}  # cell index -> why it is left out
        for i, c in enumerate(cells):
            try:
                self.validate([c])
            except CELL_ERRORS as e:
                failures[i] = e
        ctx_ids, q_ids = list(prompt.context_ids), list(prompt.question_ids)
        T = len(ctx_ids)
        # the answer part: generated tokens, or a longer teacher-forced gold or lens sequence
        check_tokens(self.lm, T + len(q_ids), max(self.settings.max_new_tokens, len(gold_ids or []),
                                                  max((len(x) for x in lens_seqs or ()), default=0)))
        if T == 0:
            raise EngineError("the compressible part of the prompt is empty")
        requests, cell_key, aux_keys = self._requests(cells, failures)
        failed: dict[ScoreKey, BaseException] = {}  # score request key -> why its cells are left out
        for r in requests:
            try:
                self._check_request(r, T, evidence, question_window)
            except CELL_ERRORS as e:
                failed[r.key] = e
        requests = [r for r in requests if r.key not in failed]
        self.check_memory(T, len(q_ids) + len(gold_ids or []), len(cells) + 1, tracks=len(track or {}),
                          attention_map=any(r.scorer.needs_attentions for r in requests), score_sets=len(requests))
        ev = [p for p in (evidence or []) if 0 <= p < T]
        t0 = time.perf_counter()
        if prefilled is None:
            pre = prefill(self.lm.model, ctx_ids, requests, evidence=ev if ev else None, seed=seed, captures=captures,
                          errors=failed, question_window=question_window)
        else:
            pre = self._reuse(prefilled, ctx_ids, captures)
            failed.update({r.key: EngineError(f"the earlier prefill holds no scores for {r.key.scorer}: prefill once "
                                               "with every cell the later runs decode")
                           for r in requests if r.key not in pre.scores})  # its scoring failed on that prefill
        t1 = time.perf_counter()
        for i, key in cell_key.items():  # a cell whose score request or one of its aux requests failed
            why = next((failed[k] for k in (key, *aux_keys.get(i, {}).values()) if k in failed), None)
            if why is not None:
                failures.setdefault(i, why)
        L, Hkv = len(pre.keys), pre.keys[0].shape[1]
        full = KeepMask.full(L, Hkv, T, device=pre.keys[0].device)
        consensus = self._consensus_once(full)
        masks: list[KeepMask | None] = [None] * len(cells)
        for i, c in enumerate(cells):
            if i in failures:
                continue
            try:
                masks[i] = self._mask(c, cell_key.get(i), pre, aux_keys.get(i, {}), full, q_ids,
                                      answer=answer or [], ev=ev, seed=seed, consensus=consensus,
                                      distractors=distractors)
            except CELL_ERRORS as e:
                failures[i] = e
        t2 = time.perf_counter()
        # cells whose mask keeps everything (ratio 0, "none") share the full-cache decode
        todo = [i for i in range(len(cells)) if i in cell_key and i not in failures]
        with_full = decode_full or any(i not in cell_key and i not in failures for i in range(len(cells)))
        lead = [full] if with_full else []
        kw: dict[str, Any] = dict(gold_ids=gold_ids, track=track, lens_ids=lens_ids, lens_seqs=lens_seqs)
        try:
            outs = self._decode_with_full(pre, q_ids, lead, [m for i in todo if (m := masks[i]) is not None], full,
                                          **kw)
        except CELL_ERRORS:
            outs = self._decode_isolated(pre, q_ids, lead, masks, todo, failures, **kw)
            todo = [i for i in todo if i not in failures]
        full_out = outs[0] if with_full else None
        by_cell = dict(zip(todo, outs[len(lead):], strict=True))
        t3 = time.perf_counter()
        outputs = [None if i in failures else by_cell[i] if i in by_cell else full_out for i in range(len(cells))]
        # cells outside `todo` keep everything, and then the full cache was decoded
        if sum(o is not None for o in outputs) + len(failures) != len(cells):  # pragma: no cover - internal invariant
            raise EngineError("internal error: a full-cache cell was not decoded")
        return EngineResult(pre, cells, masks, outputs, full_out, full,
                            {"prefill": t1 - t0 if prefilled is None else 0.0, "scoring": pre.score_seconds,
                             "select": t2 - t1, "decode": t3 - t2},
                            failures=failures)

    @staticmethod
    def _check_request(r: ScoreRequest, T: int, evidence: Sequence[int] | None, question_window: int) -> None:
        """Raise where a score request cannot run on this prompt (its cells are then left out)."""
        r.scorer.check(T)
        if r.scorer.needs_evidence and not evidence:
            raise EngineError(f"{r.scorer.name} needs evidence positions; this prompt has none")
        if r.scorer.needs_question_window and not 0 < question_window < T:
            raise EngineError(f"{r.scorer.name} scores the context by the question's attention, so the question "
                              "must be inside the compressed prefix: use the question-aware regime "
                              "(--question-aware, or regimes = [\"aware\"] in a sweep config)")

    def _mask(self, c: Cell, key: ScoreKey | None, pre: PrefillResult, aux_keys: Mapping[str, ScoreKey],
              full: KeepMask, q_ids: list[int], *, answer: Sequence[int], ev: Sequence[int], seed: int,
              consensus: Callable[[PrefillResult, list[int]], list[int]],
              distractors: Sequence[Sequence[int]]) -> KeepMask:
        """Cell ``c``'s keep mask: its press's selection from the prefill's scores (``key``; None where the cell
        keeps everything and shares the full-cache decode, which a restore does not change), then its restore."""
        if key is None:
            mask = KeepMask(full.mask, c.press, c.ratio)
        else:
            aux = {name: pre.scores[k] for name, k in aux_keys.items()}
            mask = self.press(c.press).keep_mask(pre.scores[key], c.ratio, aux, self.lm.info.compressed_layers)
        if c.restore:
            cond = Restore.parse(c.restore)
            restored = cond.apply(mask, list(answer), list(ev), seed=seed,
                                  consensus=consensus(pre, q_ids) if cond.target == "consensus" else None,
                                  retrieval=self._retrieval_kv() if cond.needs_retrieval_heads else None,
                                  distractors=distractors)
            mask = restored if key is not None else mask
        return mask

    @staticmethod
    def _reuse(pre: PrefillResult, ctx_ids: list[int], captures: Sequence[PrefillCapture]) -> PrefillResult:
        """``pre`` checked to serve a run on ``ctx_ids`` (EngineError naming what differs), its times zeroed."""
        if captures:
            raise EngineError("prefill captures need a prefill; a run on an earlier prefill cannot take them")
        if pre.context_ids.tolist() != ctx_ids:
            raise EngineError(f"the earlier prefill is of another context ({pre.num_tokens} tokens, this prompt's "
                              f"{len(ctx_ids)}): a conversation's turns must share their context tokens")
        return replace(pre, seconds=0.0, score_seconds=0.0)

    def _decode(self, pre: PrefillResult, q_ids: list[int], masks: list[KeepMask], *, lean: bool = False,
                **kw: Any) -> list[CellOutput]:
        """``decode_cells`` with this engine's settings; ``lean``: tokens only (no captures)."""
        settings = replace(self.settings, capture=False, keep_logits=False) if lean else self.settings
        return decode_cells(self.lm.model, self.lm.tokenizer, pre, q_ids, masks, settings=settings, **kw)

    def _retrieval_kv(self) -> list[tuple[int, int]] | None:
        """The retrieval heads as the (layer, KV head) pairs a keep mask addresses."""
        if self.retrieval_heads is None:
            return None
        info = self.lm.info
        return kv_pairs(self.retrieval_heads, info.num_heads, info.num_kv_heads)

    def _consensus_once(self, full: KeepMask) -> Callable[[PrefillResult, list[int]], list[int]]:
        """A function giving the full cache's consensus position of each layer (for ``restore=consensus``),
        computed on first use from one question forward of the full cache with its attention captured."""
        memo: list[list[int]] = []

        def get(pre: PrefillResult, q_ids: list[int]) -> list[int]:
            if not memo:
                settings = replace(self.settings, capture=True, max_new_tokens=1, keep_logits=False, batch_size=1,
                                   draft=False)
                out = decode_cells(self.lm.model, None, pre, q_ids, [full], settings=settings)[0]
                assert out.last_attention is not None
                memo.append(consensus_positions(out.last_attention, pre.num_tokens))
            return memo[0]

        return get

    def _decode_with_full(self, pre: PrefillResult, q_ids: list[int], lead: list[KeepMask], masks: list[KeepMask],
                          full: KeepMask, **kw: Any) -> list[CellOutput]:
        """The outputs of ``lead`` (the full cache, when asked) and the cells' ``masks``, in that order.

        With draft verification on (``DecodeSettings.draft``), the full cache is decoded first and its answer is
        the cells' draft (:func:`kvroute.engine.decode.decode_cells`); without a full-cache reference asked for,
        it is decoded for its tokens only (no captures) and not returned."""
        if not (masks and self.settings.draft and not self.settings.keep_generated_rows):
            return self._decode(pre, q_ids, lead + masks, **kw)
        first = self._decode(pre, q_ids, lead, **kw) if lead else self._decode(pre, q_ids, [full], lean=True)
        return (first if lead else []) + self._decode(pre, q_ids, masks, draft=first[0].tokens, **kw)

    def _decode_isolated(self, pre: PrefillResult, q_ids: list[int], lead: list[KeepMask],
                         masks: Sequence[KeepMask | None], todo: Sequence[int], failures: dict[int, BaseException],
                         **kw: Any) -> list[CellOutput]:
        """After a batch failed: the full cache alone (its failure is the prompt's), then each cell alone."""
        outs = self._decode(pre, q_ids, lead, **kw) if lead else []
        draft = outs[0].tokens if outs else None
        for i in todo:
            m = masks[i]
            try:
                if m is None:  # pragma: no cover - internal invariant
                    raise EngineError("internal error: a cell to decode has no mask")
                outs.extend(self._decode(pre, q_ids, [m], draft=draft, **kw))
            except CELL_ERRORS as e:
                failures[i] = e
        return outs
