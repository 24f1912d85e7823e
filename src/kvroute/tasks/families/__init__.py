"""The built-in task families, one module each, registered in :data:`FAMILIES` by name."""

from kvroute.tasks.families import (  # noqa: F401  (each module registers its family)
    base,
    coreference,
    hops,
    knowledge,
    long_context,
    multi_entity,
    multi_presence,
    niah,
)
from kvroute.tasks.family import FAMILIES, Family, TaskSpec, get_family

__all__ = ["FAMILIES", "Family", "TaskSpec", "get_family"]
