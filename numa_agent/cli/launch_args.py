"""numa-run's command line in its common forms, read without argparse.

argparse (with re, enum, gettext and locale, which it imports) costs a launch more
than the interpreter's own start, so numa-run reads the forms a launch uses here:
the options it documents as `--opt value`, `--opt=value`, `-X value` or `-Xvalue`,
flags alone, then `--` or the first word that is not an option, and the command.
`parse` returns what numa-run's argparse parser would, attribute for attribute,
or None whenever it is not certain to: `-h`, `--version`, an unknown option or
an abbreviation, a value missing or starting with "-", flags run together, a
value its option refuses. numa-run then asks argparse, whose help, errors and
exit statuses are the reference. tests/cli/test_launch_args.py holds the two
parsers to the same answers.
"""

from __future__ import annotations

from numa_agent.cli import common

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (numa-run starts fast)
if TYPE_CHECKING:
    # For the type checker the same attribute bag as argparse's Namespace.
    from argparse import Namespace as Options
    from typing import Any, Callable


if not TYPE_CHECKING:
    class Options:
        """The parsed options as attributes, like argparse.Namespace (equal to one
        holding the same attributes)."""

        def __init__(self, **values):
            self.__dict__.update(values)

        def __eq__(self, other):
            return hasattr(other, "__dict__") and vars(self) == vars(other)

        __hash__ = None  # mutable, as argparse.Namespace

        def __contains__(self, key):
            return key in self.__dict__

        def __repr__(self):
            return "Options(" + ", ".join(f"{k}={v!r}" for k, v in self.__dict__.items()) + ")"


def _policy_names() -> tuple[str, ...]:
    from numa_agent.core.policy import POLICY_NAMES  # enum: only when --policy is given
    return POLICY_NAMES


def _strategy_names() -> tuple[str, ...]:
    from numa_agent.core.policy import STRATEGY_NAMES
    return STRATEGY_NAMES


class Spec:
    """One option as argparse holds it: its spellings, where it goes, how its value
    is read (`convert`, None for the text itself) and checked (`choices`, read when
    the option is given), and whether it is a flag, a single value or repeatable."""

    __slots__ = ("strings", "dest", "kind", "convert", "choices", "default")
    FLAG, STORE, APPEND = "flag", "store", "append"

    def __init__(self, strings: tuple[str, ...], dest: str, kind: str = STORE,
                 convert: Callable[[str], Any] | None = None,
                 choices: Callable[[], tuple[str, ...]] | None = None, default: Any = None) -> None:
        self.strings, self.dest, self.kind = strings, dest, kind
        self.convert, self.choices = convert, choices
        self.default = False if kind == Spec.FLAG else default


# Every option of numa_run.build_parser but -h and --version, in its order.
SPECS = (
    Spec(("--cpus",), "cpus", convert=common.exclusive_cpu_count, default=0),
    Spec(("--shared",), "shared", Spec.FLAG),
    Spec(("--memory",), "memory", convert=common.parse_size, default=0),
    Spec(("--hugepages",), "hugepages", Spec.APPEND, common.hugepages_item),
    Spec(("--device",), "device", Spec.APPEND, common.device_item),
    Spec(("--policy",), "policy", choices=_policy_names),
    Spec(("--numa-allocation-strategy",), "numa_allocation_strategy", choices=_strategy_names),
    Spec(("--name",), "name"),
    Spec(("-C", "--physcpubind"), "physcpubind", convert=common.cpu_list),
    Spec(("-c", "--cpubind", "-N", "--cpunodebind"), "cpunodebind", convert=common.node_list),
    Spec(("-m", "--membind"), "membind", convert=common.node_list),
    Spec(("--pod",), "pod"),
    Spec(("--pod-cpus",), "pod_cpus", convert=common.cpu_count),
    Spec(("--pod-memory",), "pod_memory", convert=common.parse_size),
    Spec(("--pod-hugepages",), "pod_hugepages", Spec.APPEND, common.hugepages_item),
    Spec(("--pod-device",), "pod_device", Spec.APPEND, common.device_item),
    Spec(("--isolate",), "isolate", convert=common.isolate_kinds),
    Spec(("--isolate-strict",), "isolate_strict", Spec.FLAG),
    Spec(("--socket",), "socket"),
    Spec(("--tasks",), "tasks", convert=common.task_count),
    Spec(("--distribution",), "distribution", choices=lambda: ("block", "cyclic")),
    Spec(("-i", "--interleave"), "interleave", convert=common.node_list),
    Spec(("-p", "--preferred"), "preferred", convert=common.node_list),
    Spec(("-l", "--localalloc"), "localalloc", Spec.FLAG),
    Spec(("-w", "--weighted-interleave"), "weighted_interleave", convert=common.node_list),
    Spec(("-s", "--show"), "show", Spec.FLAG),
    Spec(("--dry-run",), "dry_run", Spec.FLAG),
    Spec(("--json",), "json", Spec.FLAG),
    Spec(("-v", "--verbose"), "verbose", Spec.FLAG),
)
BY_STRING = {string: spec for spec in SPECS for string in spec.strings}
# argparse's own options, left to it; it also reads them to tell an abbreviation.
ARGPARSE_ONLY = ("-h", "--help", "--version")


