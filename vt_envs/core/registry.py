"""One typed registry: name → implementation, with helpful misses and plugins by name.

Every registry VT reads by name is a :class:`Registry`: tools (``tool_registry``),
advantage estimators, policy losses, KL estimators, presets and rollout engines
(``vt_train``). A misspelled name lists the valid ones with a "did you mean"; a
name of the form ``"module:attr"`` imports the module (which may register more
names) and returns its attribute, so user code is usable by reference without
editing VT. An entry may be registered lazily as a ``"module:attr"`` string
(imported on first use), and a registry may also read an entry-point group
(third-party packages), on its first lookup.
"""

from __future__ import annotations

from collections.abc import Iterator
from importlib.metadata import entry_points
from typing import Any, Generic, TypeVar

from vt_envs.core.plugins import load_attr
from vt_envs.errors import UnknownNameError

__all__ = ["Registry"]

T = TypeVar("T")
_MISSING: Any = object()


class Registry(Generic[T]):
    """Names → objects of one kind (``kind`` names it in errors).

    Args:
        kind: what an entry is, for messages (``"advantage estimator"``).
        entry_point_group: also read the entry points of this group (their values
            are ``"module:attr"``), lazily, on the first lookup.
        replace: whether registering a taken name replaces it (else ``ValueError``).
        hint: appended to the message of a missed lookup.
    """

    def __init__(
        self,
        kind: str,
        *,
        entry_point_group: str | None = None,
        replace: bool = False,
        hint: str = "Register one first (imports: [my_module] in a recipe, --import on the "
        "command line) or name it as 'module:attr'.",
    ):
        self.kind, self.entry_point_group, self.replace, self.hint = (
            kind, entry_point_group, replace, hint,
        )  # fmt: skip
        self._items: dict[str, T | str] = {}
        self._entry_points_read = entry_point_group is None

    def register(self, name: str, obj: T | str = _MISSING) -> Any:
        """Register ``obj`` (or a lazy ``"module:attr"`` string) as ``name``; without
        ``obj``, a decorator: ``@ADVANTAGES.register("grpo")``."""

        def add(value: T | str) -> T | str:
            if name in self._items and not self.replace:
                raise ValueError(f"{self.kind} {name!r} is already registered")
            self._items[name] = value
            return value

        return add if obj is _MISSING else add(obj)

    def get(self, name: str) -> T:
        """The entry ``name``, or the object ``"module:attr"`` references.

        Raises:
            UnknownNameError: neither (the message lists the names, with "did you mean").
        """
        self._read_entry_points()
        if name in self._items:
            entry = self._items[name]
            if isinstance(entry, str):  # registered lazily
                entry = self._items[name] = self._load(entry)
            return entry  # type: ignore[return-value]
        if isinstance(name, str) and ":" in name:
            return self._load(name)
        raise self._missing(name)

    def names(self) -> list[str]:
        self._read_entry_points()
        return sorted(self._items)

    def __contains__(self, name: object) -> bool:
        self._read_entry_points()
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def _missing(self, name: str) -> Exception:
        return UnknownNameError(self.kind, name, self._items, hint=self.hint)

    def _load(self, reference: str) -> Any:
        return load_attr(reference)

    def _read_entry_points(self) -> None:
        if self._entry_points_read:
            return
        self._entry_points_read = True
        for point in entry_points(group=self.entry_point_group):
            self._items.setdefault(point.name, point.value)
