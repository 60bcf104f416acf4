"""An immutable int-keyed mapping for the router's placement (router.py)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

_GONE = object()  # an overlay entry for a removed key


class FrozenMap:
    """An immutable int-keyed mapping: a base dict that is never changed once made, and a small
    overlay of changes to it. ``updated`` copies the overlay only, and folds it into a new base
    once it passes an eighth of the base: a change of b keys costs O(b) amortized."""

    __slots__ = ("_base", "_over", "_len")

    def __init__(self, base: dict | None = None, over: dict | None = None,
                 length: int | None = None):
        self._base = {} if base is None else base
        self._over = {} if over is None else over
        self._len = len(self._base) if length is None else length

    def get(self, key: int, default: Any = None) -> Any:
        v = self._over.get(key, self)
        if v is self:
            return self._base.get(key, default)
        return default if v is _GONE else v

    def __contains__(self, key: int) -> bool:
        return self.get(key, _GONE) is not _GONE

    def __len__(self) -> int:
        return self._len

    def items(self) -> Iterator[tuple[int, Any]]:
        over = self._over
        for k, v in self._base.items():
            if k not in over:
                yield k, v
        for k, v in over.items():
            if v is not _GONE:
                yield k, v

    def keys(self) -> Iterator[int]:
        return (k for k, _ in self.items())

    def values(self) -> Iterator[Any]:
        return (v for _, v in self.items())

    def to_dict(self) -> dict:
        return dict(self.items())

    def updated(self, sets: dict | Iterable[tuple[int, Any]] = (),
                deletes: Iterable[int] = ()) -> FrozenMap:
        over, n = dict(self._over), self._len
        for k, v in (sets.items() if isinstance(sets, dict) else sets):
            n += k not in self
            over[k] = v
        for k in deletes:
            if k in self:
                n -= 1
                over[k] = _GONE
        if len(over) > max(1024, len(self._base) // 8):
            out = FrozenMap(self._base, over, n)
            return FrozenMap(out.to_dict())
        return FrozenMap(self._base, over, n)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, FrozenMap):
            other = other.to_dict()
        return isinstance(other, dict) and self.to_dict() == other

    __hash__ = None  # type: ignore[assignment]
