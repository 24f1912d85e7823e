"""kvroute's masked answers against kvpress's pipeline, token for token (``kvroute presses check``).

The one implementation of the comparison behind ``kvroute presses check``,
``benchmarks/equivalence.py`` and the reference tests: kvroute decodes every (press, ratio) cell of
a prompt from one shared prefill with a KeepMask; kvpress's ``KVPressTextGenerationPipeline`` runs
the same press on the same text, with its own hooks and its own pruned cache. A cell agrees when the
greedy answers are equal: the generated token ids (read off the pipeline's final
``tokenizer.decode`` call, the only place they surface) and the text. Random scorers are seeded per
(seed, layer) on both sides (:func:`~kvroute.presses.scorers.kvpress_adapter.seeded_kvpress_layers`).

Presses kvpress applies with "fake keys" (AdaKV, CriticalAdaKV, KVzip: evicted keys overwritten so
that their logits fall below zero) leave their decisions on the attention modules; for those the
comparison also reads kvpress's keep masks (:func:`kvpress_keep_masks`) and holds kvroute's against
them. Where kvpress's pipeline cannot decode such a cell (its fake-key search fails, as on random tiny
models with more queries than head dimensions) the masks are the comparison. kvpress's fake keys
are not exact: their logits are very negative, but a query whose real logits are lower still (seen
in Qwen2.5-0.5B's first layer) puts its attention on them. A fake-key cell with equal masks and
another answer is therefore rerun on kvpress's side with those entries masked exactly
(:class:`~kvroute.engine.reference.FakeKeyProbe`); the comparison reports the leaked weight and
whether kvpress's answer then equals kvroute's.

One kvpress quirk is read past: its generation loop tests for EOS from the second token on, so an
answer whose first token is EOS goes on past its end there. kvpress's answer is then that one EOS
token, where kvroute stops (seen on tiny random models, whose first token is sometimes EOS).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Protocol

import torch

from kvroute.engine import Cell, Engine
from kvroute.engine.decode import CellOutput
from kvroute.engine.reference import FakeKeyProbe, kvpress_answer, kvpress_pipeline, kvpress_press
from kvroute.errors import EngineError, error_reason
from kvroute.presses.press import build_press
from kvroute.presses.scorers.kvpress_adapter import seeded_kvpress_layers

if TYPE_CHECKING:
    from kvroute.models.loading import LoadedModel

DEFAULT_RATIOS = (0.25, 0.5, 0.75, 0.9)
KVPRESS_FAILED = "kvpress failed: "  # how a cell reads when kvpress's own code raised on it


class ReferencePrompt(Protocol):
    """A prompt both sides can run: kvroute's token ids and the text kvpress turns into the same ids."""

    @property
    def context_ids(self) -> Sequence[int]: ...

    @property
    def question_ids(self) -> Sequence[int]: ...

    @property
    def kvpress_context(self) -> str: ...

    @property
    def kvpress_question(self) -> str: ...

    @property
    def answer_prefix(self) -> str: ...

    @property
    def question_window(self) -> int: ...  # the question's tokens at the end of the context (aware regime), else 0


@dataclass(frozen=True)
class CellComparison:
    """One cell of one prompt: kvroute's output and kvpress's answer (text and generated ids)."""

    prompt_id: str
    cell: Cell
    ours: CellOutput | None  # None: kvroute refused the cell (``refused`` says why)
    kvpress_text: str
    kvpress_ids: list[int]
    no_reference: str | None = None  # why kvpress's pipeline did not answer this cell, else None
    masks_equal: bool | None = None  # fake-key presses: kvroute's keep mask == kvpress's; None: kvpress prunes
    # fake-key cells that disagree with equal masks: kvpress rerun with its masked entries masked exactly
    exact_ids: list[int] | None = None
    fake_key_leak: float | None = None  # the largest attention weight a query put on kvpress's fake keys
    leak_layer: int | None = None
    refused: str | None = None  # why kvroute computed no output for this cell (a press that refuses the model)

    @property
    def answered(self) -> bool:
        """kvpress's pipeline gave an answer to compare with."""
        return self.no_reference is None

    @property
    def comparable(self) -> bool:
        """Something to compare: kvpress answered (kvroute refusing then disagrees), or the fake-key masks."""
        return self.answered or (self.masks_equal is not None and self.ours is not None)

    @property
    def agrees(self) -> bool:
        if self.ours is None:
            return False
        tokens = not self.answered or (self.ours.tokens == self.kvpress_ids and self.ours.text == self.kvpress_text)
        return self.comparable and self.masks_equal is not False and tokens

    @property
    def agrees_exactly_masked(self) -> bool:
        """Disagrees, but only because kvpress's fake keys took attention: masked exactly, kvpress answers as
        kvroute."""
        return (not self.agrees and self.masks_equal is True and self.ours is not None
                and self.exact_ids == self.ours.tokens)

    def describe(self) -> str:
        where = f"{self.prompt_id} {self.cell.press}@{self.cell.ratio:g}"
        masks = "" if self.masks_equal is None else f" (keep masks {'equal' if self.masks_equal else 'DIFFER'})"
        if self.ours is None:
            theirs = f"kvpress: {self.no_reference}" if not self.answered else f"kvpress {self.kvpress_ids}"
            return f"{where}: kvroute refused ({self.refused}); {theirs}"
        if not self.answered:
            return f"{where}: no kvpress answer: {self.no_reference}{masks}"
        line = (f"{where}: kvpress {self.kvpress_text!r} {self.kvpress_ids} vs kvroute {self.ours.text!r} "
                f"{self.ours.tokens}{masks}")
        if self.exact_ids is not None:
            same = "kvroute's answer" if self.exact_ids == self.ours.tokens else "still not kvroute's"
            line += (f"; kvpress's fake keys took up to {self.fake_key_leak:.0%} of a query's attention (layer "
                     f"{self.leak_layer}); with those entries masked exactly, kvpress answers {self.exact_ids}: {same}")
        return line


