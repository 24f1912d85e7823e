"""One task instance through the engine and the metrics: the unit of work of `run` and `sweep`."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from kvroute.engine.cell import NO_PRESS, Cell
from kvroute.engine.engine import Engine, EngineResult
from kvroute.engine.window import check_chars
from kvroute.errors import CELL_ERRORS, ConfigError, InsufficientMemoryError, error_reason
from kvroute.metrics import METRICS, CellContext
from kvroute.metrics.accessibility import EvidenceRollout, document_range
from kvroute.metrics.representation import answer_candidates
from kvroute.presses import build_press
from kvroute.settings import RunSettings
from kvroute.tasks.conversation import TURN_REGIME, conversation_prompt
from kvroute.tasks.instance import IDK
from kvroute.tasks.prompt import REGIMES, answer_ids, build_prompt

if TYPE_CHECKING:
    from kvroute.engine.prefill import PrefillResult
    from kvroute.tasks.instance import TaskInstance
    from kvroute.tasks.prompt import Prompt

log = logging.getLogger(__name__)

ABSTAIN_GOLD = IDK  # the gold of an unanswerable item


def task_fields(instance: TaskInstance, prompt: Prompt | None) -> dict[str, Any]:
    """The instance's tags for its records; ``prompt`` None when the prompt itself could not be built."""
    located = prompt is not None and bool(prompt.answer_positions)
    return {
        "instance_id": instance.id, "family": instance.family, "answer_type": instance.answer_type,
        "question_type": instance.question_type, "unanswerable": instance.unanswerable,
        "context_tokens": prompt.n_context if prompt is not None else None,
        "difficulty": instance.meta.get("difficulty"),
        "gold": list(instance.answers),
        # "none" when no answer occurrence could be located in the context (imported data): GER is undefined
        "evidence": "none" if (instance.meta.get("evidence") == "none" or not located)
        and not instance.unanswerable else "located",
        "depth": instance.meta.get("depth"),
        "target_length": instance.meta.get("target_length") or instance.meta.get("target_tokens"),
    }


def gold_ids(tokenizer: Any, instance: TaskInstance, prompt: Prompt) -> list[int]:
    """The gold answer's tokens as the model would write them after ``prompt`` (teacher-forced for gold_logprob).

    Its natural continuation (:func:`kvroute.tasks.prompt.answer_ids`): after the prompt's chat
    template, system prompt and answer prefix, with the leading space ("ĠPellmarsh"), not the gold
    tokenised on its own.
    """
    gold = ABSTAIN_GOLD if instance.unanswerable else instance.answers[0]
    return answer_ids(tokenizer, prompt, gold)


def run_instance(engine: Engine, instance: TaskInstance, cells: Sequence[Cell], *, regime: str = "agnostic",
                 seed: int = 0, settings: RunSettings = RunSettings(),
                 model_name: str | None = None) -> list[dict[str, Any]]:
    """Prefill ``instance`` once under ``regime``, decode every cell, and return one record per cell.

    A cell that fails with one of :data:`kvroute.errors.CELL_ERRORS` (e.g. oracle on an item without
    evidence) gets a record with ``status="error"`` and the one-line ``error``, without metric
    fields; the other cells are computed. When the instance itself fails (its prompt does not fit
    the model, a span maps to no token), every cell's record says so. Other exceptions propagate.
    """
    if regime not in REGIMES:
        raise ConfigError(f"regime must be one of {', '.join(REGIMES)}, got {regime!r}")
    check_engine(engine, settings)
    name = model_name or engine.lm.name
    try:
        return _run_instance(engine, instance, cells, regime=regime, seed=seed, settings=settings, model_name=name)
    except CELL_ERRORS as e:
        reason = error_reason(e)
        log.warning("instance %s: every cell failed: %s", instance.id, reason)
        base = task_fields(instance, None)
        return [error_record(cell, reason, model_name=name, regime=regime, seed=seed, base=base) for cell in cells]


