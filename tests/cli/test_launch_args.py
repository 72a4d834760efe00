"""numa-run's launch parser (numa_agent.cli.launch_args) against its argparse parser:
over a broad corpus of command lines it answers exactly as argparse does, or leaves
the line to argparse (None), never a different answer. Derandomized."""

from __future__ import annotations

import argparse
import contextlib
import io
import itertools
import shlex

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from numa_agent.cli import launch_args, numa_run
from numa_agent.cli.launch_args import SPECS, Spec

CORPUS = settings(max_examples=1500, derandomize=True, deadline=None, database=None,
                  suppress_health_check=[HealthCheck.too_slow])


def by_argparse(argv: list[str]):
    """argparse's answer: its namespace, or ("exit", status) for help, version or an error."""
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        try:
            return numa_run.argparse_args(argv)
        except SystemExit as exc:
            return ("exit", exc.code)


def check_same_or_unsure(argv: list[str]) -> bool:
    """True when launch_args answered (the same as argparse), False when it left it."""
    fast = launch_args.parse(list(argv))
    if fast is None:
        return False
    slow = by_argparse(list(argv))
    assert isinstance(slow, argparse.Namespace), (argv, fast, slow)
    assert vars(fast) == vars(slow), argv
    return True


# ---------------------------------------------------------------- the option table
def test_the_table_holds_every_option_argparse_has_as_argparse_has_it():
    kinds = {argparse._StoreTrueAction: Spec.FLAG, argparse._StoreAction: Spec.STORE,
             argparse._AppendAction: Spec.APPEND}
    table = {spec.dest: spec for spec in SPECS}
    seen = set()
    for action in numa_run.build_parser()._actions:
        if isinstance(action, (argparse._HelpAction, argparse._VersionAction)) or action.dest == "command":
            continue
        spec = table[action.dest]
        seen.add(action.dest)
        assert set(spec.strings) == set(action.option_strings), action.dest
        assert spec.kind == kinds[type(action)], action.dest
        assert spec.default == action.default, action.dest
        assert spec.convert is (None if action.type is None else action.type), action.dest
        assert (spec.choices() if spec.choices else None) == action.choices, action.dest
    assert seen == set(table)


# ---------------------------------------------------------------- common forms, read fast
def documented_examples() -> list[list[str]]:
    """Every numa-run line of --help's examples (its explanation after two spaces left out),
    as the shell splits it."""
    return [shlex.split(line.strip().split("  ")[0])[1:] for line in numa_run.EXAMPLES.splitlines()
            if line.startswith("  numa-run ")]


COMMON = [
    ["--cpus", "1", "--", "true"], ["--shared", "--", "true"], ["--cpus=1", "true"],
    ["--cpus", "4", "--memory", "8Gi", "--", "./server", "--port", "8080"],
    ["--memory=512Mi", "--hugepages=2Mi=8", "--hugepages", "1Gi=1", "--device=gpu", "x"],
    ["-N1", "-m1", "--cpus", "2", "./app"], ["-C", "0-3", "-v", "--json", "--dry-run"],
    ["-c", "0", "-l", "x"], ["--cpubind=0", "--cpunodebind", "1", "x"], ["-s"], [],
    ["--socket", "/tmp/agent.sock", "--name", "web", "--pod", "p", "--pod-cpus", "2",
     "--pod-memory", "1G", "--pod-hugepages", "2Mi=1", "--pod-device", "gpu=1", "x"],
    ["--isolate", "irqs,idle", "--isolate-strict", "--cpus", "2", "x"],
    ["--numa-allocation-strategy", "most-allocated", "--policy", "restricted", "x"],
    ["-i", "all", "-w", "0,1", "-p", "0", "x"], ["--name", "", "x"], ["x", "-h", "--version"],
    ["--", "-x"], ["--cpus", "1", "--"], ["x"],
]


@pytest.mark.parametrize("argv", documented_examples() + COMMON, ids=" ".join)
def test_common_forms_are_read_without_argparse_and_as_argparse_reads_them(argv):
    assert check_same_or_unsure(argv), f"{argv} left to argparse"


@pytest.mark.parametrize("argv", [
    ["-h"], ["--help"], ["--version"], ["--cpus", "1", "--help", "x"], ["--cpu", "1", "x"],
    ["--mem", "1G", "x"], ["--bogus", "x"], ["-H"], ["-lv", "x"], ["--cpus"], ["--cpus", "-1"],
    ["--cpus", "0"], ["--cpus", "x"], ["--shared=1"], ["--policy", "strict"], ["-m=1"],
    ["--name", "--", "x"], ["--", "--", "x"], ["-", "x"], ["-1", "x"], ["--name=", "x"],
])
def test_what_argparse_must_answer_is_left_to_it(argv):
    assert launch_args.parse(argv) is None


# ---------------------------------------------------------------- the corpus
VALUES = ["0", "1", "2", "4", "0-3", "0,1", "!0", "+0", "all", "1Gi", "512M", "2Mi=1", "gpu=1",
          "gpu", "irqs", "none", "restricted", "least-allocated", "block", "web", "", "-1", "-x", "--",
          "a b", "=1", "1=", "x=y=z", "Ω", "99999999999999999999"]
OPTION_STRINGS = [s for spec in SPECS for s in spec.strings]
ODD_OPTIONS = ["-h", "--help", "--version", "--cpu", "--mem", "--sh", "--dry", "--bogus", "-H",
               "-x", "-lv", "-vs", "-sl", "-", "--json=", "--cpus=", "-C=1", "--pod-c", "-1"]
COMMANDS = [[], ["--"], ["true"], ["--", "true", "x"], ["--", "--", "x"], ["x", "--cpus", "2"],
            ["-", "x"], ["--", "-v"], ["", "x"], ["sh", "--", "-c"], ["x", "--p"],
            ["x", "--ver"], ["x", "--version"], ["x", "--", "--p"], ["x", "--pod-c=1"], ["x", "-cpus"],
            ["x", "--help=1"], ["x", "--socket=s"]]


def spelled(option: str, value: str | None, spelling: int) -> list[str]:
    """One option as typed: alone, with its value apart, after "=", or attached (-m1)."""
    if value is None:
        return [option]
    return [[option, value], [f"{option}={value}"], [option + value]][spelling]


option_words = st.one_of(
    st.builds(spelled, st.sampled_from(OPTION_STRINGS), st.one_of(st.none(), st.sampled_from(VALUES)),
              st.integers(0, 2)),
    st.builds(lambda option: [option], st.sampled_from(ODD_OPTIONS)),
)


@CORPUS
@given(options=st.lists(option_words, max_size=6), command=st.sampled_from(COMMANDS))
def test_generated_command_lines_get_argparse_answer_or_argparse(options, command):
    check_same_or_unsure([*itertools.chain.from_iterable(options), *command])


@pytest.mark.parametrize("option", OPTION_STRINGS)
def test_every_option_with_every_value_in_every_spelling(option):
    answered = 0
    for value, command in itertools.product([None, *VALUES], [[], ["--", "x"], ["x"]]):
        forms = [[option] if value is None else [option, value]]
        if value is not None:
            forms += [[f"{option}={value}"], [option + value]]
        for form in forms:
            answered += check_same_or_unsure([*form, *command])
    assert answered  # each option is read without argparse in some spelling