@dataclass(frozen=True)
class PromptComparison:
    cells: list[CellComparison]
    seconds_kvroute: float  # one prefill, every cell batched
    seconds_kvpress: float  # one pipeline call per cell


@dataclass
class Agreement:
    """Comparisons tallied over prompts: agreement overall and per press, mask checks, cells kvpress could not run.

    ``label`` maps the spec a cell ran under to the one shown (e.g. without a temporary weights folder)."""

    label: dict[str, str] = field(default_factory=dict)
    agree: int = 0
    total: int = 0
    per_press: dict[str, list[int]] = field(default_factory=dict)  # shown spec -> [agree, compared, masks eq, masked]
    not_compared: dict[str, int] = field(default_factory=dict)  # "press@ratio: why" -> cells
    mismatches: list[str] = field(default_factory=list)
    fake_key_only: int = 0  # disagreements that vanish when kvpress's fake keys are masked exactly

    def name(self, spec: str) -> str:
        return self.label.get(spec, spec)

    def add(self, res: PromptComparison) -> list[CellComparison]:
        """Tally ``res``; return its cells that disagree."""
        bad = []
        for c in res.cells:
            name = self.name(c.cell.press)
            row = self.per_press.setdefault(name, [0, 0, 0, 0])
            if c.masks_equal is not None:
                row[2] += c.masks_equal
                row[3] += 1
            if not c.comparable:
                why = f"{name}@{c.cell.ratio:g}: {c.no_reference}"
                self.not_compared[why] = self.not_compared.get(why, 0) + 1
                continue
            self.agree += c.agrees
            self.total += 1
            row[0] += c.agrees
            row[1] += 1
            if not c.agrees:
                bad.append(c)
                self.fake_key_only += c.agrees_exactly_masked
                self.mismatches.append(c.describe().replace(c.cell.press, name))
        return bad

    @property
    def line(self) -> str:
        return f"agreement: {self.agree}/{self.total}"

    @property
    def exact_line(self) -> str:
        """Agreement counting the cells whose only difference is kvpress's inexact fake keys."""
        return (f"agreement with kvpress's fake keys masked exactly: {self.agree + self.fake_key_only}/{self.total} "
                f"({self.fake_key_only} of the {self.total - self.agree} disagreements are fake-key leaks)")


def no_kvpress_counterpart(spec: str) -> str | None:
    """Why ``spec`` has no kvpress press to compare with (a kvroute scorer or selection), or None if it has one."""
    try:
        kvpress_press(spec, DEFAULT_RATIOS[0], question_window=1)
    except EngineError as e:
        return str(e)
    return None


@contextmanager
def _recorded_decodes(tokenizer: Any) -> Iterator[list[list[int]]]:
    """The token ids of every ``tokenizer.decode`` call inside the block (the method is restored after)."""
    seen: list[list[int]] = []
    own = "decode" in vars(tokenizer)
    decode = tokenizer.decode

    def recording(ids: Any, *args: Any, **kwargs: Any) -> Any:
        seen.append([int(i) for i in ids])
        return decode(ids, *args, **kwargs)

    tokenizer.decode = recording
    try:
        yield seen
    finally:
        if own:
            tokenizer.decode = decode
        else:
            del tokenizer.decode


def kvpress_answer_ids(lm: LoadedModel, prompt: ReferencePrompt, spec: str, ratio: float, *, max_new_tokens: int,
                       seed: int = 0, pipeline: Any = None) -> tuple[str, list[int]]:
    """kvpress pipeline's greedy answer to ``prompt`` under ``spec`` at ``ratio``: its text and generated ids."""
    with _recorded_decodes(lm.tokenizer) as seen, seeded_kvpress_layers(lm.model, seed):
        text = kvpress_answer(lm, prompt.kvpress_context, prompt.kvpress_question, spec, ratio,
                              max_new_tokens=max_new_tokens, answer_prefix=prompt.answer_prefix, pipeline=pipeline,
                              question_window=prompt.question_window)
    ids = seen[-1]
    eos = lm.model.generation_config.eos_token_id  # the stop tokens of kvpress's loop (and kvroute's)
    if len(ids) > 1 and ids[0] in (eos if isinstance(eos, list) else [eos]):  # the quirk (module doc)
        ids = ids[:1]
        text = lm.tokenizer.decode(ids, skip_special_tokens=True)
    return text, ids


