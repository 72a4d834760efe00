"""numa-run's argparse parser class, imported only when argparse reads the command
line (help, --version, errors, forms numa_agent.cli.launch_args leaves to it) or
for the man page and completions: argparse is not on the common launch path.
numa_run.build_parser gives it what its errors need, so that it imports nothing of
numa_run's."""

from __future__ import annotations

import argparse
import sys

from numa_agent.cli import common

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing
if TYPE_CHECKING:
    from typing import Any, Callable, NoReturn


class Parser(argparse.ArgumentParser):
    """An error is one line, `PROG: error: ...`, after the usage, and exits with
    `exit_status`; `explain(argument)` may word an unrecognised argument better."""

    built = False  # set once every option is added

    def __init__(self, *, exit_status: int, explain: Callable[[str], str | None],
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.exit_status = exit_status
        self.explain = explain

    def _get_formatter(self) -> argparse.HelpFormatter:
        # argparse makes a formatter on each add_argument only to check the metavar, and a
        # formatter without a width imports shutil (zlib, bz2, lzma) to ask the terminal's:
        # a fixed width for those checks, the terminal's for help and usage.
        if not self.built:
            return self.formatter_class(prog=self.prog, width=78)  # type: ignore[call-arg]
        return super()._get_formatter()

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        prefix = "unrecognized arguments: "
        if message.startswith(prefix):
            known = (self.explain(a) for a in message[len(prefix):].split())
            message = next((m for m in known if m), message)
        common.print_error(self.prog, message)
        sys.exit(self.exit_status)
