"""Causal restoration: chosen context entries put back into a compressed cell's KeepMask.

A restored cell is its press's mask at its ratio with some entries kept again, decoded like any other
cell (one batched decode per instance). What the restoration fixes is causal evidence about why the
cell failed: a failure that ``restore=answer`` repairs was an erasure of the answer; one where the
answer was retained and ``restore=evidence`` does not repair it is not about what was kept.

Conditions (``Cell.restore``, the sweep config's ``restore`` list)::

    answer                    the answer's tokens, every layer and KV head
    evidence                  the evidence tokens (answer included), every layer and KV head
    random                    as many other context tokens as the answer has, drawn at random (the null)
    distractor                as many tokens of the instance's distractor values as the answer has (their
                              occurrences in the context, answer tokens left out, taken occurrence by occurrence
                              in a seeded random order; topped up with random other tokens when the distractors
                              are shorter): the null of the same kind and size as ``answer`` — a repair by
                              ``answer`` that ``distractor`` matches is not about the answer
    consensus                 each layer's consensus token in the full cache: the context position most of
                              the layer's query heads attend to most from the last prompt token (after the
                              first 4 positions, the sinks), put back in that layer
    answer@layers:4-11        one band of layers (inclusive; 0-based)
    answer@layers:early       the first third of the layers (middle, late: the others)
    answer@heads:0,2          these KV heads of every layer (a KV head serves its GQA group of query heads)
    answer@heads:retrieval    only the model's retrieval heads: the (layer, KV head) pairs that serve a query head
                              whose retrieval score (Wu et al. 2024) is at least 0.1 in the full-cache cells of
                              another run (the sweep config's ``retrieval_heads``; kvroute.analysis.retrieval)
    evidence@layers:late@heads:1
    answer@slots:3.1,4.0      only these (layer, KV head) slots, written LAYER.KV_HEAD (0-based) and separated by
                              commas: the restore map's resolution (kvroute.analysis.restore_map); a slot list
                              stands alone (not with @layers or @heads); ``@slots:none`` restores nothing (the
                              compressed cell itself, kept as a control)
    span:40-52                context token positions 40 to 52 (0-based, inclusive): a span chosen by the user;
                              takes @layers, @heads and @slots like the other targets

A condition the model cannot take (layers or heads it lacks) or the instance cannot (no answer tokens in
the context) raises :class:`~kvroute.errors.EngineError`, which the engine records as that cell's
error; the other cells run.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from kvroute.errors import ConfigError, EngineError, suggest
from kvroute.presses.keepmask import KeepMask

TARGETS = ("answer", "evidence", "random", "distractor", "consensus", "span")
#: positions the consensus target skips (the attention sinks: the consensus metric's default n_sink)
CONSENSUS_SKIP = 4
BANDS = ("early", "middle", "late")
RETRIEVAL = "retrieval"
_LAYERS = re.compile(r"^(\d+)-(\d+)$")
_SLOT = re.compile(r"^(\d+)\.(\d+)$")
NO_SLOTS = "none"
Slot = tuple[int, int]  # (layer, KV head)


@dataclass(frozen=True)
class Restore:
    """A parsed restore condition (see the module doc)."""

    target: str
    layers: tuple[int, int] | str | None = None  # inclusive (first, last), or a band name
    heads: tuple[int, ...] | str | None = None  # KV heads, or RETRIEVAL (the model's retrieval heads, per layer)
    slots: tuple[Slot, ...] | None = None  # (layer, KV head) pairs, sorted; () restores nothing
    span: tuple[int, int] | None = None  # the span target's context positions (first, last), inclusive

    @classmethod
    def parse(cls, spec: str) -> Restore:  # noqa: C901  (one branch per part of the grammar)
        """``"answer@layers:0-9"`` → Restore; a malformed condition raises ConfigError naming the part."""
        parts = [p.strip() for p in spec.strip().split("@")]
        target = parts[0]
        span: tuple[int, int] | None = None
        if target.startswith("span:") or target == "span":
            span = _span(spec, target.partition(":")[2])
            target = "span"
        if target not in TARGETS:
            hint = suggest(target, TARGETS)
            raise ConfigError(f"restore condition {spec!r}: unknown target {target!r}; choose from "
                              f"{', '.join(TARGETS)}" + (f" (did you mean {hint[0]!r}?)" if hint else ""))
        layers: tuple[int, int] | str | None = None
        heads: tuple[int, ...] | str | None = None
        slots: tuple[Slot, ...] | None = None
        for part in parts[1:]:
            key, _, value = part.partition(":")
            if key == "layers" and layers is None:
                if value in BANDS:
                    layers = value
                elif m := _LAYERS.match(value):
                    a, b = int(m.group(1)), int(m.group(2))
                    if a > b:
                        raise ConfigError(f"restore condition {spec!r}: layers {value} run backwards; write {b}-{a}")
                    layers = (a, b)
                else:
                    raise ConfigError(f"restore condition {spec!r}: layers must be FIRST-LAST (0-based, inclusive) "
                                      f"or one of {', '.join(BANDS)}, got {value!r}")
            elif key == "heads" and heads is None and value == RETRIEVAL:
                heads = RETRIEVAL
            elif key == "heads" and heads is None:
                try:
                    heads = tuple(sorted({int(h) for h in value.split(",")}))
                except ValueError:
                    raise ConfigError(f"restore condition {spec!r}: heads must be KV head numbers separated by "
                                      f"commas or {RETRIEVAL!r}, got {value!r}") from None
                if any(h < 0 for h in heads):
                    raise ConfigError(f"restore condition {spec!r}: head numbers start at 0")
            elif key == "slots" and slots is None:
                slots = _slots(spec, value)
            else:
                raise ConfigError(f"restore condition {spec!r}: {part!r} is not @layers:…, @heads:… or @slots:… (each "
                                  "at most once)")
        if slots is not None and (layers is not None or heads is not None):
            raise ConfigError(f"restore condition {spec!r}: @slots names (layer, KV head) pairs itself; write it "
                              "without @layers and @heads")
        return cls(target, layers, heads, slots, span)

    def __str__(self) -> str:
        out = self.target if self.span is None else f"span:{self.span[0]}-{self.span[1]}"
        if self.layers is not None:
            out += "@layers:" + (self.layers if isinstance(self.layers, str) else f"{self.layers[0]}-{self.layers[1]}")
        if self.heads is not None:
            out += "@heads:" + (self.heads if isinstance(self.heads, str) else ",".join(map(str, self.heads)))
        if self.slots is not None:
            out += "@slots:" + (",".join(f"{a}.{b}" for a, b in self.slots) or NO_SLOTS)
        return out

    def layer_range(self, num_layers: int) -> range:
        """The restored layers of a model of ``num_layers`` (EngineError when it lacks them)."""
        if self.layers is None:
            return range(num_layers)
        if isinstance(self.layers, str):
            i = BANDS.index(self.layers)
            return range(i * num_layers // 3, (i + 1) * num_layers // 3)
        a, b = self.layers
        if b >= num_layers:
            raise EngineError(f"restore={self}: the model has {num_layers} layers (0-{num_layers - 1}), not {b}")
        return range(a, b + 1)

    def positions(self, T: int, answer: Sequence[int], evidence: Sequence[int], seed: int,
                  distractors: Sequence[Sequence[int]] = ()) -> list[int]:
        """The restored context positions, the same in every layer (EngineError when the instance has none to
        restore; not for the consensus target, whose position is per layer). ``distractors``: per occurrence of a
        distractor value in the context, its token positions (``Prompt.distractor_span_positions``)."""
        if self.span is not None:
            if self.span[1] >= T:
                raise EngineError(f"restore={self}: the context has {T} tokens (0-{T - 1}), not {self.span[1]}")
            return list(range(self.span[0], self.span[1] + 1))
        ans = sorted({p for p in answer if 0 <= p < T})
        if self.target in ("answer", "random", "distractor"):
            if not ans:
                raise EngineError(f"restore={self}: this instance has no answer tokens in the context")
            if self.target == "answer":
                return ans
            if self.target == "distractor":
                return _distractor_positions(T, ans, distractors, seed, self)
            return sorted(_draw_others(T, set(ans), len(ans), torch.Generator().manual_seed(seed)))
        ev = sorted({p for p in evidence if 0 <= p < T} | set(ans))
        if not ev:
            raise EngineError(f"restore={self}: this instance has no evidence tokens in the context")
        return ev

    @property
    def needs_retrieval_heads(self) -> bool:
        return self.heads == RETRIEVAL

    def apply(self, mask: KeepMask, answer: Sequence[int], evidence: Sequence[int], *, seed: int = 0,
              consensus: Sequence[int] | None = None, retrieval: Sequence[tuple[int, int]] | None = None,
              distractors: Sequence[Sequence[int]] = ()) -> KeepMask:
        """``mask`` with the condition's entries kept again (a new KeepMask; ``mask`` is not changed).
        ``consensus``: the full cache's consensus position of each layer (:func:`consensus_positions`), needed by
        the consensus target only; ``retrieval``: the model's retrieval heads as (layer, KV head) pairs, needed by
        ``@heads:retrieval`` only."""
        L, Hkv, T = mask.shape
        if self.slots is not None:
            return self._apply_slots(mask, answer, evidence, seed, consensus, distractors)
        layers = list(self.layer_range(L))
        if self.needs_retrieval_heads:
            return self._apply_pairs(mask, answer, evidence, seed, consensus, layers, retrieval, distractors)
        assert not isinstance(self.heads, str)
        if self.heads is not None and self.heads[-1] >= Hkv:
            raise EngineError(f"restore={self}: the model has {Hkv} KV heads per layer (0-{Hkv - 1})")
        heads = list(self.heads) if self.heads is not None else list(range(Hkv))
        keep = mask.mask.clone()
        hi = torch.as_tensor(heads, dtype=torch.long, device=keep.device)
        if self.target == "consensus":
            if consensus is None or len(consensus) != L:
                raise EngineError(f"restore={self}: the full cache's consensus positions were not computed")
            for layer in layers:
                keep[layer, hi, consensus[layer]] = True
            return mask.replaced(keep)
        pos = torch.as_tensor(self.positions(T, answer, evidence, seed, distractors), dtype=torch.long,
                              device=keep.device)
        li = torch.as_tensor(layers, dtype=torch.long, device=keep.device)
        keep[li[:, None, None], hi[None, :, None], pos[None, None, :]] = True
        return mask.replaced(keep)

    def _apply_pairs(self, mask: KeepMask, answer: Sequence[int], evidence: Sequence[int], seed: int,
                     consensus: Sequence[int] | None, layers: list[int],
                     retrieval: Sequence[tuple[int, int]] | None,
                     distractors: Sequence[Sequence[int]] = ()) -> KeepMask:
        """The condition restricted to the retrieval heads' (layer, KV head) pairs inside its layers."""
        L, Hkv, T = mask.shape
        if retrieval is None:
            raise EngineError(f"restore={self}: no retrieval heads are known for this model (a sweep names the run "
                              "they come from with retrieval_heads = RUN_DIR; see docs/running.md)")
        bad = [(layer, h) for layer, h in retrieval if not (0 <= layer < L and 0 <= h < Hkv)]
        if bad:
            raise EngineError(f"restore={self}: retrieval head (layer {bad[0][0]}, KV head {bad[0][1]}) is outside "
                              f"this model's {L} layers × {Hkv} KV heads (were they found on another model?)")
        in_band = set(layers)
        pairs = sorted({(layer, h) for layer, h in retrieval if layer in in_band})
        if not pairs:
            raise EngineError(f"restore={self}: the model has no retrieval heads "
                              + ("in these layers" if self.layers is not None else "(none scores at least the "
                                 "threshold)"))
        return self._keep_pairs(mask, answer, evidence, seed, consensus, pairs, distractors)

    def _apply_slots(self, mask: KeepMask, answer: Sequence[int], evidence: Sequence[int], seed: int,
                     consensus: Sequence[int] | None, distractors: Sequence[Sequence[int]]) -> KeepMask:
        """The condition in its (layer, KV head) slots only; no slot: the mask unchanged (a copy)."""
        L, Hkv, _ = mask.shape
        assert self.slots is not None
        bad = [(layer, h) for layer, h in self.slots if layer >= L or h >= Hkv]
        if bad:
            raise EngineError(f"restore={self}: slot {bad[0][0]}.{bad[0][1]} is outside this model's {L} layers × "
                              f"{Hkv} KV heads (0-{L - 1}, 0-{Hkv - 1})")
        if not self.slots:
            return mask.replaced(mask.mask.clone())
        return self._keep_pairs(mask, answer, evidence, seed, consensus, list(self.slots), distractors)

    def _keep_pairs(self, mask: KeepMask, answer: Sequence[int], evidence: Sequence[int], seed: int,
                    consensus: Sequence[int] | None, pairs: Sequence[Slot],
                    distractors: Sequence[Sequence[int]]) -> KeepMask:
        """``mask`` with the condition's positions kept again in the (layer, KV head) ``pairs`` only."""
        L, Hkv, T = mask.shape
        keep = mask.mask.clone()
        if self.target == "consensus":
            if consensus is None or len(consensus) != L:
                raise EngineError(f"restore={self}: the full cache's consensus positions were not computed")
            for layer, h in pairs:
                keep[layer, h, consensus[layer]] = True
            return mask.replaced(keep)
        pos = torch.as_tensor(self.positions(T, answer, evidence, seed, distractors), dtype=torch.long,
                              device=keep.device)
        li = torch.as_tensor([p[0] for p in pairs], dtype=torch.long, device=keep.device)
        hi = torch.as_tensor([p[1] for p in pairs], dtype=torch.long, device=keep.device)
        keep[li[:, None], hi[:, None], pos[None, :]] = True
        return mask.replaced(keep)


