"""Logging for the agent: one stderr handler on the `numa_agent` logger.

Under systemd, stderr is connected to journald, which records its own timestamps and
reads a `<N>` syslog priority prefix at the start of each line. So when stderr *is* the
journal stream (JOURNAL_STREAM="dev:inode" matches stderr, as systemd.exec(5) advises to
check) lines carry `<N>` and no timestamp; in a terminal they carry a timestamp and the
level name. Every component logs to a child logger `numa_agent.<component>`.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Mapping, TextIO

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


class JournalFormatter(logging.Formatter):
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
        handler.setFormatter(logging.Formatter(_TERMINAL_FORMAT))

    logger = logging.getLogger(ROOT_LOGGER)
    for old in [h for h in logger.handlers if isinstance(h, _AgentHandler)]:  # a second call replaces ours
        logger.removeHandler(old)
    logger.addHandler(handler)
    logger.setLevel(name.upper())
    return logger