def check_engine(engine: Engine, settings: RunSettings) -> None:
    """Refuse an engine built for other run settings (ConfigError): its decode would not give these metrics what
    they read (captured attention or hidden states), or would give answers of another length."""
    need, have = settings.decode_settings(), engine.settings
    wrong = []
    if need.capture and not have.capture:
        wrong.append(f"the metrics {', '.join(settings.metrics)} read captured attention or hidden states, which this "
                     "engine does not capture")
    if need.max_new_tokens != have.max_new_tokens:
        wrong.append(f"the run decodes {need.max_new_tokens} new tokens, the engine {have.max_new_tokens}")
    if wrong:
        raise ConfigError(f"this engine was built for other run settings: {'; '.join(wrong)}; build it from the run's "
                          "settings: Engine(lm, settings.decode_settings())")


def press_fields(press: str) -> dict[str, Any]:
    """``scorer`` and ``selection`` of a press spec (None when the spec does not build)."""
    if press == NO_PRESS:
        return {"scorer": NO_PRESS, "selection": NO_PRESS}
    try:
        p = build_press(press)
    except CELL_ERRORS:
        return {"scorer": None, "selection": None}
    return {"scorer": str(p.scorer.spec()), "selection": str(p.selection.spec())}


def error_record(cell: Cell, reason: str, *, model_name: str, regime: str, seed: int, base: dict[str, Any],
                 seconds: dict[str, float] | None = None) -> dict[str, Any]:
    """The record of a cell that could not be computed: identity, task tags, ``status="error"`` and why."""
    return {"model": model_name, "press": cell.press, "ratio": cell.ratio, "restore": cell.restore or None,
            "regime": regime, "seed": seed, **base,
            **press_fields(cell.press), "status": "error", "error": reason,
            "seconds_prefill": (seconds or {}).get("prefill"), "seconds_decode": (seconds or {}).get("decode")}


def instance_prompt(engine: Engine, instance: TaskInstance, *, regime: str, settings: RunSettings) -> Prompt:
    """The prompt ``run_instance`` builds for ``instance`` under ``regime`` (a huge context is refused before it
    is tokenised)."""
    lm = engine.lm
    check_chars(lm, len(instance.context) + len(instance.question), settings.max_new_tokens)
    return build_prompt(lm.tokenizer, instance, regime=regime, system_prompt=settings.system_prompt,
                        answer_prefix=settings.answer_prefix)


def check_memory(engine: Engine, items: Sequence[tuple[TaskInstance, str, int]], settings: RunSettings) -> None:
    """Refuse (InsufficientMemoryError naming the instance) before anything runs when the largest of ``items``
    — (instance, regime, cells) — would not fit the free memory even one cell at a time. Only the longest
    instance by characters is tokenised (the next one when its prompt cannot be built: that instance gets its
    own per-cell error records)."""
    for instance, regime, cells in sorted(items, key=lambda x: (len(x[0].context) + len(x[0].question), x[2]),
                                          reverse=True):
        try:
            prompt = instance_prompt(engine, instance, regime=regime, settings=settings)
        except CELL_ERRORS:
            continue
        T, Q = prompt.n_context, len(prompt.question_ids)
        try:
            engine.check_memory(T, Q + (8 if "gold" in settings.needs else 0), cells + 1,
                                tracks=int("attention" in settings.needs))
        except InsufficientMemoryError as e:
            raise InsufficientMemoryError(f"instance {instance.id} (the longest: {T} context tokens): {e}; nothing "
                                          "was computed") from None
        return


def _run_instance(engine: Engine, instance: TaskInstance, cells: Sequence[Cell], *, regime: str, seed: int,
                  settings: RunSettings, model_name: str) -> list[dict[str, Any]]:
    prompt = instance_prompt(engine, instance, regime=regime, settings=settings)
    return _run_prompt(engine, instance, prompt, cells, regime=regime, seed=seed, settings=settings,
                       model_name=model_name)[0]