def _slots(spec: str, value: str) -> tuple[Slot, ...]:
    """``"3.1,4.0"`` → ((3, 1), (4, 0)) sorted and without repeats; ``"none"`` → (); ConfigError naming the bad part."""
    if value == NO_SLOTS:
        return ()
    out: set[Slot] = set()
    for item in value.split(","):
        m = _SLOT.match(item.strip())
        if m is None:
            raise ConfigError(f"restore condition {spec!r}: slot {item.strip()!r} is not LAYER.KV_HEAD (0-based, e.g. "
                              f"3.1); separate slots with commas, or write slots:{NO_SLOTS} for no slot")
        out.add((int(m.group(1)), int(m.group(2))))
    return tuple(sorted(out))


def _span(spec: str, value: str) -> tuple[int, int]:
    """``"40-52"`` → (40, 52): the span target's context positions; ConfigError naming the bad part."""
    m = _LAYERS.match(value)
    if m is None:
        raise ConfigError(f"restore condition {spec!r}: span must be span:FIRST-LAST, context token positions "
                          f"(0-based, inclusive), got {value!r}")
    a, b = int(m.group(1)), int(m.group(2))
    if a > b:
        raise ConfigError(f"restore condition {spec!r}: span {value} runs backwards; write span:{b}-{a}")
    return a, b