class _Unsure(Exception):
    """A form left to argparse."""


def parse(argv: list[str]) -> Options | None:
    """numa-run's options and command from `argv`, as numa_run.parse_args returns
    them (the command without a leading `--`); None when argparse must decide."""
    values: dict[str, Any] = {spec.dest: spec.default for spec in SPECS}
    command: list[str] = []
    try:
        i = 0
        while i < len(argv):
            arg = argv[i]
            if arg == "--":
                command = argv[i + 1:]
                if command[:1] == ["--"]:
                    raise _Unsure  # argparse's versions differ over a second "--"
                break
            if not arg.startswith("-"):
                command = argv[i:]  # the command and all after it, options or not
                _check_command_words(command)
                break
            spec, value = _option(arg)
            if spec.kind != Spec.FLAG and value is None:
                if i + 1 == len(argv) or argv[i + 1].startswith("-"):
                    raise _Unsure  # a missing value, or one argparse may take for an option
                i += 1
                value = argv[i]
            _store(values, spec, value)
            i += 1
    except _Unsure:
        return None
    return Options(**values, command=list(command))


def _check_command_words(command: list[str]) -> None:
    """argparse reads every word before a `--`, the command's too, and refuses one
    that abbreviates two of its long options ("--p"): so must numa-run."""
    for word in command:
        if word == "--":
            return
        if word.startswith("--"):
            prefix = word.partition("=")[0]
            if prefix not in BY_STRING and sum(
                    s.startswith(prefix) for s in (*BY_STRING, *ARGPARSE_ONLY)) > 1:
                raise _Unsure


def _option(arg: str) -> tuple[Spec, str | None]:
    """The option `arg` names and the value written in it ("--memory=1Gi", "-m1"), if any."""
    if arg.startswith("--"):
        name, sep, value = arg.partition("=")
        spec = BY_STRING.get(name)
        if spec is None or (sep and (spec.kind == Spec.FLAG or not value or value[0] == "-")):
            # unknown, abbreviated, a flag given a value, a value empty or one argparse
            # may read otherwise ("--name=--" is no value to it)
            raise _Unsure
        return spec, value if sep else None
    spec = BY_STRING.get(arg[:2])
    attached = arg[2:]
    if spec is None or (attached and (spec.kind == Spec.FLAG or "=" in attached
                                      or attached[0] == "-")):
        raise _Unsure  # unknown, flags run together ("-lv"), "-m=1", "-m--"
    return spec, attached or None


def _store(values: dict[str, Any], spec: Spec, value: str | None) -> None:
    if spec.kind == Spec.FLAG:
        values[spec.dest] = True
        return
    assert value is not None
    try:
        converted = value if spec.convert is None else spec.convert(value)
    except Exception:
        raise _Unsure from None  # argparse words the error
    if spec.choices is not None and converted not in spec.choices():
        raise _Unsure
    if spec.kind == Spec.APPEND:
        values[spec.dest] = [*(values[spec.dest] or []), converted]
    else:
        values[spec.dest] = converted
