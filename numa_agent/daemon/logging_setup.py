"""Logging for the agent: one stderr handler on the `numa_agent` logger.

Under systemd, stderr is connected to journald, which records its own timestamps and
reads a `<N>` syslog priority prefix at the start of each line. So when stderr *is* the
journal stream (JOURNAL_STREAM="dev:inode" matches stderr, as systemd.exec(5) advises to
check) lines carry `<N>` and no timestamp; in a terminal they carry a timestamp and the
level name. Every component logs to a child logger `numa_agent.<component>`.

Messages quote what anyone can choose (process names, user names, cgroup paths, the
errors that quote them), so both formats escape the message after its arguments are put
in (core.printable): a record stays one line, with no control character and no forged
line of its own; a traceback's lines are escaped each, its exceptions' messages first.
"""

from __future__ import annotations

import logging
import os
import sys
import traceback
from typing import Mapping, TextIO

from numa_agent.core.printable import printable

ROOT_LOGGER = "numa_agent"
LEVELS = ("debug", "info", "warning", "error", "critical")

# syslog priorities (sd-daemon.h): what journald understands in the <N> prefix.
_PRIORITY = {
    logging.DEBUG: 7,
    logging.INFO: 6,
    logging.WARNING: 4,
    logging.ERROR: 3,
    logging.CRITICAL: 2,
}


def get_logger(component: str) -> logging.Logger:
    """The logger for one component, e.g. get_logger("api") -> numa_agent.api."""
    return logging.getLogger(f"{ROOT_LOGGER}.{component}")


def _syslog_priority(levelno: int) -> int:
    for threshold in (logging.CRITICAL, logging.ERROR, logging.WARNING, logging.INFO):
        if levelno >= threshold:
            return _PRIORITY[threshold]
    return _PRIORITY[logging.DEBUG]


def _escape_messages(exc: traceback.TracebackException) -> None:
    """Each exception's message in the chain escaped, so that a message quoting a name
    with a newline cannot start a line of its own inside the traceback."""
    seen: set[int] = set()
    todo = [exc]
    while todo:
        te = todo.pop()
        if id(te) in seen:
            continue
        seen.add(id(te))
        if isinstance(getattr(te, "_str", None), str):
            # what format_exception_only shows after "Type: "
            te._str = printable(te._str)  # type: ignore[attr-defined]
        todo += [t for t in (te.__cause__, te.__context__, *(getattr(te, "exceptions", None) or ()))
                 if t is not None]


class EscapingFormatter(logging.Formatter):
    """A formatter whose record is one printable line, its traceback printable lines."""

    def format(self, record: logging.LogRecord) -> str:
        # The traceback text another handler cached on the record is not escaped: made anew.
        cached, record.exc_text = record.exc_text, None
        try:
            return super().format(record)
        finally:
            record.exc_text = cached

    def formatMessage(self, record: logging.LogRecord) -> str:
        raw = record.message
        record.message = printable(raw)
        try:
            return super().formatMessage(record)
        finally:
            record.message = raw  # other handlers format the record their own way

    def formatException(self, ei) -> str:
        exc = traceback.TracebackException(ei[0], ei[1], ei[2])
        _escape_messages(exc)
        return "\n".join(printable(line) for line in "".join(exc.format()).splitlines())

    def formatStack(self, stack_info: str) -> str:
        return "\n".join(printable(line) for line in stack_info.splitlines())


class JournalFormatter(EscapingFormatter):
    """`<N>logger: message`; every line of a multi-line record (tracebacks) gets the
    prefix, since journald makes one entry per line and would file the rest as info."""

    def __init__(self) -> None:
        super().__init__("%(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        prefix = f"<{_syslog_priority(record.levelno)}>"
        return "\n".join(prefix + line for line in super().format(record).splitlines() or [""])


_TERMINAL_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def is_journal_stream(stream: TextIO, env: Mapping[str, str]) -> bool:
    """True if `stream` is the journald connection systemd set up (JOURNAL_STREAM)."""
    value = env.get("JOURNAL_STREAM")
    if not value:
        return False
    try:
        dev, ino = (int(part) for part in value.split(":"))
        st = os.fstat(stream.fileno())
    except (ValueError, OSError, AttributeError):
        return False
    return st.st_dev == dev and st.st_ino == ino


class _AgentHandler(logging.StreamHandler):
    """The agent's own handler, told apart from anyone else's by its type."""


def check_level(level: str) -> str:
    """`level` as one of LEVELS (any case accepted); ValueError naming the valid ones."""
    name = level.strip().lower() if isinstance(level, str) else ""
    if name not in LEVELS:
        raise ValueError(f"invalid log level {level!r}; valid levels: {', '.join(LEVELS)}")
    return name


def setup_logging(
    level: str,
    *,
    stream: TextIO | None = None,
    env: Mapping[str, str] | None = None,
) -> logging.Logger:
    """Configure the `numa_agent` logger at `level` (debug|info|warning|error|critical,
    any case). Calling it again replaces the previous handler."""
    name = check_level(level)
    out = sys.stderr if stream is None else stream
    environ = os.environ if env is None else env

    handler = _AgentHandler(out)
    if is_journal_stream(out, environ):
        handler.setFormatter(JournalFormatter())
    else:
        handler.setFormatter(EscapingFormatter(_TERMINAL_FORMAT))

    logger = logging.getLogger(ROOT_LOGGER)
    for old in [h for h in logger.handlers if isinstance(h, _AgentHandler)]:  # a second call replaces ours
        logger.removeHandler(old)
    logger.addHandler(handler)
    logger.setLevel(name.upper())
    return logger
