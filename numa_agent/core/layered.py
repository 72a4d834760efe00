"""An immutable mapping derived from another by a few changes without copying it.

A state's name index and the cgroup layout are derived from the previous one
on every admission and release; copying a dict of a thousand entries each
time made the change cost the size of the node. `Layered` keeps the changes
in a small dict on top of a base shared with the mapping it came from, and
folds them into a new base once there are more than FOLD of them: a lookup is
at most two dict lookups, a change costs O(FOLD) plus, once in FOLD changes,
one copy of the base. Neither dict is changed after the mapping is made.
"""

from __future__ import annotations

from typing import Any, ItemsView, Iterable, Iterator, Mapping, TypeVar

K = TypeVar("K")
V = TypeVar("V")

FOLD = 64
_GONE = object()  # in the top layer: the key was removed


class Layered(Mapping[K, V]):
    __slots__ = ("_base", "_top", "_len")

    def __init__(self, items: Mapping[K, V] | Iterable[tuple[K, V]] = ()) -> None:
        self._base: dict[K, V] = dict(items)
        self._top: dict[K, object] = {}
        self._len = len(self._base)

    def __getitem__(self, key: K) -> V:
        value = self._top.get(key, self)  # (self: not in the top layer)
        if value is self:
            return self._base[key]
        if value is _GONE:
            raise KeyError(key)
        return value  # type: ignore[return-value]

    def get(self, key: K, default: V | None = None) -> V | None:  # type: ignore[override]
        value = self._top.get(key, self)
        if value is self:
            return self._base.get(key, default)
        return default if value is _GONE else value  # type: ignore[return-value]

    def __contains__(self, key: object) -> bool:
        return _has(self._base, self._top, key)

    def __iter__(self) -> Iterator[K]:
        top = self._top
        for key in self._base:
            if key not in top:
                yield key
        for key, value in top.items():
            if value is not _GONE:
                yield key

    def items(self) -> ItemsView[K, V]:
        return _Items(self)

    def _items(self) -> Iterator[tuple[K, V]]:
        top = self._top
        for key, value in self._base.items():
            if key not in top:
                yield key, value
        for key, item in top.items():
            if item is not _GONE:
                yield key, item  # type: ignore[misc]

    def __len__(self) -> int:
        return self._len

    def updated(self, changes: Mapping[K, V] = {}, removed: Iterable[K] = ()) -> "Layered[K, V]":  # noqa: B006
        """A new mapping: this one with the `removed` keys gone, then `changes` set."""
        base, top, length = self._base, dict(self._top), self._len
        for key in removed:
            if _has(base, top, key):
                top[key] = _GONE
                length -= 1
        for key, value in changes.items():
            if not _has(base, top, key):
                length += 1
            top[key] = value
        out: Layered[K, V] = object.__new__(type(self))  # (a subclass stays one)
        out._len = length
        if len(top) > FOLD:
            folded: dict[K, object] = dict(base)
            for key, item in top.items():
                if item is _GONE:
                    folded.pop(key, None)
                else:
                    folded[key] = item
            base, top = folded, {}  # type: ignore[assignment]
        out._base, out._top = base, top
        return out


class _Items(ItemsView[K, V]):
    # Mapping's own would look every key up again: a layout is walked whole
    # when the pool changes.
    _mapping: Layered[K, V]

    def __iter__(self) -> Iterator[tuple[K, V]]:
        return self._mapping._items()


def _has(base: Mapping[Any, Any], top: Mapping[Any, object], key: object) -> bool:
    value = top.get(key, top)
    return key in base if value is top else value is not _GONE
