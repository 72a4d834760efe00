import logging
import os
import sys

import pytest

from numa_agent.daemon.logging_setup import get_logger, setup_logging


@pytest.fixture(autouse=True)
def restore_logger():
    logger = logging.getLogger("numa_agent")
    handlers, level = list(logger.handlers), logger.level
    yield
    logger.handlers[:] = handlers
    logger.setLevel(level)


def _journal_env(stream):
    st = os.fstat(stream.fileno())
    return {"JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}"}


def _lines(path):
    return path.read_text().splitlines()


def test_terminal_format_has_timestamp_level_and_name(tmp_path):
    out = tmp_path / "err"
    with open(out, "w") as stream:
        setup_logging("info", stream=stream, env={})
        get_logger("api").info("listening on %s", "/run/numa-agent/agent.sock")
        get_logger("api").debug("not shown at info")
    (line,) = _lines(out)
    assert line.endswith(" INFO numa_agent.api: listening on /run/numa-agent/agent.sock")
    assert line[:4].isdigit()  # starts with the date


def test_journald_gets_priorities_and_no_timestamp(tmp_path):
    out = tmp_path / "err"
    with open(out, "w") as stream:
        setup_logging("DEBUG", stream=stream, env=_journal_env(stream))
        log = get_logger("admission")
        log.debug("d")
        log.info("i")
        log.warning("w")
        log.error("e")
        log.critical("c")
    assert _lines(out) == [
        "<7>numa_agent.admission: d",
        "<6>numa_agent.admission: i",
        "<4>numa_agent.admission: w",
        "<3>numa_agent.admission: e",
        "<2>numa_agent.admission: c",
    ]


def test_journald_prefixes_every_traceback_line(tmp_path):
    out = tmp_path / "err"
    with open(out, "w") as stream:
        setup_logging("info", stream=stream, env=_journal_env(stream))
        try:
            raise RuntimeError("boom")
        except RuntimeError:
            get_logger("state").exception("checkpoint failed")
    lines = _lines(out)
    assert lines[0] == "<3>numa_agent.state: checkpoint failed"
    assert len(lines) > 2 and all(line.startswith("<3>") for line in lines)
    assert lines[-1] == "<3>RuntimeError: boom"


def test_journal_stream_of_another_file_is_not_journald(tmp_path):
    other = tmp_path / "other"
    other.write_text("")
    st = os.stat(other)
    out = tmp_path / "err"
    with open(out, "w") as stream:
        setup_logging("info", stream=stream, env={"JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}"})
        get_logger("x").info("hello")
    (line,) = _lines(out)
    assert not line.startswith("<") and line.endswith("INFO numa_agent.x: hello")


def test_second_setup_replaces_handler(tmp_path):
    out = tmp_path / "err"
    with open(out, "w") as stream:
        setup_logging("info", stream=stream, env={})
        setup_logging("warning", stream=stream, env={})
        get_logger("x").info("hidden")
        get_logger("x").warning("once")
    assert len(_lines(out)) == 1


def test_bad_level_lists_valid_ones():
    with pytest.raises(ValueError, match=r"invalid log level 'verbose'; valid levels: debug, info, warning, error, critical"):
        setup_logging("verbose")


EVIL = "\x1b]0;owned\x07\r\n<3>numa_agent.api: forged\u202e"
SHOWN = "\\x1b]0;owned\\x07\\r\\n<3>numa_agent.api: forged\\u202e"


@pytest.mark.parametrize("journal", [True, False])
def test_a_record_quoting_a_hostile_name_is_one_printable_line(tmp_path, journal):
    out = tmp_path / "err"
    with open(out, "w", newline="") as stream:
        setup_logging("info", stream=stream, env=_journal_env(stream) if journal else {})
        get_logger("observe").warning("intruder on workload %s's exclusive CPU %d: pid %d tid %d (%s)",
                                      "web", 1, 7, 7, EVIL)
        get_logger("observe").warning(EVIL)  # the message itself, not only its arguments
    raw = out.read_bytes()
    assert not any(b < 0x20 and b != 0x0A for b in raw), raw
    lines = raw.decode().splitlines()
    assert len(lines) == 2
    assert lines[0].endswith(f"numa_agent.observe: intruder on workload web's exclusive CPU 1: pid 7 tid 7 ({SHOWN})")
    assert lines[1].endswith(f"numa_agent.observe: {SHOWN}")


def test_a_traceback_quoting_a_hostile_name_forges_no_line(tmp_path):
    out = tmp_path / "err"
    with open(out, "w") as stream:
        setup_logging("info", stream=stream, env=_journal_env(stream))
        try:
            try:
                raise KeyError(EVIL)
            except KeyError as inner:
                raise ValueError(f"no workload {EVIL}") from inner
        except ValueError:
            get_logger("api").exception("request failed for %s", EVIL)
    lines = _lines(out)
    assert lines[0] == f"<3>numa_agent.api: request failed for {SHOWN}"
    assert all(line.startswith("<3>") for line in lines)
    assert not [line for line in lines if "forged" in line and not line.startswith(("<3>ValueError", "<3>KeyError",
                                                                                    "<3>numa_agent.api: request"))]
    assert f"<3>ValueError: no workload {SHOWN}" in lines
    assert not any(ch < " " for line in lines for ch in line)


def test_a_traceback_another_handler_cached_raw_is_escaped_anew(tmp_path):
    out = tmp_path / "err"
    with open(out, "w") as stream:
        setup_logging("info", stream=stream, env={})
        try:
            raise ValueError(EVIL)
        except ValueError:
            record = logging.getLogger("numa_agent.api").makeRecord(
                "numa_agent.api", logging.ERROR, __file__, 1, "failed", (), sys.exc_info())
        record.exc_text = logging.Formatter().formatException(record.exc_info)  # raw, as a plain handler caches it
        logging.getLogger("numa_agent.api").handle(record)
    text = out.read_text()
    assert f"ValueError: {SHOWN}" in text
    assert not any(ch < " " and ch != "\n" for ch in text)
