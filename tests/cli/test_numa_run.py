from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from numa_agent.cli import common
from numa_agent.cli.numa_run import main, parse_args, workload_env

REPO = Path(__file__).parents[2]


# ------------------------------------------------------------ parsing
@pytest.mark.parametrize("text,expected", [
    ("4096", 4096), ("512M", 512 * 10 ** 6), ("512Mi", 512 << 20), ("16Gi", 16 << 30),
    ("1G", 10 ** 9), ("0", 0),
])
def test_parse_size_is_core_units_rule(text, expected):
    # The unit table itself is tested in tests/core/test_units.py; this is the argparse wrapper.
    assert common.parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "M", "-1G", "12Q", "512m"])
def test_parse_size_rejects(text):
    with pytest.raises(argparse.ArgumentTypeError, match="invalid size"):
        common.parse_size(text)


@pytest.mark.parametrize("text,expected", [
    ("2Mi=512", ("2048", 512)), ("1Gi=4", ("1048576", 4)), ("2048kB=1", ("2048", 1)),
])
def test_hugepages_item(text, expected):
    assert common.hugepages_item(text) == expected


@pytest.mark.parametrize("text,message", [
    ("2Mi", "SIZE=COUNT"), ("512=1", "power of two"), ("2Mi=x", "hugepage count"),
    ("2Mi=-1", "hugepage count"), ("2M=1", "did you mean 2Mi"),
])
def test_hugepages_item_rejects(text, message):
    with pytest.raises(argparse.ArgumentTypeError, match=message):
        common.hugepages_item(text)


PARSE_TABLE = [
    (["--cpus", "4", "--", "./app", "-x"],
     {"cpus": 4}, ["./app", "-x"]),
    (["--cpus", "2", "sleep", "--cpus", "3"],
     {"cpus": 2}, ["sleep", "--cpus", "3"]),
    (["--memory", "512Mi", "--hugepages", "2Mi=8", "--hugepages", "1Gi=1", "true"],
     {"memory_bytes": 512 << 20, "hugepages": {"2048": 8, "1048576": 1}}, ["true"]),
    (["--device", "gpu=2", "--device", "nic", "x"],
     {"devices": {"gpu": 2, "nic": 1}}, ["x"]),
    (["-C", "3,0-1", "-N", "0,1", "-m", "1", "x"],
     {"physcpubind": "0-1,3", "cpunodebind": [0, 1], "membind": [1]}, ["x"]),
    (["--policy", "single-numa-node", "--name", "web-1", "x"],
     {"policy": "single-numa-node", "name": "web-1"}, ["x"]),
    (["--shared", "x"], {"shared": True}, ["x"]),
    (["--numa-allocation-strategy", "least-allocated", "--cpus", "1", "x"],
     {"numa_allocation_strategy": "least-allocated", "cpus": 1}, ["x"]),
    (["--pod", "p1", "--pod-cpus", "6", "--pod-memory", "1Gi", "--pod-device", "gpu=1",
      "--pod-hugepages", "2Mi=4", "--cpus", "2", "x"],
     {"pod": "p1", "cpus": 2, "pod_budget": {"cpus": 6, "memory_bytes": 1 << 30,
                                             "hugepages": {"2048": 4}, "devices": {"gpu": 1}}},
     ["x"]),
    (["-v", "--dry-run", "--json"], {}, []),
    (["--", "--weird-name"], {}, ["--weird-name"]),
    (["--cpus", "2", "--isolate", "idle,irqs", "x"], {"cpus": 2, "isolate": ["irqs", "idle"]}, ["x"]),
    (["-C", "3", "--isolate", "all", "--isolate-strict", "x"],
     {"physcpubind": "3", "isolate": ["irqs", "idle", "freq"], "isolate_strict": True}, ["x"]),
]


@pytest.mark.parametrize("argv,fields,command", PARSE_TABLE)
def test_option_parsing(argv, fields, command):
    args = parse_args(argv)
    assert args.command == command
    body = common.build_request(args, args.command)
    expected = {"cpus": 0, "shared": False, "memory_bytes": 0, "hugepages": {}, "devices": {},
                **fields}
    if command:
        expected["command"] = command
    assert body == expected


