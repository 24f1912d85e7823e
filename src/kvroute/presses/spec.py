"""Press specifications: ``scorer`` or ``scorer+selection``, each with optional ``[key=value,...]``, then any
serving constraints (``+paged[block=16]+uniform``, see :mod:`kvroute.presses.constraints`).

Examples: ``snapkv``, ``expected_attention+adakv``, ``snapkv[window_size=32]+chunk[chunk_length=256]``,
``oracle[base=knorm]+per_head``, ``mypkg.presses:MyPress[alpha=2]+adakv`` (a class by import path,
see :mod:`kvroute.presses.plugins`). Without a selection, the scorer's default is used: ``per_head``
(kvpress ScorerPress semantics) for most, the press's own way for presses that select their own way
(``kvzip``: ``global``). Parsing is separate from building, so configs can be validated before any model
loads.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Any, ClassVar

from kvroute.errors import ConfigError

# a name: registered (snapkv), or dotted with a colon (an import path, checked where it is resolved)
_PART = re.compile(r"^\s*([A-Za-z_][\w.:]*)\s*(?:\[(.*)\])?\s*$")
DEFAULT_SELECTION = "per_head"
#: names of the serving constraints (kvroute.presses.constraints registers them; a test holds the two equal)
CONSTRAINT_NAMES = frozenset({"paged", "uniform", "layer_budget"})


class Component:
    """What scorers, selections and constraints share: a dataclass whose fields are its user-visible parameters,
    written back as a :class:`ComponentSpec` that names only the parameters set away from their defaults."""

    name: ClassVar[str]

    @classmethod
    def parameters(cls) -> dict[str, Any]:
        """User-visible parameters and their defaults."""
        return {f.name: _field_default(f) for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else {}

    def spec(self) -> ComponentSpec:
        defaults = self.parameters()
        return ComponentSpec(self.name, tuple(sorted((k, getattr(self, k)) for k in defaults
                                                     if getattr(self, k) != defaults[k])))


def _field_default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        return f.default_factory()  # type: ignore[misc]
    return None


def _parse_value(text: str) -> Any:
    t = text.strip()
    low = t.lower()
    if low in ("true", "false"):
        return low == "true"
    if low in ("none", "null"):
        return None
    try:
        return int(t)
    except ValueError:
        pass
    try:
        return float(t)
    except ValueError:
        return t


@dataclass(frozen=True)
class ComponentSpec:
    """A registered name plus keyword parameters (sorted, so equal specs compare and hash equal)."""

    name: str
    params: tuple[tuple[str, Any], ...] = ()

    @property
    def kwargs(self) -> dict[str, Any]:
        return dict(self.params)

    def __str__(self) -> str:
        if not self.params:
            return self.name
        return f"{self.name}[{','.join(f'{k}={v}' for k, v in self.params)}]"


@dataclass(frozen=True)
class PressSpec:
    """A scorer and a selection; ``selection=None``: the scorer's own default (``per_head`` for most)."""

    scorer: ComponentSpec
    selection: ComponentSpec | None = None
    constraints: tuple[ComponentSpec, ...] = ()  # serving constraints, in order (kvroute.presses.constraints)

    def __str__(self) -> str:
        parts = [str(self.scorer), *([] if self.selection is None else [str(self.selection)])]
        return "+".join([*parts, *(str(c) for c in self.constraints)])


def _component(text: str, what: str, full: str) -> ComponentSpec:
    m = _PART.match(text)
    if not m:
        raise ConfigError(f"cannot read the {what} in press {full!r}; write NAME or NAME[key=value,...]")
    name, body = m.group(1), m.group(2)
    params: dict[str, Any] = {}
    if body:
        for item in body.split(","):
            if not item.strip():
                continue
            if "=" not in item:
                raise ConfigError(f"parameter {item.strip()!r} of {name!r} in press {full!r} needs the form key=value")
            k, v = item.split("=", 1)
            params[k.strip()] = _parse_value(v)
    return ComponentSpec(name, tuple(sorted(params.items())))


def parse_component(text: str, what: str = "component") -> ComponentSpec:
    """Parse one ``name`` or ``name[key=value,...]``."""
    return _component(text, what, text)


def parse_press(text: str) -> PressSpec:
    """Parse ``scorer[...]`` or ``scorer[...]+selection[...]`` (names are checked when built)."""
    if not isinstance(text, str) or not text.strip():
        raise ConfigError("a press must be a non-empty string such as 'snapkv' or 'expected_attention+adakv'")
    depth, parts, cur = 0, [], ""
    for ch in text:
        depth += ch == "["
        depth -= ch == "]"
        if ch == "+" and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    scorer = _component(parts[0], "scorer", text)
    rest = [_component(p, "selection or constraint", text) for p in parts[1:]]
    selection = rest.pop(0) if rest and rest[0].name not in CONSTRAINT_NAMES else None
    for c in rest:
        if c.name not in CONSTRAINT_NAMES:
            raise ConfigError(f"press {text!r}: {c.name!r} follows the selection, where only serving constraints "
                              f"may ({', '.join(sorted(CONSTRAINT_NAMES))}); write scorer+selection+constraint...")
    return PressSpec(scorer, selection, tuple(rest))
