"""Name → object registries with did-you-mean errors.

A registry name is also the CLI and config name of the thing it registers, so the same spelling
works everywhere (``kvroute presses list`` shows exactly what a config may say).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar, overload

from kvroute.errors import KvrouteError, UnknownNameError

T = TypeVar("T")


class Registry(Generic[T]):
    """An ordered mapping of names to objects of one kind (``kind`` appears in error messages)."""

    def __init__(self, kind: str, hint: str = "") -> None:
        self.kind = kind
        self.hint = hint
        self._items: dict[str, T] = {}

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

    def get(self, name: str) -> T:
        try:
            return self._items[name]
        except KeyError:
            raise UnknownNameError(self.kind, name, self._items, self.hint) from None

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
