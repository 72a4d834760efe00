"""Bounded fuzz of what users type and write: `numa-agent serve --config FILE ...` over
generated configuration files and flags, and numa-run's command line. Whatever the input,
no traceback reaches the user: every run ends with a documented exit status, and a failure
says so in one short line.

Derandomized, with a fixed number of examples, so that CI sees the same inputs every run.
In-process (a subprocess per example would take minutes): `serve` runs up to a started
agent on a simulated machine and stops it at once; every path it may write lies in the
example's own directory.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import re
import tempfile
from pathlib import Path
from unittest import mock

import msgspec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from numa_agent.cli import numa_agent, numa_run
from numa_agent.daemon import config as config_module
from numa_agent.daemon.startup import Agent
from tests.support.synthetic import make_topology
from tests.support.sysfs_writer import write_sysfs

FUZZ = settings(max_examples=100, derandomize=True, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
MAX_LINE = 1000  # "short": one line a person reads, not a dump
SERVE_EXITS = {0, 1, 2, 78}  # started, failed start, usage, EX_CONFIG (numa-agent(8))
NUMA_RUN_EXITS = {0, 125, 126, 127}  # -s/--help, own failure, not executable, not found (numa-run(1))
# Hostile names: what anyone may put in a process name, a user name or an argument, which
# every message quoting it must show escaped (core.printable): no terminal escape, no
# forged line, no bidi override, no undecodable byte.
HOSTILE = ["\x1b]0;owned\x07", "\x1b[2J", "web\r\nnuma-run: error: forged", "\u202eexe.txt", "a\x00b",
           "\x9b31m", "\udc9b", "\u2066x\u2069"]
hostile_texts = st.one_of(st.sampled_from(HOSTILE),
                          st.text(alphabet=st.one_of(st.sampled_from("\x1b\x07\r\n\x7f\x85\u202e"),
                                                     st.characters(codec="utf-8")), max_size=10))

# ---- configuration files -------------------------------------------------------------
_BARE = re.compile(r"[A-Za-z0-9_-]+")


def _key(name: str) -> str:
    return name if _BARE.fullmatch(name) else json.dumps(name)


def _value(value) -> str:
    """TOML for a generated value (json's string escapes are TOML's)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value) if value == value and abs(value) != float("inf") else "nan"
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    return "{" + ", ".join(f"{_key(k)} = {_value(v)}" for k, v in value.items()) + "}"


def _toml(doc: dict) -> str:
    lines = []
    for section, table in doc.items():
        if not isinstance(table, dict):
            lines.insert(0, f"{_key(section)} = {_value(table)}")
            continue
        lines.append(f"[{_key(section)}]")
        lines += [f"{_key(k)} = {_value(v)}" for k, v in table.items()]
    return "\n".join(lines) + "\n"


def _sections() -> dict[str, list[str]]:
    """Every section and its keys, as the file declares them (config.ConfigFile)."""
    out = {}
    for top in msgspec.structs.fields(config_module.ConfigFile):
        typ = top.type
        out[top.encode_name] = ([f.encode_name for f in msgspec.structs.fields(typ)]
                                if isinstance(typ, type) and issubclass(typ, msgspec.Struct) else ["gpu", "nic"])
    return out


SECTIONS = _sections()
PLAUSIBLE = ["static", "none", "Static", "best-effort", "single-numa-node", "pod", "0", "0-1", "0,32", "0-",
             "auto", "info", "debug", "0660", "0777", "refuse", "reconcile", "isolated", "1Gi", "2Mi", "all",
             "irqs", "unix:/nowhere/m.sock", "unix:rel.sock", "127.0.0.1:99999", "[::1]", "root",
             "no-such-group-here", "0x10de", "mlx5_core", "", " ", "\x00", "é", "a" * 300, *HOSTILE]
scalars = st.one_of(st.sampled_from(PLAUSIBLE), st.text(max_size=12), st.booleans(),
                    st.integers(min_value=-(2 ** 70), max_value=2 ** 70), st.floats())
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                        st.dictionaries(st.text(max_size=8), inner, max_size=3)),
                      max_leaves=8)