def _run_prompt(engine: Engine, instance: TaskInstance, prompt: Prompt, cells: Sequence[Cell], *, regime: str,
                seed: int, settings: RunSettings, model_name: str,
                prefilled: PrefillResult | None = None) -> tuple[list[dict[str, Any]], EngineResult]:
    """One engine run of ``cells`` on ``prompt`` (on an earlier prefill when given) and its records."""
    lm = engine.lm
    needs = settings.needs
    ev = [p for p in prompt.evidence_positions if p < prompt.n_context]
    rollout = None
    # the evidence rollout and its null sources (random same-shape position sets): captured during a prefill
    if "routes" in needs and ev and prefilled is None:
        rollout = EvidenceRollout.for_prompt(prompt, ev, settings=settings.metric, seed=seed,
                                             doc_range=document_range(lm.tokenizer, prompt, instance))
    track = {"evidence": ev} if ("attention" in needs and ev) else None
    # the logit lens reads the first in-context token of the gold and of each distractor; the sequence
    # lens the whole of each candidate
    gold = gold_ids(lm.tokenizer, instance, prompt) if needs & {"gold", "lens"} else None
    cands = answer_candidates(lm.tokenizer, prompt, instance, gold) if "lens" in needs else None
    result = engine.run(prompt, cells, gold_ids=gold if "gold" in needs else None,
                        evidence=ev, track=track, seed=seed, captures=[rollout] if rollout else [],
                        answer=[p for p in prompt.answer_positions if p < prompt.n_context],
                        distractors=prompt.distractor_span_positions,
                        lens_ids=list(cands.ids) if cands else None,
                        lens_seqs=[list(s) for s in cands.seqs] if cands else None,
                        question_window=prompt.question_window, prefilled=prefilled)
    return records_from_result(instance, prompt, result, regime=regime, seed=seed, settings=settings,
                               model_name=model_name, group_size=lm.info.group_size, model_params=lm.info.num_params,
                               evidence_share=rollout.shares() if rollout else None,
                               null_share=rollout.null_shares() if rollout else None, candidates=cands), result