@pytest.mark.parametrize("argv,message", [
    (["--cpus", "two", "x"], "invalid CPU count"),
    (["--cpus", "9" * 20, "x"], f"invalid CPU count '{'9' * 20}': at most 18 digits"),  # a whole number
    (["--memory", "lots", "x"], "invalid size"),
    (["--policy", "always", "x"], "invalid choice"),
    (["-N", "a", "x"], "invalid NUMA node list"),
    (["-C", "0-99999999", "x"], "invalid CPU list"),
    (["--device", "=1", "x"], "invalid device"),
    (["--bogus", "x"], "unrecognized arguments"),
    (["--cpus", "1", "--isolate", "irq", "x"], "unknown isolation 'irq'"),
    # 0 would quietly mean the shared pool: said instead
    (["--cpus", "0", "x"], "argument --cpus: 0 exclusive CPUs is the shared pool: say --shared"),
    (["--cpus", "00", "--memory", "1Gi", "x"], "or leave --cpus out"),
])
def test_bad_option_exits_125(argv, message, capsys):
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 125
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("argv,message", [
    (["--shared", "--cpus", "2", "x"], "exclude each other"),
    (["--pod-cpus", "2", "x"], "need --pod NAME"),
    (["--device", "gpu=1", "--device", "gpu=2", "x"], "--device gpu given twice"),
    (["--cpus", "1", "--hugepages", "2Mi=1", "--hugepages", "2048kB=2", "x"],
     "--hugepages 2 MiB (2048kB) given twice"),  # the size as people write it, not the API's "2048"
    (["--shared", "--isolate", "irqs", "x"], "--isolate needs exclusive CPUs"),
    (["--isolate", "irqs", "x"], "--isolate needs exclusive CPUs"),
    (["--cpus", "1", "--isolate-strict", "x"], "--isolate-strict needs --isolate"),
])
def test_inconsistent_options_exit_125(argv, message, capsys, monkeypatch, sock_dir):
    monkeypatch.setenv("NUMA_AGENT_SOCKET", f"{sock_dir}/none.sock")
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    argv = [a if a != "x" else "true" for a in argv]
    assert main(argv) == 125
    assert message in capsys.readouterr().err


def test_no_command_exits_125(capsys):
    assert main(["--cpus", "1"]) == 125
    assert "no command given" in capsys.readouterr().err


