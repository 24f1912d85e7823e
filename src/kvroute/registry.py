"""Name → object registries with did-you-mean errors.

A registry name is also the CLI and config name of the thing it registers, so the same spelling
works everywhere (``kvroute presses list`` shows exactly what a config may say). A registry may also
look further than what was registered (the scorers: a class by import path, installed plugins):
``resolve`` is asked for a name that is not registered, so every caller of :meth:`Registry.get`
sees those names without a special case of its own.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Generic, TypeVar, overload

from kvroute.errors import KvrouteError, UnknownNameError

T = TypeVar("T")


class Registry(Generic[T]):
    """An ordered mapping of names to objects of one kind (``kind`` appears in error messages)."""

    def __init__(self, kind: str, hint: str = "", *, resolve: Callable[[str], T | None] | None = None,
                 more_names: Callable[[], Iterable[str]] | None = None) -> None:
        """``resolve(name)``: the object for a name that is not registered, None if there is none (it may
        raise its own error, e.g. for an import path that does not import); ``more_names()``: the names
        it knows, offered as suggestions beside the registered ones."""
        self.kind = kind
        self.hint = hint
        self._items: dict[str, T] = {}
        self._resolve = resolve
        self._more_names = more_names

    def fall_back_to(self, resolve: Callable[[str], T | None], more_names: Callable[[], Iterable[str]]) -> None:
        """Set ``resolve`` and ``more_names`` (see ``__init__``) after construction, once: for a fallback that
        lives in a module built on the registered entries (kvroute's press plugins)."""
        if self._resolve is not None or self._more_names is not None:
            raise KvrouteError(f"the {self.kind} registry already has a fallback")
        self._resolve, self._more_names = resolve, more_names

    @overload
    def register(self, name: str) -> Callable[[T], T]: ...
    @overload
    def register(self, name: str, obj: T) -> T: ...

    def register(self, name: str, obj: T | None = None):  # type: ignore[no-untyped-def]
        """Register ``obj`` under ``name``; usable as a decorator when ``obj`` is omitted."""

        def add(o: T) -> T:
            if name in self._items:
                raise KvrouteError(f"{self.kind} {name!r} is registered twice")
            self._items[name] = o
            return o

        return add if obj is None else add(obj)

    def add(self, obj: T) -> T:
        """Register ``obj`` under its own ``name`` attribute (a class that names itself); a decorator.

        The name is written once, on the class, and read from there, so a class and its registry entry
        cannot disagree."""
        name = getattr(obj, "name", None)
        if not isinstance(name, str) or not name:
            raise KvrouteError(f"{obj!r} has no name attribute to register it by in the {self.kind} registry")
        return self.register(name, obj)

    def get(self, name: str) -> T:
        if name in self._items:
            return self._items[name]
        found = self._resolve(name) if self._resolve is not None else None
        if found is not None:
            return found
        more = [n for n in self._more_names() if n not in self._items] if self._more_names is not None else []
        raise UnknownNameError(self.kind, name, [*self._items, *more], self.hint)

    def names(self) -> list[str]:
        return list(self._items)

    def items(self) -> list[tuple[str, T]]:
        return list(self._items.items())

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)
