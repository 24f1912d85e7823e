"""One task instance through the engine and the metrics: the unit of work of `run` and `sweep`."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from kvroute.engine import NO_PRESS, Cell, DecodeSettings, Engine, EngineResult
from kvroute.errors import ConfigError
from kvroute.metrics import DEFAULT_METRICS, METRICS, CellContext, MetricSettings
from kvroute.metrics.accessibility import EvidenceRollout
from kvroute.presses import build_press
from kvroute.tasks.prompt import REGIMES, build_prompt

log = logging.getLogger(__name__)

ABSTAIN_GOLD = "I don't know"


@dataclass(frozen=True)
class RunSettings:
    """Everything that changes a record besides (model, instance, press, ratio, regime, seed)."""

    max_new_tokens: int = 24
    batch_size: int = 64
    metrics: tuple[str, ...] = DEFAULT_METRICS
    metric: MetricSettings = field(default_factory=MetricSettings)
    system_prompt: str | None = None
    answer_prefix: str = ""

    def __post_init__(self) -> None:
        for m in self.metrics:
            METRICS.get(m)  # unknown names fail with suggestions

    @property
    def needs(self) -> frozenset[str]:
        out: set[str] = set()
        for m in self.metrics:
            out |= METRICS.get(m).needs
        return frozenset(out)

    def decode_settings(self) -> DecodeSettings:
        return DecodeSettings(max_new_tokens=self.max_new_tokens, batch_size=self.batch_size,
                              capture=bool(self.needs & {"attention", "hidden"}))


def task_fields(instance: Any, prompt: Any) -> dict[str, Any]:
    return {
        "instance_id": instance.id, "family": instance.family, "answer_type": instance.answer_type,
        "question_type": instance.question_type, "unanswerable": instance.unanswerable,
        "context_tokens": prompt.n_context, "difficulty": instance.meta.get("difficulty"),
        "gold": list(instance.answers),
        # "none" when no answer occurrence could be located in the context (imported data): GER is undefined
        "evidence": "none" if (instance.meta.get("evidence") == "none" or not prompt.answer_positions)
        and not instance.unanswerable else "located",
        "depth": instance.meta.get("depth"),
        "target_length": instance.meta.get("target_length") or instance.meta.get("target_tokens"),
    }


def gold_ids(tokenizer: Any, instance: Any) -> list[int]:
    gold = ABSTAIN_GOLD if instance.unanswerable else instance.answers[0]
    return tokenizer.encode(gold, add_special_tokens=False)


def run_instance(engine: Engine, instance: Any, cells: Sequence[Cell], *, regime: str = "agnostic", seed: int = 0,
                 settings: RunSettings = RunSettings(), model_name: str | None = None) -> list[dict[str, Any]]:
    """Prefill ``instance`` once under ``regime``, decode every cell, and return one record per cell."""
    if regime not in REGIMES:
        raise ConfigError(f"regime must be one of {', '.join(REGIMES)}, got {regime!r}")
    lm = engine.lm
    prompt = build_prompt(lm.tokenizer, instance, regime=regime, system_prompt=settings.system_prompt,
                          answer_prefix=settings.answer_prefix)
    needs = settings.needs
    ev = [p for p in prompt.evidence_positions if p < prompt.n_context]
    rollout = EvidenceRollout(ev, prompt.n_context) if "routes" in needs and ev else None
    track = {"evidence": ev} if ("attention" in needs and ev) else None
    result = engine.run(prompt, cells, gold_ids=gold_ids(lm.tokenizer, instance) if "gold" in needs else None,
                        evidence=ev, track=track, seed=seed, captures=[rollout] if rollout else [])
    return records_from_result(instance, prompt, result, regime=regime, seed=seed, settings=settings,
                               model_name=model_name or lm.name, group_size=lm.info.group_size,
                               evidence_share=rollout.shares() if rollout else None)


def records_from_result(instance: Any, prompt: Any, result: EngineResult, *, regime: str, seed: int,
                        settings: RunSettings, model_name: str, group_size: int,
                        evidence_share: Any = None) -> list[dict[str, Any]]:
    base = task_fields(instance, prompt)
    records = []
    for cell, mask, out in zip(result.cells, result.masks, result.outputs, strict=True):
        if cell.press == NO_PRESS:
            scorer, selection = NO_PRESS, NO_PRESS
        else:
            p = build_press(cell.press)
            scorer, selection = str(p.scorer.spec()), str(p.selection.spec())
        rec: dict[str, Any] = {"model": model_name, "press": cell.press, "ratio": cell.ratio, "regime": regime,
                               "seed": seed, **base, "scorer": scorer, "selection": selection}
        ctx = CellContext(instance, prompt, mask, out, result.full, group_size, settings.metric,
                          evidence_share=evidence_share)
        for name in settings.metrics:
            rec.update(METRICS.get(name).compute(ctx))
        rec["seconds_prefill"] = result.seconds.get("prefill")
        rec["seconds_decode"] = result.seconds.get("decode")
        records.append(rec)
    return records
