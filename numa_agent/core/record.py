"""Record: a small immutable value class, for the values numa-run builds on every
launch (list forms, memory policies, their results).

Neither a dataclass (its import costs numa-run ~15 ms) nor a named tuple (collections
and the classes it makes cost ~3 ms): a subclass names its fields in `__slots__`
and their defaults in `DEFAULTS`; a record is built from them by position or name,
compares and hashes by its type and values, prints as `Name(field=value, ...)`, and
is not changed once built.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (numa-run starts fast)
if TYPE_CHECKING:
    from typing import Any


class Record:
    __slots__: tuple[str, ...] = ()
    DEFAULTS: dict[str, Any] = {}

    def __init__(self, *values: Any, **named: Any) -> None:
        name = type(self).__name__
        fields = self.__slots__
        if len(values) > len(fields):
            raise TypeError(f"{name}() takes {len(fields)} values, {len(values)} given")
        given = dict(zip(fields, values, strict=False))  # the rest from names or DEFAULTS
        for field, value in named.items():
            if field not in fields or field in given:
                raise TypeError(f"{name}() got an unexpected or repeated argument {field!r}")
            given[field] = value
        for field in fields:
            if field in given:
                object.__setattr__(self, field, given[field])
            elif field in self.DEFAULTS:
                object.__setattr__(self, field, self.DEFAULTS[field])
            else:
                raise TypeError(f"{name}() missing argument {field!r}")

    def values(self) -> tuple[Any, ...]:
        """The fields' values, in their order."""
        return tuple(getattr(self, field) for field in self.__slots__)

    def __setattr__(self, field: str, value: Any) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable")

    def __delattr__(self, field: str) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable")

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        assert isinstance(other, Record)
        return self.values() == other.values()

    def __hash__(self) -> int:
        return hash((type(self).__name__, self.values()))

    def __repr__(self) -> str:
        fields = ", ".join(f"{field}={getattr(self, field)!r}" for field in self.__slots__)
        return f"{type(self).__name__}({fields})"

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), self.values()  # copy and pickle build it anew