@st.composite
def config_documents(draw) -> dict:
    doc: dict = {}
    for section in draw(st.lists(st.sampled_from([*SECTIONS, "unknown"]), max_size=4, unique=True)):
        keys = SECTIONS.get(section, ["x"])
        chosen = draw(st.lists(st.one_of(st.sampled_from(keys), st.text(max_size=8)), max_size=4, unique=True))
        doc[section] = {key: draw(values) for key in chosen}
    return doc


def deep(levels: int) -> str:
    return "a = " + "[" * levels + "]" * levels + "\n"


config_texts = st.one_of(
    config_documents().map(_toml),
    st.text(max_size=200),  # not TOML at all, mostly
    st.integers(min_value=100, max_value=100_000).map(deep),
)
config_files = st.one_of(config_texts.map(lambda text: ("text", text.encode("utf-8", "surrogatepass"))),
                         st.binary(max_size=100).map(lambda raw: ("bytes", raw)),
                         st.sampled_from([("directory", b""), ("missing", b"")]))

# ---- serve's flags: paths only inside the example's directory -------------------------
PATHS = ["fresh", "file", "dir", "missing/deeper/x", "", " ", "rel"]
serve_flags = st.lists(st.one_of(
    st.tuples(st.sampled_from(["--state-dir", "--socket", "--pod-resources-socket", "--kubelet-state-dir"]),
              st.sampled_from(PATHS)),
    st.tuples(st.just("--sysfs-root"), st.sampled_from(["machine", "file", "dir", "missing", ""])),
    st.tuples(st.just("--cgroup-root"), st.sampled_from(["auto", "rel", "", "auto "])),
    st.tuples(st.just("--socket-group"), st.one_of(st.sampled_from(["root", "no-such-group-here", ""]),
                                                    st.text(max_size=10))),
    st.tuples(st.just("--metrics-address"), st.one_of(st.sampled_from(["", "127.0.0.1:0", "unix:m.sock",
                                                                        "unix:/", "9464", "[::1"]),
                                                       st.text(max_size=10))),
    st.tuples(st.just("--log-level"), st.one_of(st.sampled_from(["debug", "INFO", "chatty", ""]),
                                                 st.text(max_size=8))),
    st.tuples(st.sampled_from(["--no-hotplug", "--bogus"]), st.none()),
), max_size=5)


def _printable_lines(stderr: str) -> None:
    """No control character but the line ends, no bidi control, no lone surrogate."""
    bad = [ch for ch in stderr if ch != "\n" and (ch < " " or "\x7f" <= ch <= "\x9f" or "\ud800" <= ch <= "\udfff"
                                                or "\u202a" <= ch <= "\u202e" or "\u2066" <= ch <= "\u2069")]
    assert not bad, stderr


def _one_line_failure(stderr: str, prefix: str) -> None:
    assert "Traceback" not in stderr, stderr
    said = [line for line in stderr.splitlines() if line.startswith(prefix)]
    assert said, stderr
    assert len(said[-1]) <= MAX_LINE, said[-1]


@contextlib.contextmanager
def _agent_logging_kept():
    """serve configures the `numa_agent` logger; the tests after this one keep theirs."""
    logger = logging.getLogger("numa_agent")
    handlers, level = list(logger.handlers), logger.level
    try:
        yield
    finally:
        logger.handlers[:] = handlers
        logger.setLevel(level)


def _start_and_stop(self) -> int:
    self.start()
    self.stop()
    return 0


def _example_dir(base: Path) -> Path:
    work = Path(tempfile.mkdtemp(dir=base))
    (work / "file").write_text("not what was expected\n")
    (work / "dir").mkdir()
    return work


