"""One interface for the forms of the masked attention, a registry of them, and the setting that chooses one.

Every backend computes the same thing for one layer's forward of B cells (:class:`AttentionCall`):
``softmax([q·K_ctxᵀ masked by keep[cell, kv_head], q·K_sufᵀ causal]) · [V_ctx; V_suf]`` as ``[Hkv, B, G·q, D]``.
``reference`` is the definition (explicit scores and softmax, :mod:`kvroute.engine.attention.reference`) and the
only one that hands the captures (probability rows, tracked masses) from its own softmax; every other backend is
checked against it within 1e-5 at float32 (tests/unit/test_attention_backends.py), and where a call captures and the
backend does not, the captures are computed on their own (:func:`kvroute.engine.attention.capture.deliver`: whole
rows by :func:`~kvroute.engine.attention.streaming.probability_rows`, tracked masses from the backend's log-sum-exp
where it returns one, :attr:`Backend.lse`).

The setting ``decoding.attention_backend`` is ``"auto"`` (the rule of :func:`choose`) or one backend's name, which
then runs every forward it serves (:meth:`Backend.serves`), the rule the others. Which backends ran is counted per
process (:func:`ran`) and recorded in the run's manifest per session.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, TypeVar

import torch

from kvroute.engine.attention.context import AUTO, BackendChoice
from kvroute.registry import Registry

if TYPE_CHECKING:
    from kvroute.engine.attention.context import MaskedContext

def resolve_backend(name: str = AUTO, env: Mapping[str, str] | None = None) -> BackendChoice:
    """The backend setting ``name`` checked against the registry (an unknown name fails with the closest ones), with
    the two environment overrides read now: ``KVROUTE_KEPT_KERNEL=0`` keeps the kept-entries kernel off and
    ``KVROUTE_FUSED_ATTENTION=0`` PyTorch's private fused kernel (the backends ``kept`` and ``fused``, and the fused
    slices of ``gathered``); a backend named by the setting that is off then serves no forward."""
    return BackendChoice.from_env(check_backend_name(name), env)


def check_backend_name(name: str) -> str:
    """``name`` if it is ``"auto"`` or a registered backend, else the registry's error with the closest names."""
    if name != AUTO:
        BACKENDS.get(name)
    return name


@dataclass
class AttentionCall:
    """One layer's masked attention forward for B cells, in the shapes every backend reads.

    ``qg`` ``[B, Hkv, G·q, D]``: each KV head's query rows in (group head g, query i) order; ``k_ctx``/``v_ctx``
    ``[Hkv, T, D]``: the shared context; ``key``/``value`` ``[B, Hkv, s, D]``: the cells' own suffix, whose last
    ``q`` positions are the queries'; ``own`` bool ``[B, s]``: the suffix slots each cell may see (None: all)."""

    ctx: MaskedContext
    layer: int
    qg: torch.Tensor
    k_ctx: torch.Tensor
    v_ctx: torch.Tensor
    key: torch.Tensor
    value: torch.Tensor
    q: int
    scale: float
    own: torch.Tensor | None

    @property
    def T(self) -> int:
        return int(self.k_ctx.shape[1])

    @property
    def G(self) -> int:
        return int(self.qg.shape[2]) // self.q

    @property
    def captured(self) -> range:
        """The query indices whose captures the context's observers (``on_probs``, ``on_masses``) receive."""
        return self.ctx.captured(self.q)

    @property
    def keep(self) -> torch.Tensor:
        """bool ``[Hkv, B, 1, T]``: the cells' keep masks of this layer."""
        return self.ctx.keep[:, self.layer].transpose(0, 1).unsqueeze(2)

    def bias(self) -> torch.Tensor:
        """``[Hkv, B, 1, T]``: the additive keep mask (0 or −inf, two bytes an entry, cached per layer)."""
        return self.ctx.context_bias(self.layer, self.qg.dtype)


@dataclass(frozen=True)
class Availability:
    """Whether a backend can run in this process, and if not, why (one line)."""

    ok: bool
    reason: str = ""


class Backend(ABC):
    """A form of the masked attention. Subclasses declare what they serve and compute :meth:`forward`."""

    #: the registry name (the setting's value)
    name: ClassVar[str]
    #: the device types it runs on
    devices: ClassVar[tuple[str, ...]] = ("cpu", "cuda")
    #: whether it hands the captures from its own softmax (else they are computed beside it)
    captures: ClassVar[bool] = False
    #: whether :meth:`attend` returns its rows' log-sum-exp, from which the captured masses are computed at the
    #: tracked positions alone (:func:`kvroute.engine.attention.capture.deliver`)
    lse: ClassVar[bool] = False
    #: whether it serves question forwards (several queries per cell) and decode steps (one)
    question: ClassVar[bool] = True
    decode: ClassVar[bool] = True

    def available(self) -> Availability:
        """Whether it can run in this process at all (a kernel built, an operator present)."""
        return Availability(True)

    def serves(self, call: AttentionCall) -> bool:
        """Whether it computes ``call`` (device, dtype, shapes, the environment overrides); the default: its device
        types and kinds of forward, when available."""
        return (call.qg.device.type in self.devices and (self.question if call.q > 1 else self.decode)
                and self.available().ok)

    @abstractmethod
    def forward(self, call: AttentionCall) -> torch.Tensor:
        """The attention output ``[Hkv, B, G·q, D]`` in the query's dtype. A backend with :attr:`captures` also
        hands the captures of ``call.captured`` to the context's observers
        (:func:`kvroute.engine.attention.capture.deliver`)."""

    def attend(self, call: AttentionCall) -> tuple[torch.Tensor, torch.Tensor | None]:
        """:meth:`forward`'s output and, for a backend with :attr:`lse`, each row's log-sum-exp over every key it
        attends (context and suffix: the softmax's joint normaliser), float32 ``[Hkv, B, G·q]``; else None."""
        return self.forward(call), None


BACKENDS: Registry[Backend] = Registry("attention backend", hint='Or "auto". List them with kvroute.engine.attention.'
                                                                 "BACKENDS.names().")

_B = TypeVar("_B", bound=type[Backend])


def register(cls: _B) -> _B:
    """Register an instance of the backend class ``cls`` under its name; a class decorator."""
    BACKENDS.add(cls())
    return cls


_ran: Counter[str] = Counter()
_ran_lock = threading.Lock()


def record(name: str) -> None:
    """Count one forward computed by backend ``name`` (read by :func:`ran`)."""
    with _ran_lock:
        _ran[name] += 1


def ran() -> dict[str, int]:
    """Per backend, how many layer forwards it computed in this process so far."""
    with _ran_lock:
        return dict(_ran)


def ran_since(before: Mapping[str, int]) -> dict[str, int]:
    """The forwards per backend computed since ``before`` (an earlier :func:`ran`), in registry order."""
    now = ran()
    return {n: now[n] - before.get(n, 0) for n in sorted(now, key=_order) if now[n] > before.get(n, 0)}


def _order(name: str) -> int:
    names = BACKENDS.names()
    return names.index(name) if name in names else len(names)
