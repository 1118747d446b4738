"""Progress bars for the long phases (SFT collection and training, evaluation, RL).

One place decides how a bar looks and what happens without ``tqdm`` (it
ships with the ``train`` extra): the iterable runs unchanged, and
:class:`NullBar` stands in for a manual bar.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

__all__ = ["NullBar", "progress_bar"]


class NullBar:
    """The disabled bar: accepts tqdm's calls and does nothing."""

    def update(self, n: int = 1) -> None:
        pass

    def set_postfix(self, *args: Any, **kwargs: Any) -> None:
        pass

    def close(self) -> None:
        pass

    def __enter__(self) -> NullBar:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


def progress_bar(
    iterable: Iterable[Any] | None = None,
    *,
    desc: str,
    total: int | None = None,
    unit: str = "it",
    enabled: bool = True,
    leave: bool = True,
) -> Any:
    """A tqdm bar over ``iterable`` (or a manual one with ``total``) when ``enabled``.

    Disabled, or without tqdm: ``iterable`` itself, or a :class:`NullBar`.
    """
    if enabled:
        try:
            from tqdm.auto import tqdm
        except ImportError:  # pragma: no cover - tqdm is in the train extra
            pass
        else:
            return tqdm(
                iterable, desc=desc, total=total, unit=unit, leave=leave, dynamic_ncols=True
            )
    return iterable if iterable is not None else NullBar()
