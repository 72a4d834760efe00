"""CpuSet: the one immutable set-of-CPU-ids value used everywhere.

Backed by a Python int used as a bitmask, so union/intersection/difference on
1024-CPU machines are single big-int operations. Parses the kernel's list
syntax ("0-3,8-11") and comma-separated hex masks ("ff,ffffffff" as in
cpumap files); formats back to the shortest list.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (numa-run starts fast)
if TYPE_CHECKING:
    from typing import Iterable, Iterator


class CpuSetParseError(ValueError):
    """Raised for text that is neither a CPU list nor a CPU mask."""


def _clean(text: str | bytes) -> str:
    # Kernels emit trailing newlines and, on some versions, NUL bytes
    # ("0-3\n\0", "\0\n"); both are noise, not content.
    if isinstance(text, bytes):
        text = text.decode("ascii", errors="strict")
    return text.replace("\x00", "").strip()


def bits_of_ids(ids: Iterable[int], what: str) -> int:
    """The bitmask of `ids` (CPUs, NUMA nodes: bit i for id i); ValueError
    naming `what` for a negative id."""
    bits = 0
    for i in ids:
        i = int(i)
        if i < 0:
            raise ValueError(f"{what} id must be >= 0, got {i}")
        bits |= 1 << i
    return bits


class CpuSet:
    """An immutable, hashable, totally ordered-by-content set of CPU ids."""

    __slots__ = ("_bits", "_ids")

    def __init__(self, ids: Iterable[int] = ()) -> None:
        self._bits = bits_of_ids(ids, "CPU")
        self._ids: tuple[int, ...] | None = None

    # ---- constructors -------------------------------------------------
    @classmethod
    def from_bits(cls, bits: int) -> "CpuSet":
        if bits < 0:
            raise ValueError("bitmask must be non-negative")
        obj = cls.__new__(cls)
        obj._bits = bits
        obj._ids = None
        return obj

    @classmethod
    def union_of(cls, sets: Iterable["CpuSet"]) -> "CpuSet":
        """Every CPU of any of `sets`."""
        bits = 0
        for s in sets:
            bits |= s._bits
        return cls.from_bits(bits)

    @classmethod
    def parse(cls, text: str | bytes) -> "CpuSet":
        """Parse the kernel list syntax: "0-3,8-11", "", "5", with stray
        whitespace and NULs tolerated. Strides ("0-15:2") are accepted too."""
        s = _clean(text)
        if not s:
            return cls.from_bits(0)
        bits = 0
        for raw in s.split(","):
            part = raw.strip()
            if not part:
                raise CpuSetParseError(f"empty element in CPU list {s!r}")
            stride = 1
            if ":" in part:
                part, _, stride_text = part.partition(":")
                stride = _int(stride_text, s)
                if stride <= 0:
                    raise CpuSetParseError(f"bad stride in CPU list {s!r}")
            if "-" in part:
                lo_text, _, hi_text = part.partition("-")
                lo, hi = _int(lo_text, s), _int(hi_text, s)
                if hi < lo:
                    raise CpuSetParseError(f"descending range {part!r} in CPU list {s!r}")
                if stride == 1:
                    bits |= ((1 << (hi - lo + 1)) - 1) << lo
                else:
                    for cpu in range(lo, hi + 1, stride):
                        bits |= 1 << cpu
            else:
                bits |= 1 << _int(part, s)
        return cls.from_bits(bits)

    @classmethod
    def parse_mask(cls, text: str | bytes) -> "CpuSet":
        """Parse a cpumap-style hex mask: 32-bit words, most significant
        first, separated by commas ("00000000,0000ffff")."""
        s = _clean(text)
        if not s:
            return cls.from_bits(0)
        words = s.split(",")
        try:
            bits = 0
            for word in words:
                w = word.strip()
                if w.lower().startswith("0x"):
                    w = w[2:]
                if not w:
                    raise ValueError
                bits = (bits << (4 * len(w))) | int(w, 16)
        except ValueError:
            raise CpuSetParseError(f"not a CPU mask: {s!r}") from None
        return cls.from_bits(bits)

    # ---- views ---------------------------------------------------------
    @property
    def bits(self) -> int:
        return self._bits

    def ids(self) -> tuple[int, ...]:
        if self._ids is None:
            out = []
            bits = self._bits
            base = 0
            while bits:
                # Skip whole zero bytes quickly on sparse masks.
                if not bits & 0xFF:
                    shift = (bits & -bits).bit_length() - 1
                    bits >>= shift
                    base += shift
                    continue
                if bits & 1:
                    out.append(base)
                bits >>= 1
                base += 1
            self._ids = tuple(out)
        return self._ids

    def __iter__(self) -> Iterator[int]:
        return iter(self.ids())

    def __len__(self) -> int:
        return self._bits.bit_count()

    def __bool__(self) -> bool:
        return self._bits != 0

    def __contains__(self, cpu: object) -> bool:
        return isinstance(cpu, int) and cpu >= 0 and bool(self._bits >> cpu & 1)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CpuSet) and other._bits == self._bits

    def __hash__(self) -> int:
        return hash(("CpuSet", self._bits))

    def __repr__(self) -> str:
        return f"CpuSet({self.format()!r})"

    def __str__(self) -> str:
        return self.format()

    # ---- algebra ---------------------------------------------------------
    def __or__(self, other: "CpuSet") -> "CpuSet":
        return CpuSet.from_bits(self._bits | other._bits)

    def __and__(self, other: "CpuSet") -> "CpuSet":
        return CpuSet.from_bits(self._bits & other._bits)

    def __sub__(self, other: "CpuSet") -> "CpuSet":
        return CpuSet.from_bits(self._bits & ~other._bits)

    def __xor__(self, other: "CpuSet") -> "CpuSet":
        return CpuSet.from_bits(self._bits ^ other._bits)

    union = __or__
    intersection = __and__
    difference = __sub__

    def issubset(self, other: "CpuSet") -> bool:
        return self._bits & ~other._bits == 0

    def issuperset(self, other: "CpuSet") -> bool:
        return other._bits & ~self._bits == 0

    def isdisjoint(self, other: "CpuSet") -> bool:
        return self._bits & other._bits == 0

    def min(self) -> int:
        if not self._bits:
            raise ValueError("min() of an empty CpuSet")
        return (self._bits & -self._bits).bit_length() - 1

    def max(self) -> int:
        if not self._bits:
            raise ValueError("max() of an empty CpuSet")
        return self._bits.bit_length() - 1

    # ---- formatting ------------------------------------------------------
    def format(self) -> str:
        """Shortest kernel list form: consecutive ids collapse to ranges."""
        parts = []
        ids = self.ids()
        i = 0
        n = len(ids)
        while i < n:
            j = i
            while j + 1 < n and ids[j + 1] == ids[j] + 1:
                j += 1
            # Like the kernel's bitmap_print_to_pagebuf: any run of 2+ is a range.
            parts.append(str(ids[i]) if j == i else f"{ids[i]}-{ids[j]}")
            i = j + 1
        return ",".join(parts)

    def format_mask(self) -> str:
        """cpumap-style hex mask in comma-separated 32-bit words."""
        bits = self._bits
        words = []
        while True:
            words.append(f"{bits & 0xFFFFFFFF:08x}")
            bits >>= 32
            if not bits:
                break
        return ",".join(reversed(words))


def _int(text: str, whole: str) -> int:
    t = text.strip()
    if not t.isdigit():
        raise CpuSetParseError(f"not a CPU list: {whole!r}")
    return int(t)


EMPTY = CpuSet()