def test_help_exits_0_and_shows_examples(capsys):
    with pytest.raises(SystemExit) as info:
        main(["--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert "numa-run [OPTIONS] [--] COMMAND" in out and "examples:" in out and "125" in out


def test_workload_env_with_nvidia_gpu():
    record = {"name": "w", "cpus": "2-3", "mems": [0, 1], "exclusive": True,
              "devices": [{"address": "0000:3b:00.0", "vendor": "0x10de"},
                          {"address": "0000:5e:00.0", "vendor": "0x8086"}]}
    env = workload_env(record)
    assert env == {"NUMA_AGENT_WORKLOAD": "w", "NUMA_AGENT_CPUS": "2-3", "NUMA_AGENT_MEMS": "0,1",
                   "NUMA_AGENT_DEVICES": "0000:3b:00.0,0000:5e:00.0", "NUMA_AGENT_EXCLUSIVE": "1",
                   "CUDA_VISIBLE_DEVICES": "0000:3b:00.0"}


def test_workload_env_without_gpu_has_no_cuda():
    assert "CUDA_VISIBLE_DEVICES" not in workload_env({"name": "w", "cpus": "1", "mems": [0]})


def test_numa_run_imports_stay_light():
    code = ("import sys, numa_agent.cli.numa_run; heavy = {'msgspec', 'psutil', 'pyudev', "
            "'prometheus_client', 'http'}; print(sorted(heavy & {m.split('.')[0] for m in sys.modules}))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert out.stdout.strip() == "[]", out.stderr


# Standard-library modules the launch path once imported for little use, ~60 ms in all
# (scripts/bench-numa-run lists the slowest), and the project's modules it needs not load.
# argparse (with re, enum, gettext, locale), json (with re) and collections (namedtuple: the
# launch path's values are core.record.Record) too: the common launch forms
# are read by numa_agent.cli.launch_args and the request and answer by numa_agent.api.wirejson.
LAUNCH_NEVER_IMPORTS = {"typing", "dataclasses", "inspect", "pathlib", "shutil", "textwrap",
                        "socket", "selectors", "ctypes", "struct", "argparse", "re", "enum", "collections",
                        "gettext", "locale", "json", "numa_agent.core.topology",
                        "numa_agent.core.slurm", "numa_agent.core.policy", "numa_agent.api.errors",
                        "numa_agent.enforcement", "numa_agent.admission"}


def _imported(argv, env):
    """Modules `python -X importtime` saw loaded, the interpreter's own start-up left out.
    Without site (-S): this venv's .pth files (the editable install's) import modules, such
    as collections, that an install from a wheel does not; the launch needs no site-packages."""
    def modules(*args):
        out = subprocess.run([sys.executable, "-S", "-X", "importtime", *args], cwd="/", env=env,
                             capture_output=True, text=True, timeout=60)
        return out, {line.split("|")[2].strip() for line in out.stderr.splitlines()
                     if line.startswith("import time:") and line.count("|") == 2}
    _, base = modules("-c", "pass")
    out, launch = modules("-c", "import sys; from numa_agent.cli.numa_run import main; sys.exit(main())", *argv)
    return out, launch - base


@pytest.mark.parametrize("argv", [["--cpus", "1", "--", "true"], ["--shared", "--", "true"],
                                  ["--cpus=1", "true"]])
def test_a_launch_imports_only_what_it_needs(server, fake, argv):
    env = {**os.environ, "PYTHONPATH": str(REPO), "NUMA_AGENT_SOCKET": server.socket_path}
    env.pop("SLURM_JOB_ID", None)
    out, loaded = _imported(argv, env)
    assert out.returncode == 0, out.stderr[-2000:]
    assert fake.service_calls().count("admit") == 1  # it did launch, through the agent
    # The agent's cgroup confines the launch: no memory policy to set, whatever the host
    # (ctypes comes only with -i/-p/-l/-w or the affinity fallback's answer).
    never = LAUNCH_NEVER_IMPORTS
    heavy = {m for m in loaded if m in never or m.startswith(tuple(f"{p}." for p in never))}
    assert heavy == set(), f"numa-run's launch imported {sorted(heavy)}"


def test_the_memory_tools_load_while_the_agent_decides(server, fake):
    """The admission's answer waits here until the numa-run process that asked has
    ctypes mapped: it loads it while the agent works, not after the answer."""
    admit, seen = fake.admit, []

    def admit_once_loaded(request, caller, dry_run=False):
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not _maps_ctypes(caller.pid):
            time.sleep(0.005)
        seen.append(_maps_ctypes(caller.pid))
        return admit(request, caller, dry_run)
    fake.admit = admit_once_loaded
    out = run_numa_run(server, "-p", "0", "--cpus", "1", "--", "true")
    assert out.returncode == 0, out.stderr
    assert seen == [True]


def _maps_ctypes(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/maps") as f:
            return "_ctypes" in f.read()
    except OSError:
        return False


# ------------------------------------------------------------ against the agent
def run_numa_run(server, *argv, env=None):
    full_env = {**os.environ, "PYTHONPATH": str(REPO), "NUMA_AGENT_SOCKET": server.socket_path,
                **(env or {})}
    return subprocess.run([sys.executable, "-m", "numa_agent.cli.numa_run", *argv], cwd=REPO,
                          env=full_env, capture_output=True, text=True, timeout=60)


def test_exec_passes_exit_status_and_env(server, fake):
    script = 'echo "$NUMA_AGENT_WORKLOAD|$NUMA_AGENT_CPUS|$NUMA_AGENT_MEMS|$NUMA_AGENT_DEVICES|$CUDA_VISIBLE_DEVICES"; exit 7'
    out = run_numa_run(server, "--cpus", "2", "--device", "gpu=1", "--name", "web-1", "-v",
                       "--", "sh", "-c", script)
    assert out.returncode == 7, out.stderr
    assert out.stdout.strip() == "web-1|1-2|0|0000:3b:00.0|0000:3b:00.0"
    assert "numa-run: web-1 cpus 1-2 mems 0 devices 0000:3b:00.0" in out.stderr
    request, dry_run = fake.calls[0][1]
    assert request.command == ["sh", "-c", script] and dry_run is False
    assert fake.callers[0].pid != os.getpid()  # the numa-run process itself was identified


def test_affinity_mode_pins_itself(fake, sock_dir):
    from numa_agent.api.server import ApiServer
    fake.enforcement = "affinity"
    with ApiServer(fake, f"{sock_dir}/agent.sock") as srv:
        out = run_numa_run(srv, "-v", "--cpus", "1", sys.executable, "-c",
                           "import os; print(sorted(os.sched_getaffinity(0)))")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[1]"
    assert "numa-run: wl-1 cpus 1 mems 0 devices - (affinity)" in out.stderr


def test_affinity_mode_binds_memory_only_where_it_restricts(fake, sock_dir):
    """The affinity answer's `mems` (node 0) are bound with MPOL_BIND unless they are
    every node with memory, where binding restricts nothing: the command reads MPOL_BIND
    (2) on a host of several memory nodes, the default (0) on a host of one."""
    from numa_agent.api.server import ApiServer
    from numa_agent.core.mempolicy import binding_needed
    fake.enforcement = "affinity"
    with open("/sys/devices/system/node/has_memory") as f:
        expected = "2 [0]" if binding_needed([0], f.read()) else "0 []"
    code = ("from numa_agent.enforcement.mempolicy import get_policy; p = get_policy(); "
            "print(p.mode, list(p.nodes))")
    with ApiServer(fake, f"{sock_dir}/agent.sock") as srv:
        out = run_numa_run(srv, "--cpus", "1", "--", sys.executable, "-c", code)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == expected


def test_a_memory_size_below_a_page_is_warned_of_and_verbose_shows_the_booking(server, fake):
    out = run_numa_run(server, "--cpus", "1", "--memory", "1024", "-v", "--", "true")
    assert out.returncode == 0, out.stderr
    lines = out.stderr.splitlines()
    assert lines[0].startswith("numa-run: warning: --memory 1024 is 1,024 bytes, less than a ")
    assert "numa-run: memory 1 KiB on node 0" in lines
    assert fake.calls[0][1][0].memory_bytes == 1024  # warned, and booked as asked


def test_verbose_says_when_no_memory_is_booked(server):
    out = run_numa_run(server, "--cpus", "1", "--memory", "4Gi", "-v", "--", "true")
    assert out.returncode == 0, out.stderr
    assert "warning" not in out.stderr and "numa-run: memory 4 GiB on node 0" in out.stderr.splitlines()
    out = run_numa_run(server, "--cpus", "1", "-v", "--", "true")
    assert "numa-run: memory none booked" in out.stderr.splitlines()


def test_memory_booked_text_names_each_node():
    from numa_agent.cli.common import memory_booked_text, small_size_warnings

    assert memory_booked_text({"memory_bytes": {"1": 4 << 30, "0": 4 << 30}}) == \
        "8 GiB on nodes 0,1 (4 GiB, 4 GiB)"
    assert memory_booked_text({"memory_bytes": {"0": 0}}) == "none booked"
    assert small_size_warnings([("--memory", 4096), ("--pod-memory", None), ("--memory", 0)], page=4096) == []
    assert len(small_size_warnings([("--pod-memory", 4095)], page=4096)) == 1


def test_a_small_size_with_a_unit_is_not_taken_for_a_plain_number():
    # `--memory 1Ki` says what it means: no "a size without a unit is bytes" warning
    # quoting 1024, which the user never typed.
    from numa_agent.cli.common import parse_size, small_size_warnings

    assert small_size_warnings([("--memory", parse_size("1Ki")), ("--pod-memory", parse_size("1k"))],
                               page=4096) == []
    lines = small_size_warnings([("--memory", parse_size("1024"))], page=4096)
    assert len(lines) == 1 and lines[0].startswith("warning: --memory 1024 is 1,024 bytes")


def test_command_not_found_is_127_and_books_nothing(server, fake):
    out = run_numa_run(server, "--cpus", "1", "no-such-command-xyz")
    assert out.returncode == 127
    assert "no-such-command-xyz: command not found" in out.stderr
    assert fake.calls == []


def test_command_not_executable_is_126_and_books_nothing(server, fake, sock_dir):
    path = Path(sock_dir) / "script.sh"
    path.write_text("#!/bin/sh\nexit 0\n")
    path.chmod(0o644)
    out = run_numa_run(server, "--cpus", "1", str(path))
    assert out.returncode == 126
    assert "not executable" in out.stderr
    assert fake.calls == []


def test_exec_failure_releases_the_workload(server, fake, sock_dir):
    path = Path(sock_dir) / "garbage"
    path.write_bytes(b"\x7fELF-not-really")
    path.chmod(0o755)
    out = run_numa_run(server, "--cpus", "1", str(path))
    assert out.returncode == 126, out.stderr
    assert fake.service_calls().count("admit") == 1
    assert "release" in fake.service_calls()
    assert fake.workloads == {}


def test_unreachable_agent_is_125(sock_dir, server):
    out = run_numa_run(server, "--cpus", "1", "true",
                       env={"NUMA_AGENT_SOCKET": f"{sock_dir}/absent.sock",
                            "NUMA_AGENT_RETRY_SECONDS": "0"})  # else it waits 30 s for a restart
    assert out.returncode == 125
    assert f"{sock_dir}/absent.sock" in out.stderr and "numa-agent serve" in out.stderr
    assert "Traceback" not in out.stderr


def test_socket_option_beats_env(server, sock_dir):
    out = run_numa_run(server, "--socket", server.socket_path, "--cpus", "1", "true",
                       env={"NUMA_AGENT_SOCKET": f"{sock_dir}/absent.sock"})
    assert out.returncode == 0, out.stderr


def test_refusal_is_125_with_topology_explanation(server, fake):
    out = run_numa_run(server, "--cpus", "5", "true")
    assert out.returncode == 125
    lines = out.stderr.splitlines()
    assert lines[0].startswith("numa-run: refused: TopologyAffinityError: 5 CPUs requested")
    assert any(line.strip().startswith("hints cpu:") for line in lines)
    assert any("merged hint: {0,1} not preferred" in line for line in lines)
    assert "  free: node 0: 3 CPUs, 8 GiB; node 1: 4 CPUs, 8 GiB" in lines
    # the topology manager's verdict, apart from the outcome (the first line)
    assert "  topology manager: not aligned (policy single-numa-node, scope container)" in lines
    assert fake.workloads == {}


def test_refusal_json(server):
    out = run_numa_run(server, "--json", "--cpus", "5", "true")
    assert out.returncode == 125
    assert json.loads(out.stdout)["error"]["code"] == "topology_affinity_error"


def test_bad_request_from_agent_is_125(server, fake):
    out = run_numa_run(server, "--name", "Bad/Name", "true")
    assert out.returncode == 125
    assert "invalid name" in out.stderr and "Traceback" not in out.stderr
    assert fake.calls == []


def test_dry_run_prints_decision_and_books_nothing(server, fake):
    out = run_numa_run(server, "--dry-run", "--cpus", "2")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("would admit wl-1: cpus 1-2 (exclusive) numa nodes 0")
    assert "merged hint: {0} preferred" in out.stdout
    assert fake.workloads == {} and fake.calls[0][1][1] is True


def test_dry_run_json_is_the_full_record(server, fake):
    out = run_numa_run(server, "--dry-run", "--json", "--cpus", "2", "--", "sleep", "1")
    assert out.returncode == 0, out.stderr
    record = json.loads(out.stdout)
    assert record["dry_run"] is True and record["explanation"]["admit"] is True
    assert fake.workloads == {}


# ------------------------------------------------------------ an impostor on the socket
def _impostor(path: str, ready_w: int) -> None:
    """Runs in a forked child as uid 65534: answers every request with an admission."""
    import socket
    os.setgid(65534)
    os.setuid(65534)
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    srv.listen(8)
    os.write(ready_w, b"r")
    body = json.dumps({"name": "pwned", "cpus": "0", "mems": "0", "devices": [], "enforcement": "cgroup"}).encode()
    while True:
        conn, _ = srv.accept()
        conn.recv(65536)
        conn.sendall(b"HTTP/1.1 201 Created\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
                     b"Connection: close\r\n\r\n%s" % (len(body), body))
        conn.close()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run the impostor as another user")
def test_numa_run_refuses_an_impostor_agent(tmp_path):
    """A server on the socket path that runs as another (unprivileged) user is
    not the agent: numa-run exits 125 naming its uid, and the command never runs."""
    import tempfile
    public = Path(tempfile.mkdtemp(prefix="numa-agent-public-", dir="/tmp"))  # reachable by uid 65534
    os.chmod(public, 0o1777)  # a world-writable directory, like /tmp itself
    sock = public / "agent.sock"
    ready_r, ready_w = os.pipe()
    child = os.fork()
    if child == 0:
        try:
            _impostor(str(sock), ready_w)
        finally:
            os._exit(1)
    os.close(ready_w)
    try:
        assert os.read(ready_r, 1) == b"r"
        marker = tmp_path / "ran"
        out = subprocess.run([sys.executable, "-m", "numa_agent.cli.numa_run", "--socket", str(sock), "--cpus", "1",
                              "--", "touch", str(marker)], cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 125, out.stderr
        assert "runs as uid 65534" in out.stderr and "not as root" in out.stderr
        assert not marker.exists()
        # Declared as the agent's user, the same server is believed.
        declared = subprocess.run([sys.executable, "-m", "numa_agent.cli.numa_run", "--socket", str(sock),
                                   "--dry-run", "--cpus", "1", "--", "true"], cwd=REPO,
                                  env={**os.environ, "PYTHONPATH": str(REPO), "NUMA_AGENT_USER": "65534"},
                                  capture_output=True, text=True, timeout=60)
        assert "runs as uid" not in declared.stderr
    finally:
        os.close(ready_r)
        os.kill(child, 9)
        os.waitpid(child, 0)
        sock.unlink(missing_ok=True)
        public.rmdir()


def test_isolation_lines_say_what_was_and_was_not_done():
    record = {"name": "a", "isolation": {"asked": ["irqs", "freq"], "strict": False, "done": ["irqs"],
                                         "not_done": ["freq: not available on this machine"]}}
    assert common.isolation_lines(record) == ["  isolation (irqs, freq): irqs done",
                                              "  isolation not done: freq: not available on this machine"]
    assert common.isolation_lines({"name": "b", "isolation": None}) == []


@pytest.mark.parametrize("argv", [["-s"], ["--dry-run", "--cpus", "1", "--", "true"],
                                  ["--dry-run", "--json", "--cpus", "1", "--", "true"]])
def test_a_reader_gone_before_the_output_is_no_traceback(server, argv):
    # `numa-run -s | head -1`: as the numa-agent commands, a closed stdout ends quietly with 0.
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        out = subprocess.run([sys.executable, "-m", "numa_agent.cli.numa_run", *argv], cwd=REPO,
                             env={**os.environ, "PYTHONPATH": str(REPO),
                                  "NUMA_AGENT_SOCKET": server.socket_path},
                             stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=60)
    finally:
        os.close(write_end)
    assert (out.returncode, out.stderr) == (0, "")


def test_a_launch_that_cannot_print_its_binding_does_not_claim_success(server, fake):
    # -v writes the binding to stderr before exec; with stderr gone the command never ran.
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        out = subprocess.run([sys.executable, "-m", "numa_agent.cli.numa_run", "-v", "--cpus", "1", "--",
                              "true"], cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO),
                                                      "NUMA_AGENT_SOCKET": server.socket_path},
                             stdout=subprocess.PIPE, stderr=write_end, timeout=60)
    finally:
        os.close(write_end)
    assert out.returncode == 125


# ------------------------------------------------------------ inside a Slurm task
SLURM_ENV = {"SLURM_JOB_ID": "12", "SLURM_STEP_ID": "0", "SLURM_PROCID": "2"}


def test_a_slurm_task_is_named_after_its_job_step_and_rank_and_says_its_case(server, fake):
    out = run_numa_run(server, "--shared", "true", env=SLURM_ENV)
    assert out.returncode == 0, out.stderr
    request, _ = fake.calls[0][1]
    assert request.name == f"slurm-12-0-2-u{os.geteuid()}"  # the job's user's (core.names)
    assert [line for line in out.stderr.splitlines() if line.startswith("numa-run: Slurm step 12.0 task 2: ")]


def test_a_name_given_beats_the_slurm_name(server, fake):
    out = run_numa_run(server, "--shared", "--name", "mine", "true", env=SLURM_ENV)
    assert out.returncode == 0, out.stderr
    assert fake.calls[0][1][0].name == "mine"


def _slurm_body(argv, case):
    from numa_agent.cli.numa_run import slurm_request
    args = parse_args([*argv, "true"])
    body = common.build_request(args, ["true"])
    return slurm_request(args, body, case), body


STEP_CGROUP = "/system.slice/slurmstepd.scope/job_12/step_0/user/task_2"


def _case(cgroup, cgroup_cpus, affinity):
    from numa_agent.core.cpuset import CpuSet
    from numa_agent.core.slurm import SlurmTask, confinement
    return confinement(SlurmTask("12", "0", "2"), cgroup, online=CpuSet.parse("0-7"),
                       cgroup_cpus=CpuSet.parse(cgroup_cpus), cgroup_mems=CpuSet.parse("0"),
                       affinity=CpuSet.parse(affinity))


def test_in_a_step_cgroup_numa_run_asks_to_be_booked_in_place():
    refused, body = _slurm_body(["--cpus", "2"], _case(STEP_CGROUP, "2-5", "2-5"))
    assert refused is None
    assert body["in_place"] is True and body["name"] == f"slurm-12-0-2-u{os.geteuid()}" and "physcpubind" not in body
    assert body["within_cpus"] == "2-5"  # also for an agent that cannot read the grant itself


def test_without_a_step_cgroup_numa_run_is_placed_by_the_agent_as_before():
    refused, body = _slurm_body(["--cpus", "2"], _case("/user.slice/session-3.scope", "0-7", "0-7"))
    assert refused is None and "in_place" not in body and "physcpubind" not in body
    assert "within_cpus" not in body


def test_task_affinity_binding_bounds_the_booking():
    refused, body = _slurm_body(["--cpus", "2"], _case(STEP_CGROUP, "0-7", "4-7"))
    assert refused is None and body["within_cpus"] == "4-7" and body["in_place"] is True
    assert "physcpubind" not in body


def test_task_affinity_without_a_step_cgroup_bounds_it_too():
    refused, body = _slurm_body(["--cpus", "2"], _case("/user.slice/session-3.scope", "0-7", "2-5"))
    assert refused is None and body["within_cpus"] == "2-5" and "in_place" not in body


def test_explicit_cpus_inside_what_slurm_gave_are_booked_within_it():
    refused, body = _slurm_body(["-C", "4-5"], _case(STEP_CGROUP, "0-7", "2-5"))
    assert refused is None and body["physcpubind"] == "4-5" and body["within_cpus"] == "2-5"
    refused, body = _slurm_body(["-N", "1", "--cpus", "2"], _case(STEP_CGROUP, "0-7", "2-5"))
    assert refused is None and body["within_cpus"] == "2-5"  # -N's CPUs, of those Slurm gave


def test_explicit_cpus_outside_what_slurm_gave_are_refused_in_one_line():
    # task/cgroup granted the step 0-7, task/affinity bound this task to 2-5: 6-7 are another
    # task's, and a booking there would widen this one (the kernel applies its cgroup's cpuset).
    refused, body = _slurm_body(["-C", "5-6"], _case(STEP_CGROUP, "0-7", "2-5"))
    assert refused == "Slurm gave this task CPUs 2-5 (4), -C 5-6 asked"


@pytest.mark.parametrize("cgroup_cpus, affinity, gave", [
    ("4-7", "0-7", "4-7 (4)"),  # task/cgroup alone
    ("0-7", "4-5", "4-5 (2)"),  # task/affinity alone
    ("4-7", "2-5", "4-5 (2)"),  # both: the narrower of the two
])
def test_a_task_holding_fewer_cpus_than_asked_is_refused_saying_what_slurm_gave(cgroup_cpus, affinity, gave):
    refused, body = _slurm_body(["--cpus", "6"], _case(STEP_CGROUP, cgroup_cpus, affinity))
    assert refused == f"Slurm gave this task CPUs {gave}, --cpus 6 asked"
    assert "in_place" not in body  # nothing asked of the agent


def test_a_task_slurm_did_not_confine_is_left_to_the_agent():
    refused, _ = _slurm_body(["--cpus", "12"], _case(STEP_CGROUP, "0-7", "0-7"))
    assert refused is None


def test_the_refusal_is_numa_runs_one_line_exit_125(server, fake, monkeypatch, capsys):
    from numa_agent.cli import numa_run

    monkeypatch.setattr(numa_run, "slurm_case", lambda env=None: _case(STEP_CGROUP, "4-7", "4-5"))
    assert main(["--socket", server.socket_path, "--cpus", "4", "--", "true"]) == 125
    assert capsys.readouterr().err == "numa-run: Slurm gave this task CPUs 4-5 (2), --cpus 4 asked\n"
    assert fake.calls == []


def test_tasks_sharing_one_slurm_cgroup_are_each_pinned_inside_it(monkeypatch):
    monkeypatch.setenv("SLURM_STEP_TASKS_PER_NODE", "3")
    monkeypatch.setenv("SLURM_NODEID", "0")
    shared = _case(STEP_CGROUP.replace("task_2", "task_special"), "0-7", "0-7")
    refused, body = _slurm_body(["--cpus", "2"], shared)
    assert refused is None and body["in_place"] is True and body["pinned"] is True
    refused, body = _slurm_body(["-m", "0"], shared)  # the shared pool cannot be pinned apart
    assert refused is not None and "--cpus N" in refused and "pinned" not in body
    monkeypatch.setenv("SLURM_STEP_TASKS_PER_NODE", "1")  # alone in it: the cgroup is its own
    refused, body = _slurm_body(["--cpus", "2"], shared)
    assert refused is None and body["in_place"] is True and "pinned" not in body


def test_an_agent_that_cannot_book_in_place_is_asked_again_without_it(server, fake, monkeypatch):
    from numa_agent.api.errors import BadRequest
    from numa_agent.cli import numa_run

    sent = []
    real_admit = fake.admit

    def admit(request, caller, dry_run=False):
        sent.append(request)
        if request.in_place:  # as the affinity fallback answers
            raise BadRequest(f"in_place: pid {caller.pid} is in cgroup (none), not below an engine's cgroup")
        return real_admit(request, caller, dry_run)
    monkeypatch.setattr(fake, "admit", admit)
    args = parse_args(["--socket", server.socket_path, "--cpus", "1", "true"])
    record = numa_run._post(args, "/v1/workloads", {"cpus": 1, "in_place": True, "within_cpus": "1-2"})
    assert [r.in_place for r in sent] == [True, False] and sent[1].within_cpus == "1-2"
    assert record["name"]