def _distractor_positions(T: int, ans: Sequence[int], distractors: Sequence[Sequence[int]], seed: int,
                          cond: Restore) -> list[int]:
    """``len(ans)`` positions of the distractor values: whole occurrences in a seeded random order, the last one cut
    to fit; when the distractors hold fewer tokens than the answer, topped up with other context tokens at random
    (as ``random`` draws them) so the null keeps the answer's size. EngineError when the context holds no distractor
    token at all."""
    taken = set(ans)
    occ = [[p for p in o if 0 <= p < T and p not in taken] for o in distractors]
    occ = [o for o in occ if o]
    if not occ:
        raise EngineError(f"restore={cond}: this instance has no distractor tokens in the context")
    g = torch.Generator().manual_seed(seed)
    out: list[int] = []
    for i in torch.randperm(len(occ), generator=g).tolist():
        out += [p for p in occ[i] if p not in out][: len(ans) - len(out)]
        if len(out) == len(ans):
            return sorted(out)
    return sorted(out + _draw_others(T, taken | set(out), len(ans) - len(out), g))


def _draw_others(T: int, exclude: set[int], k: int, g: torch.Generator) -> list[int]:
    """``k`` context positions of ``T`` outside ``exclude``, drawn at random with ``g`` (the random null's draw)."""
    others = torch.as_tensor(sorted(set(range(T)) - exclude), dtype=torch.long)
    return others[torch.randperm(len(others), generator=g)[:k]].tolist()


