"""A tiny typed registry: name → implementation, with helpful misses.

Algorithms (advantage estimators, policy losses, aggregation modes, KL
estimators, presets) and engines are registry entries, not if/else chains;
a misspelled name lists the valid ones with a "did you mean". A name of the
form ``"module:attr"`` imports the module (which may register more names) and
returns its attribute, so user code is usable by reference without editing VT.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from vt_envs.errors import UnknownNameError

__all__ = ["Registry"]

T = TypeVar("T")


class Registry(Generic[T]):
    """Names → objects of one kind (``kind`` names it in errors)."""

    def __init__(self, kind: str):
        self.kind = kind
        self._items: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator: ``@ADVANTAGES.register("grpo")``."""

        def add(obj: T) -> T:
            if name in self._items:
                raise ValueError(f"{self.kind} {name!r} is already registered")
            self._items[name] = obj
            return obj

        return add

    def get(self, name: str) -> T:
        """The entry ``name``, or the object ``"module:attr"`` references."""
        if name in self._items:
            return self._items[name]
        if isinstance(name, str) and ":" in name:
            from vt_envs.core.plugins import load_attr

            return load_attr(name)
        raise UnknownNameError(
            self.kind,
            name,
            self._items,
            hint="Register one first (imports: [my_module] in a recipe, --import on the "
            "command line) or name it as 'module:attr'.",
        )

    def names(self) -> list[str]:
        return sorted(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._items))