#: what kvpress's own code raises where it cannot run a cell: its asserts and checks, and its failures on a model it
#: does not handle (FinchPress on Gemma3ForConditionalGeneration: AttributeError, then UnboundLocalError, a NameError)
KVPRESS_ERRORS = (AssertionError, ValueError, RuntimeError, AttributeError, NameError)


def compare_prompt(engine: Engine, prompt: ReferencePrompt, cells: Sequence[Cell], *, seed: int = 0,
                   pipeline: Any = None, prompt_id: str = "") -> PromptComparison:
    """Every cell of ``prompt`` through kvroute's ``engine`` (one prefill) and through kvpress's pipeline."""
    lm = engine.lm
    pipe = pipeline or kvpress_pipeline(lm)
    t0 = time.perf_counter()
    # a press that refuses the model (kvzip on Gemma 3, as kvpress refuses it) fails its cells, not the comparison
    res = engine.run(prompt, list(cells), seed=seed, question_window=prompt.question_window)
    t_ours = time.perf_counter() - t0
    out, t_ref = [], 0.0
    for i, (cell, ours) in enumerate(zip(cells, res.outputs, strict=True)):
        t0 = time.perf_counter()
        mask = res.masks[i]
        theirs = None
        if build_press(cell.press).selection.kvpress_fake_keys:
            try:
                theirs = kvpress_keep_masks(lm, prompt, cell.press, cell.ratio, seed=seed)
            except (EngineError, *KVPRESS_ERRORS):  # the pipeline below fails the same way
                theirs = None
        equal = None if theirs is None or mask is None else bool(torch.equal(mask.mask.cpu(), theirs))
        text, why = "", None
        ids: list[int] = []
        try:
            text, ids = kvpress_answer_ids(lm, prompt, cell.press, cell.ratio, seed=seed, pipeline=pipe,
                                           max_new_tokens=engine.settings.max_new_tokens)
        except EngineError as e:  # kvpress has no press for this cell (kvroute's own, or its precondition fails)
            why = str(e)
        except KVPRESS_ERRORS as e:  # kvpress's own code failed on this cell
            why = f"{KVPRESS_FAILED}{error_reason(e)}"
        finally:
            t_ref += time.perf_counter() - t0
        comparison = CellComparison(prompt_id, cell, ours, text, ids, no_reference=why, masks_equal=equal,
                                    refused=res.errors.get(i) if ours is None else None)
        # same masks, other answer: how much do kvpress's fake keys leak?
        if equal and not comparison.agrees and ours is not None:
            t0 = time.perf_counter()
            with FakeKeyProbe(exact=True) as probe:
                _, exact = kvpress_answer_ids(lm, prompt, cell.press, cell.ratio, seed=seed, pipeline=pipe,
                                              max_new_tokens=engine.settings.max_new_tokens)
            t_ref += time.perf_counter() - t0
            if probe.forwards:  # else the decode ran outside the reference wrapper (eager): nothing was measured
                comparison = replace(comparison, exact_ids=exact, fake_key_leak=probe.leak, leak_layer=probe.layer)
        out.append(comparison)
    return PromptComparison(out, t_ours, t_ref)


@torch.inference_mode()
def kvpress_keep_masks(lm: LoadedModel, prompt: ReferencePrompt, spec: str, ratio: float, *,
                       seed: int = 0) -> torch.Tensor | None:
    """The keep masks ``[L, Hkv, T]`` a fake-key kvpress press decides for ``prompt`` (None when it prunes instead).

    kvpress's press runs its own hooks on a prefill of the context; its decisions are read from the
    ``masked_key_indices`` it leaves on each attention module (cleared afterwards).
    """
    from transformers import DynamicCache

    from kvroute.engine.hooks import decoder_layers
    from kvroute.engine.reference import _attn

    press = kvpress_press(spec, ratio, prompt.question_window)
    model = lm.model
    ids = torch.tensor([list(prompt.context_ids)], device=next(model.parameters()).device)
    with _attn(lm, spec), seeded_kvpress_layers(model, seed), press(model):
        model.model(input_ids=ids, past_key_values=DynamicCache(config=model.config))
    attns: list[Any] = [layer.self_attn for layer in decoder_layers(model)]
    found = [getattr(a, "masked_key_indices", None) for a in attns]
    for a in attns:
        if hasattr(a, "masked_key_indices"):
            a.masked_key_indices = None
    if all(f is None for f in found):
        return None
    keep = torch.ones(len(attns), lm.info.num_kv_heads, ids.shape[1], dtype=torch.bool)
    for layer, f in enumerate(found):
        if f is not None:
            _, h, t = f
            keep[layer, h.cpu(), t.cpu()] = False
    return keep