def test_serve_never_shows_a_traceback(tmp_path_factory):
    machine = write_sysfs(make_topology(sockets=2, cores_per_node=2, threads_per_core=1),
                          tmp_path_factory.mktemp("machine"))
    base = tmp_path_factory.mktemp("serve")

    @FUZZ
    @given(config=config_files, flags=serve_flags)
    def check(config, flags):
        work = _example_dir(base)
        kind, raw = config
        config_path = work / "config.toml"
        if kind == "directory":
            config_path.mkdir()
        elif kind != "missing":
            config_path.write_bytes(raw)
        argv = ["serve", "--config", str(config_path),
                # safe defaults first: a flag drawn below overrides them, in the example's directory
                "--sysfs-root", str(machine), "--cgroup-root", "auto", "--state-dir", "state",
                "--socket", "agent.sock", "--metrics-address", "", "--no-hotplug"]
        for flag, value in flags:
            argv += [flag] if value is None else [flag, str(machine) if value == "machine" else value]
        stderr = io.StringIO()
        cwd = os.getcwd()
        os.chdir(work)
        try:
            with _agent_logging_kept(), contextlib.redirect_stderr(stderr), \
                    contextlib.redirect_stdout(io.StringIO()), \
                    mock.patch.object(Agent, "run_until_signal", _start_and_stop):
                try:
                    code = numa_agent.main(argv)
                except SystemExit as exc:  # argparse: usage errors
                    code = exc.code
        finally:
            os.chdir(cwd)
        assert code in SERVE_EXITS, (code, argv, stderr.getvalue())
        assert "Traceback" not in stderr.getvalue()  # nor from a thread of a started agent
        _printable_lines(stderr.getvalue())
        if code != 0:
            _one_line_failure(stderr.getvalue(), "numa-agent")

    check()


# ---- numa-run ----------------------------------------------------------------------------
NODE_LISTS = ["0", "0,1", "0-1", "all", "+0", "!0", "", "-1", "0-", "99999999", "a"]
numa_run_options = st.lists(st.one_of(
    st.tuples(st.sampled_from(["--cpus", "--pod-cpus"]), st.one_of(st.integers(-5, 10**6).map(str),
                                                                   st.text(max_size=6))),
    st.tuples(st.sampled_from(["--memory", "--pod-memory"]), st.sampled_from(["1Gi", "512M", "0", "-1", "1Q",
                                                                              "99999999999Ei", ""])),
    st.tuples(st.sampled_from(["--hugepages", "--pod-hugepages", "--device", "--pod-device"]),
              st.sampled_from(["2Mi=1", "1Gi=4", "2048kB=1", "2M=1", "gpu=1", "gpu=-1", "=", "x", "../gpu=1"])),
    st.tuples(st.sampled_from(["-C", "-N", "-c", "-m", "-i", "-p", "-w"]), st.sampled_from(NODE_LISTS)),
    st.tuples(st.sampled_from(["--name", "--pod"]), st.one_of(st.sampled_from(["web", "a/b", "..", "Web", ""]),
                                                               st.text(max_size=10), hostile_texts)),
    st.tuples(st.just("--policy"), st.sampled_from(["none", "restricted", "strict", ""])),
    st.tuples(st.just("--isolate"), st.sampled_from(["irqs", "all", "irq", "idle,freq", ""])),
    st.tuples(st.sampled_from(["--shared", "--dry-run", "--json", "-v", "-l", "-s", "--isolate-strict",
                               "-H", "--huge", "--bogus"]), st.none()),
), max_size=6)
commands = st.sampled_from([[], ["--"], ["true"], ["--", "true", "x"], ["/nonexistent/program"],
                            ["/etc/passwd"], ["/"], ["no-such-program-here"],
                            *([name] for name in HOSTILE), ["--", "/tmp/\x1b]0;owned\x07", "x"]])


def test_numa_run_never_shows_a_traceback(tmp_path_factory, monkeypatch):
    socket_path = str(tmp_path_factory.mktemp("run") / "nobody.sock")  # no agent: nothing is booked
    monkeypatch.setenv("NUMA_AGENT_RETRY_SECONDS", "0")

    @FUZZ
    @given(options=numa_run_options, command=commands)
    def check(options, command):
        argv = ["--socket", socket_path]
        for option, value in options:
            argv += [option] if value is None else [option, value]
        argv += command
        stderr = io.StringIO()
        with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()), \
                mock.patch("os.execvp", side_effect=AssertionError("numa-run reached exec without an agent")):
            try:
                code = numa_run.main(argv)
            except SystemExit as exc:  # argparse: usage errors, --help
                code = exc.code
        assert code in NUMA_RUN_EXITS, (code, argv, stderr.getvalue())
        assert "Traceback" not in stderr.getvalue()
        _printable_lines(stderr.getvalue())
        if code != 0:
            _one_line_failure(stderr.getvalue(), "numa-run")

    check()
