"""numactl's node and CPU list forms, for -C/-N/-m/-i/-p/-w (pure).

As numactl(8) and libnuma read them:

- a kernel list, ``0-3,8`` (absolute ids);
- ``all``: every node or CPU of the allowed set (the caller's cpuset);
- ``+LIST``: positions in the allowed set, ``+0`` its lowest member;
- ``!LIST`` (``!+LIST``): every node or CPU of the machine except those.

Parsing (`parse_list_form`) needs only the text; `resolve` needs the machine's
and the allowed ids, which only the forms with ``all``, ``+`` or ``!`` use.
numactl takes no hex mask for -C (``0x3`` would be CPU 3 to it): a taskset
mask is refused here with the list it stands for.
"""

from __future__ import annotations

from numa_agent.core.cpuset import CpuSet, CpuSetParseError
from numa_agent.core.record import Record

MAX_ID_DIGITS = 5  # bounds each id before parsing, so "0-99999999" builds no huge mask


class ListFormError(ValueError):
    """Text that is not one of numactl's list forms, or does not fit the machine."""


class ListForm(Record):
    """A parsed list: `ids` are absolute ids, or positions when `relative`. A Record,
    not a dataclass: numa-run parses these before every launch."""

    __slots__ = ("text", "ids", "all", "relative", "invert")
    DEFAULTS = {"all": False, "relative": False, "invert": False}
    text: str
    ids: CpuSet
    all: bool
    relative: bool
    invert: bool

    @property
    def needs_context(self) -> bool:
        """Whether resolving it needs the machine's and the allowed ids."""
        return self.all or self.relative or self.invert


def parse_list_form(text: str, *, what: str = "CPU", highest: int = 8191) -> ListForm:
    """Parse numactl's list syntax; `what` names the ids in messages ("CPU", "NUMA node")."""
    body = text.strip()
    invert = body.startswith("!")
    body = body[1:] if invert else body
    relative = body.startswith("+")
    body = body[1:] if relative else body
    if body.lower().startswith("0x"):
        raise ListFormError(_hex_message(text, what))
    if body == "all":  # "+all" is libnuma's "all" too
        return ListForm(text, CpuSet(), all=True, invert=invert)
    ids = _plain_list(body, highest)
    if ids is None:
        example = "2-5,8" if what == "CPU" else "0 or 0,1 or 0-1"
        raise ListFormError(f"invalid {what} list {text!r}: expected e.g. {example}, all, "
                            f"+LIST (relative to the allowed set) or !LIST (all but these)")
    return ListForm(text, ids, relative=relative, invert=invert)


def resolve(form: ListForm, *, machine: CpuSet, allowed: CpuSet, what: str = "CPU") -> CpuSet:
    """The absolute ids a form names on a machine with this allowed set."""
    if form.all:
        chosen = allowed
    elif form.relative:
        members = allowed.ids()
        beyond = [i for i in form.ids if i >= len(members)]
        if beyond:
            raise ListFormError(f"{what} list {form.text!r}: position {beyond[0]} is beyond the "
                                f"{len(members)} allowed ({allowed.format() or 'none'})")
        chosen = CpuSet(members[i] for i in form.ids)
    else:
        chosen = form.ids
    result = machine - chosen if form.invert else chosen
    if not result:
        raise ListFormError(f"{what} list {form.text!r} names no {what} of this machine "
                            f"({machine.format() or 'none'}; allowed {allowed.format() or 'none'})")
    return result


def _plain_list(body: str, highest: int) -> CpuSet | None:
    numbers = body.replace("-", ",").replace(":", ",").split(",")
    if any(len(n.strip()) > MAX_ID_DIGITS or (n.strip().isdigit() and int(n) > highest)
           for n in numbers):
        return None
    try:
        parsed = CpuSet.parse(body)
    except CpuSetParseError:
        return None
    return parsed or None


def _hex_message(text: str, what: str) -> str:
    if what != "CPU":
        return f"invalid {what} list {text!r}: a hex mask is not a node list; write e.g. 0,1"
    try:
        listed = CpuSet.parse_mask(text.lstrip("!+")).format()
    except CpuSetParseError:
        listed = ""
    hint = f" ({text} is CPUs {listed})" if listed else ""
    return (f"invalid CPU list {text!r}: numactl's -C takes no hex mask, only a CPU list, "
            f"all, +LIST or !LIST{hint}; taskset's mask form is not accepted")
