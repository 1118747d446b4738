"""Keyword values checked against their annotations when an env is built.

``gym.make("VT-Search-v0", top_k="3")`` must fail at once, naming the keyword,
the type its builder declares and the value given, instead of a ``TypeError``
deep inside a tool at the first step. :func:`check_types` does that for every
keyword whose annotation it can read: plain types, ``X | None``, ``Literal``,
sequences and mappings of them, ``os.PathLike`` and classes. What it cannot judge
(``Any``, protocols, type variables) it accepts.
"""

from __future__ import annotations

import collections.abc as abc
import numbers
import os
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any

from vt_envs.errors import InvalidConfigError

__all__ = ["check_types", "describe", "keyword_hints", "matches"]

_SEQUENCES = (abc.Sequence, abc.MutableSequence, list, tuple, abc.Iterable, abc.Collection)
_MAPPINGS = (abc.Mapping, abc.MutableMapping, dict)


def keyword_hints(fn: Callable[..., Any]) -> dict[str, Any]:
    """``fn``'s parameter annotations, evaluated; ``{}`` when they cannot be (a name
    imported only for type checkers), so nothing is checked rather than everything
    refused."""
    try:
        return typing.get_type_hints(fn)
    except Exception:
        return {}


def matches(value: Any, hint: Any) -> bool:
    """Whether ``value`` is of the annotated type ``hint`` (``True`` when it cannot
    tell). Numbers follow the numeric tower (an ``int`` is a ``float``; a ``bool`` is
    neither); a string is not a sequence of strings; lists and tuples are sequences."""
    if hint is Any or hint is object or isinstance(hint, typing.TypeVar):
        return True
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Union or origin is types.UnionType:
        return any(matches(value, arg) for arg in args)
    if hint is None or hint is type(None):
        return value is None
    if origin is typing.Literal:
        return value in args
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, numbers.Integral) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, numbers.Real) and not isinstance(value, bool)
    if hint is str:
        return isinstance(value, str)
    if origin in _SEQUENCES or hint in _SEQUENCES:
        if isinstance(value, (str, bytes)) or not isinstance(value, abc.Iterable):
            return False
        if isinstance(value, (list, tuple)) and len(args) == 1:
            return all(matches(item, args[0]) for item in value)
        return True
    if origin in _MAPPINGS or hint in _MAPPINGS:
        return isinstance(value, abc.Mapping)
    if origin is os.PathLike or hint is os.PathLike:
        return isinstance(value, os.PathLike)
    if origin is abc.Callable or hint is abc.Callable:
        return callable(value)
    if isinstance(hint, type):
        try:
            return isinstance(value, hint)
        except TypeError:  # a protocol that is not runtime-checkable
            return True
    return True


def describe(hint: Any) -> str:
    """``hint`` as a reader writes it: ``int | None``, ``Sequence[str]``, ``RewardConfig``."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is None or hint is type(None):
        return "None"
    if origin is typing.Union or origin is types.UnionType:
        return " | ".join(describe(arg) for arg in args)
    if origin is typing.Literal:
        return " | ".join(repr(arg) for arg in args)
    if origin is not None:
        name = getattr(origin, "__name__", str(origin))
        inner = ", ".join("..." if a is Ellipsis else describe(a) for a in args)
        return f"{name}[{inner}]" if args else name
    return getattr(hint, "__name__", str(hint).replace("typing.", ""))


def check_types(where: str, kwargs: Mapping[str, Any], hints: Mapping[str, Any]) -> None:
    """Raise :class:`~vt_envs.errors.InvalidConfigError` for the first keyword in
    ``kwargs`` whose value does not match its annotation in ``hints``."""
    for key, value in kwargs.items():
        hint = hints.get(key)
        if hint is not None and not matches(value, hint):
            raise InvalidConfigError(
                f"{where}: {key} must be {describe(hint)}, got {value!r:.80} "
                f"({type(value).__name__})"
            )
