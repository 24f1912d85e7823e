"""The masked attention: one function registered in transformers' attention registry, backends behind it.

:mod:`~kvroute.engine.attention.forward` holds the registered function and the ``auto`` rule (:func:`choose`);
:mod:`~kvroute.engine.attention.backend` the :class:`Backend` interface and the :data:`BACKENDS` registry, whose
entries are siblings here: ``reference`` (the definition), ``sdpa`` (PyTorch's public fused attention with a boolean
mask), ``gathered`` (each cell's kept entries, gathered), ``chunked`` (online softmax over context chunks), ``fused``
(PyTorch's private fused CPU kernel, version-checked) and ``kept`` (the kept-entries C++ kernel).
"""

from kvroute.engine.attention import chunked, fused, gather, kept, reference, sdpa  # noqa: F401 - registers them
from kvroute.engine.attention.backend import (
    AUTO,
    BACKENDS,
    AttentionCall,
    Availability,
    Backend,
    BackendChoice,
    check_backend_name,
    ran,
    ran_since,
    resolve_backend,
)
from kvroute.engine.attention.context import MaskedContext
from kvroute.engine.attention.forward import IMPLEMENTATION, _masked_attention_forward, _state, choose, masked_attention

__all__ = ["AUTO", "BACKENDS", "IMPLEMENTATION", "AttentionCall", "Availability", "Backend", "BackendChoice",
           "MaskedContext", "_masked_attention_forward", "_state", "check_backend_name", "choose", "masked_attention",
           "ran", "ran_since", "resolve_backend"]