def kv_pairs(heads: Sequence[tuple[int, int]], num_heads: int, num_kv_heads: int) -> list[tuple[int, int]]:
    """(layer, query head) pairs → the (layer, KV head) pairs serving them (query head h reads KV head h // G)."""
    if num_kv_heads < 1 or num_heads % num_kv_heads:
        raise EngineError(f"{num_heads} query heads do not split into {num_kv_heads} KV groups")
    g = num_heads // num_kv_heads
    return sorted({(int(layer), int(h) // g) for layer, h in heads})


def consensus_positions(rows: torch.Tensor, T: int, skip: int = CONSENSUS_SKIP) -> list[int]:
    """Per layer, the context position (of ``T``, after the first ``skip``) that most query heads attend to most:
    the mode of the heads' argmax over ``rows [L, H, K]`` (the full cache's last-prompt-token attention; ties go
    to the earlier position)."""
    if skip >= T:
        raise EngineError(f"restore=consensus: the context has {T} tokens, none after the first {skip} (the sinks)")
    arg = rows[..., skip:T].float().argmax(-1) + skip  # [L, H]
    return [int(torch.mode(arg[layer]).values) for layer in range(arg.shape[0])]


def parse_restore(spec: str | None) -> Restore | None:
    return Restore.parse(spec) if spec else None