def run_conversation(engine: Engine, turns: Sequence[TaskInstance], cells: Sequence[Cell], *,
                     regime: str = TURN_REGIME, seed: int = 0, settings: RunSettings = RunSettings(history="own"),
                     model_name: str | None = None) -> list[list[dict[str, Any]]]:
    """Compress the conversation's one context once per cell and ask its questions in turn; records per turn.

    Turn 1 is :func:`run_instance`'s run of the first instance. Each later turn decodes against the same
    prefill (its cache and scores: one prefill for the whole conversation) with the earlier exchanges in
    the uncompressed suffix (:func:`kvroute.tasks.conversation.conversation_prompt`): each cell's own
    answers (``settings.history == "own"``, as a chat server), or the gold answers (``"gold"``). Cells
    with the same history decode together, beside a full-cache reference on that same history (the
    ``*_full`` fields and ``gold_logprob_delta`` of a later turn compare with the uncompressed cache given
    the same conversation so far). A cell whose earlier turn failed gets an error record for the later ones.

    Records carry ``conversation``, ``turn`` (1-based) and ``turns``; a later turn's ``seconds_prefill`` is
    0 (its prefill is turn 1's), and its ``routes`` fields are None (the evidence rollout is captured during
    the prefill, for turn 1's evidence).
    """
    if regime != TURN_REGIME:
        raise ConfigError(f"several questions over one context need the {TURN_REGIME} regime; got {regime!r}")
    check_engine(engine, settings)
    history = settings.history or "own"
    name = model_name or engine.lm.name
    conv = str(turns[0].meta.get("conversation") or turns[0].id)
    tags = {"conversation": conv, "turns": len(turns)}
    cells = list(cells)
    try:
        prompt = instance_prompt(engine, turns[0], regime=regime, settings=settings)
        first, result = _run_prompt(engine, turns[0], prompt, cells, regime=regime, seed=seed, settings=settings,
                                    model_name=name)
    except CELL_ERRORS as e:
        reason = error_reason(e)
        return [[{**error_record(c, reason, model_name=name, regime=regime, seed=seed,
                                 base=task_fields(t, None)), **tags, "turn": k + 1} for c in cells]
                for k, t in enumerate(turns)]
    out = [[{**r, **tags, "turn": 1} for r in first]]
    said: list[list[str] | None] = [None if o is None else [o.text.strip()] for o in result.outputs]
    for k in range(1, len(turns)):
        inst = turns[k]
        recs: list[dict[str, Any] | None] = [None] * len(cells)
        groups: dict[tuple[str, ...], list[int]] = {}
        for i, h in enumerate(said):
            if h is None:
                recs[i] = {**error_record(cells[i], f"EngineError: turn {k} of this conversation failed for this "
                                          "cell", model_name=name, regime=regime, seed=seed,
                                          base=task_fields(inst, None))}
            else:
                key = tuple(h) if history == "own" else ()
                groups.setdefault(key, []).append(i)
        for key, idx in groups.items():
            answers = list(key) if history == "own" else [ABSTAIN_GOLD if t.unanswerable else t.answers[0]
                                                          for t in turns[:k]]
            try:
                p = conversation_prompt(engine.lm.tokenizer, turns[:k + 1], answers,
                                        regime=regime, system_prompt=settings.system_prompt,
                                        answer_prefix=settings.answer_prefix)
                got, res = _run_prompt(engine, inst, p, [cells[i] for i in idx], regime=regime, seed=seed,
                                       settings=settings, model_name=name, prefilled=result.prefill)
                texts = [None if o is None else o.text.strip() for o in res.outputs]
            except CELL_ERRORS as e:
                got = [error_record(cells[i], error_reason(e), model_name=name, regime=regime, seed=seed,
                                    base=task_fields(inst, None)) for i in idx]
                texts = [None] * len(idx)
            for i, r, t in zip(idx, got, texts, strict=True):
                recs[i] = r
                h = said[i]
                said[i] = None if h is None or t is None else [*h, t]
        out.append([{**r, **tags, "turn": k + 1} for r in recs if r is not None])
    return out


def records_from_result(instance: TaskInstance, prompt: Prompt, result: EngineResult, *, regime: str, seed: int,
                        settings: RunSettings, model_name: str, group_size: int, model_params: int | None = None,
                        evidence_share: Any = None, null_share: Any = None,
                        candidates: Any = None) -> list[dict[str, Any]]:
    base = task_fields(instance, prompt)
    records = []
    for i, (cell, mask, out) in enumerate(zip(result.cells, result.masks, result.outputs, strict=True)):
        reason = result.errors.get(i)
        if reason is None and (mask is None or out is None):  # pragma: no cover - engine invariant
            reason = "EngineError: internal error: the engine returned no output for this cell"
        if reason is None:
            rec: dict[str, Any] = {"model": model_name, "press": cell.press, "ratio": cell.ratio,
                                   "restore": cell.restore or None, "regime": regime, "seed": seed, **base,
                                   **press_fields(cell.press), "status": "ok"}
            ctx = CellContext(instance, prompt, mask, out, result.full, group_size, settings.metric,
                              evidence_share=evidence_share, null_share=null_share, candidates=candidates)
            try:
                for name in settings.metrics:
                    rec.update(METRICS.get(name).compute(ctx))
            except CELL_ERRORS as e:
                reason = error_reason(e)
        if reason is not None:
            log.info("instance %s, cell %s@%g: %s", instance.id, cell.press, cell.ratio, reason)
            rec = error_record(cell, reason, model_name=model_name, regime=regime, seed=seed, base=base,
                               seconds=result.seconds)
        rec["model_params"] = model_params
        rec["seconds_prefill"] = result.seconds.get("prefill")
        rec["seconds_decode"] = result.seconds.get("decode")
        records.append(rec)
    return records
