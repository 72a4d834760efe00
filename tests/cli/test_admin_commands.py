from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys

import pytest

from numa_agent.api.client import request
from numa_agent.cli import explain_cmd, release_cmd, resize_cmd, status_cmd, topology_cmd
from numa_agent.cli.status_cmd import format_status


def parse(module, argv):
    parser = argparse.ArgumentParser(prog="numa-agent")
    sub = parser.add_subparsers(dest="command")
    module.add_parser(sub)
    return parser.parse_args(argv)


def run(module, argv, server=None):
    if server is not None:
        argv = [*argv, "--socket", server.socket_path]
    args = parse(module, argv)
    return args.func(args)


def admit(server, body):
    status, answer = request(server.socket_path, "POST", "/v1/workloads", body)
    assert status == 201, answer
    return answer


# ------------------------------------------------------------ status
def test_status_table(server, capsys):
    admit(server, {"name": "web-1", "cpus": 2, "devices": {"gpu": 1}, "command": ["sleep", "1"]})
    assert run(status_cmd, ["status"], server) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].startswith("enforcement: cgroup   topology policy: single-numa-node")
    header = next(line for line in lines if line.startswith("NODE"))
    assert header.split() == ["NODE", "RESOURCE", "CAPACITY", "RESERVED", "ALLOCATED", "FREE"]
    assert any(line.split() == ["0", "cpus", "4", "1", "2", "1"] for line in lines)
    # sizes in binary units for people, one space inside each cell, two between cells
    assert any(re.fullmatch(r"0 +memory +16 GiB +1 GiB +0 B +15 GiB", line) for line in lines)
    assert any(line.split() == ["1", "hugepages-2048kB", "512", "0", "0", "512"] for line in lines)
    assert any(line.split() == ["1", "device", "gpu", "1", "-", "0", "1"] for line in lines)
    wl_header = next(line for line in lines if line.startswith("NAME"))
    assert wl_header.split() == ["NAME", "OWNER", "POD", "CPUS", "NODES", "DEVICES", "AGE"]
    row = next(line for line in lines if line.startswith("web-1"))
    assert row.split()[:6] == ["web-1", str(os.getuid()), "-", "1-2", "0", "0000:3b:00.0"]
    assert row.split()[6].endswith("s")


def test_status_owner_is_the_user_name_and_the_uid_when_it_has_none(server, fake, capsys):
    admit(server, {"name": "web-1", "cpus": 1})
    fake.user_names[os.getuid()] = "alice"
    assert run(status_cmd, ["status"], server) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("web-1"))
    assert row.split()[:2] == ["web-1", "alice"]
    assert run(status_cmd, ["status", "--json"], server) == 0
    (wl,) = json.loads(capsys.readouterr().out)["workloads"]
    assert wl["owner"] == "alice" and wl["owner_uid"] == os.getuid()
    status = {"workloads": [{"name": "x", "owner_uid": 4242, "owner": None, "cpus": "1"}]}
    assert next(line for line in format_status(status, now=0) if line.startswith("x ")).split()[1] == "4242"


def test_status_json(server, capsys):
    assert run(status_cmd, ["status", "--json"], server) == 0
    data = json.loads(capsys.readouterr().out)
    assert [n["id"] for n in data["nodes"]] == [0, 1]


def test_format_status_ages_and_shared():
    status = {"enforcement": "affinity", "policy": {}, "nodes": [],
              "workloads": [{"name": "a", "owner_uid": 1000, "pod": "p1", "cpus": "0-1",
                             "exclusive": False, "numa_nodes": [0, 1], "devices": [],
                             "created_unix": 1000.0}],
              "pods": [{"name": "p1", "cpus": "4-9", "numa_nodes": [1], "members": ["a", "b"]},
                       {"name": "p2", "cpus": "10-11", "numa_nodes": [1], "members": ["c"],
                        "budget": {"cpus": 2, "memory_bytes": 1 << 30, "hugepages": {}, "devices": {}}}]}
    lines = format_status(status, now=1000.0 + 2 * 3600 + 5)
    row = next(line for line in lines if line.startswith("a "))
    assert row.split() == ["a", "1000", "p1", "0-1", "(shared)", "0,1", "-", "2h"]
    assert "pod p1: cpus 4-9 nodes 1 members a,b" in lines
    assert "pod p2: cpus 10-11 nodes 1 members c (budget 2 CPUs, 1 GiB of memory)" in lines


def test_format_status_names_a_runtime_container_by_namespace_pod_and_container():
    ref = {"runtime": "nri", "container_id": "c0ffee", "sandbox_id": "5b", "namespace": "prod",
           "pod": "web-0", "pod_uid": "u1", "container": "app"}
    status = {"workloads": [{"name": "ctr-c0ffee", "owner_uid": 0, "owner": "root", "pod": None, "cpus": "2-3",
                             "numa_nodes": [0], "runtime": ref},
                            {"name": "bare", "owner_uid": 0, "owner": "root", "pod": "p9", "cpus": "4",
                             "numa_nodes": [0], "runtime": {**ref, "namespace": "", "pod": "", "container": ""}}]}
    lines = format_status(status, now=0)
    assert next(line for line in lines if line.startswith("ctr-c0ffee ")).split()[2] == "prod/web-0/app"
    assert next(line for line in lines if line.startswith("bare ")).split()[2] == "p9"


@pytest.mark.parametrize("mode,line", [
    ("explicit", "node(s) 2,3 memory-only (no usable CPU): booked only for a request naming them (-m)"),
    ("ordinary", 'node(s) 2,3 memory-only (no usable CPU), booked like any node (memory_only_nodes = "ordinary")'),
])
def test_format_status_names_the_memory_only_nodes(mode, line):
    status = {"policy": {"memory_only_nodes": mode},
              "nodes": [{"id": 0, "kind": "cpu"}, {"id": 2, "kind": "memory-only"}, {"id": 3, "kind": "memory-only"}]}
    assert line in format_status(status, now=0)
    assert not any("memory-only" in text for text in format_status({"nodes": [{"id": 0, "kind": "cpu"}]}, now=0))


def _crowded_workload(intruders: int, kernel_threads: int) -> dict:
    return {"name": "web", "cpus": "2-3", "exclusive": True,
            "intruders": [{"pid": 500 + i, "tid": 500 + i, "command": f"spin{i}", "cpu": 2}
                          for i in range(intruders)],
            "kernel_threads": [{"pid": 700 + i, "tid": 700 + i, "command": f"kworker/{i}", "cpu": 3}
                               for i in range(kernel_threads)]}


def test_the_explanation_says_the_strategy_broke_a_tie():
    from numa_agent.cli.common import explanation_lines
    lines = explanation_lines({"tie_break": {"strategy": "least-allocated", "nodes": [1], "score": 1,
                                             "instead_of": [0], "instead_of_score": 33}})
    assert lines == ["  numa-allocation-strategy least-allocated: {1} (allocated score 1), "
                     "chosen over the lowest {0} (score 33)"]


def test_format_status_keeps_the_table_in_sight_with_many_intruders():
    lines = format_status({"workloads": [_crowded_workload(40, 80)]}, now=0)
    assert sum(line.startswith("INTRUDER on web's CPU 2") for line in lines) == status_cmd.INTRUDERS_SHOWN
    assert f"INTRUDERS on web's CPUs: {40 - status_cmd.INTRUDERS_SHOWN} more" in lines
    assert "kernel threads on web's CPUs: 80" in lines
    assert "(numa-agent status --intruders lists every intruder and kernel thread)" in lines
    assert len(lines) < 20


def test_format_status_intruders_lists_every_one():
    lines = format_status({"workloads": [_crowded_workload(40, 2)]}, now=0, intruders=True)
    assert sum(line.startswith("INTRUDER on web's CPU 2") for line in lines) == 40
    assert "kernel threads on web's CPUs: kworker/0 (pid 700, CPU 3), kworker/1 (pid 701, CPU 3)" in lines
    assert not any("more" in line or "--intruders" in line for line in lines)


def test_format_status_a_few_intruders_need_no_flag():
    lines = format_status({"workloads": [_crowded_workload(2, 0)]}, now=0)
    assert "INTRUDER on web's CPU 2: pid 501 tid 501 (spin1)" in lines
    assert not any("--intruders" in line for line in lines)


def test_status_memory_asks_for_numa_maps(server, fake, capsys):
    assert run(status_cmd, ["status", "--memory", "--json"], server) == 0
    assert fake.calls[-1] == ("status", True)


def test_status_no_workloads(server, capsys):
    assert run(status_cmd, ["status"], server) == 0
    assert "no workloads" in capsys.readouterr().out


# ------------------------------------------------------------ release
def test_release(server, fake, capsys):
    admit(server, {"name": "web-1", "cpus": 1})
    assert run(release_cmd, ["release", "web-1"], server) == 0
    assert capsys.readouterr().out.strip() == "released web-1 (cpus 1)"
    assert fake.workloads == {}


def test_release_unknown_is_one_line_exit_1(server, capsys):
    assert run(release_cmd, ["release", "nope"], server) == 1
    err = capsys.readouterr().err
    assert err == "numa-agent release: error: no workload named 'nope'\n"


@pytest.mark.parametrize("name", ["../x", "a b", "Web", "a%2Fb"])
def test_release_bad_name_is_rejected(server, fake, capsys, name):
    assert run(release_cmd, ["release", name], server) == 1
    err = capsys.readouterr().err
    assert err.startswith("numa-agent release: error: invalid") and err.count("\n") == 1
    assert "release" not in fake.service_calls()


# ------------------------------------------------------------ explain
def test_explain_admit(server, fake, capsys):
    assert run(explain_cmd, ["explain", "--cpus", "2", "--memory", "1Gi"], server) == 0
    out = capsys.readouterr().out
    assert out.startswith("would admit wl-1: cpus 1-2 (exclusive)")
    assert "hints cpu: {0} preferred, {1} preferred, {0,1}" in out
    assert "  topology manager: aligned (policy single-numa-node, scope container)\n" in out
    request_sent, dry_run = fake.calls[0][1]
    assert dry_run is True and request_sent.memory_bytes == 1 << 30
    assert fake.workloads == {}


def test_explain_refusal(server, capsys):
    assert run(explain_cmd, ["explain", "--cpus", "5"], server) == 1
    out = capsys.readouterr().out
    assert out.startswith("would refuse: TopologyAffinityError: 5 CPUs requested")
    assert "merged hint: {0,1} not preferred" in out


def test_explain_json(server, capsys):
    assert run(explain_cmd, ["explain", "--json", "--cpus", "1"], server) == 0
    assert json.loads(capsys.readouterr().out)["dry_run"] is True


# ------------------------------------------------------------ socket resolution
@pytest.mark.parametrize("module,argv", [(status_cmd, ["status"]),
                                         (release_cmd, ["release", "x"]),
                                         (explain_cmd, ["explain", "--cpus", "1"])])
def test_unreachable_is_one_line_exit_1(module, argv, sock_dir, monkeypatch, capsys):
    monkeypatch.setenv("NUMA_AGENT_SOCKET", f"{sock_dir}/absent.sock")
    monkeypatch.setenv("NUMA_AGENT_RETRY_SECONDS", "0")  # else it waits 30 s for a restart
    assert run(module, argv) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{sock_dir}/absent.sock" in err and "numa-agent serve" in err


def test_env_socket_is_used(server, monkeypatch, capsys):
    monkeypatch.setenv("NUMA_AGENT_SOCKET", server.socket_path)
    assert run(status_cmd, ["status", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["enforcement"] == "cgroup"


def test_both_commands_print_the_package_version():
    import numa_agent

    for module in ("numa_agent.cli.numa_agent", "numa_agent.cli.numa_run"):
        out = subprocess.run([sys.executable, "-m", module, "--version"], capture_output=True, text=True)
        assert out.returncode == 0 and out.stdout.split()[-1] == numa_agent.__version__, out.stderr


def test_status_lists_isolation_and_failed_restores():
    from numa_agent.cli.status_cmd import isolation_status_lines

    status = {"isolation": {"knobs_held": 3, "not_movable": ["irq/30"],
                            "restore_failures": [{"knob": "irq/24", "original": "0-7", "error": "Device or resource busy"}]}}
    lines = isolation_status_lines(status, [{"name": "a", "isolation": {"asked": ["irqs"], "done": ["irqs"]}}])
    assert "  isolation (irqs): irqs done" in lines
    assert "isolation: interrupts the kernel manages (not movable): 30" in lines
    assert any(line.startswith("ISOLATION RESTORE FAILED irq/24: original '0-7'") for line in lines)


def test_status_says_which_isolation_setting_someone_else_changed():
    from numa_agent.cli.status_cmd import isolation_status_lines

    status = {"isolation": {"changed_by_others": [{"knob": "irq/24", "original": "0-7", "found": "0-1"}]}}
    assert isolation_status_lines(status, []) == [
        "", "isolation: irq/24 changed by someone else to '0-1' while held: left so, its original '0-7' not restored"]


# ------------------------------------------------------------ topology
def test_topology_follows_the_agent_that_simulates_another_machine(server, fake, snapshot, capsys):
    root, _ = snapshot("intel-snb-2s-2numa-pci-nvme-nic")
    assert run(topology_cmd, ["topology", "--json", "--sysfs-root", str(root)], server) == 0
    named = capsys.readouterr().out
    fake.sysfs_root = str(root)
    assert run(topology_cmd, ["topology", "--json"], server) == 0
    followed = capsys.readouterr()
    assert followed.out == named  # the agent's machine, not this host's
    assert followed.err == (f"numa-agent topology: the machine the agent at {server.socket_path} simulates "
                            f"({root}); --sysfs-root / shows this host\n")


def test_topology_says_when_it_cannot_follow_the_agents_machine(server, fake, capsys):
    fake.sysfs_root = "/srv/snapshots/intel-2s.tar.gz"  # not on this host (or not readable)
    assert run(topology_cmd, ["topology", "--json"], server) == 0
    err = capsys.readouterr().err
    assert err.startswith("numa-agent topology: note: this is this host's machine, not the one the agent at ")
    assert "simulates (/srv/snapshots/intel-2s.tar.gz: " in err and len(err.splitlines()) == 1


def test_topology_is_quiet_when_the_agent_reads_this_host(server, fake, capsys):
    assert run(topology_cmd, ["topology", "--json"], server) == 0
    assert capsys.readouterr().err == ""


def test_topology_without_an_agent_is_quiet(sock_dir, capsys):
    args = parse(topology_cmd, ["topology", "--json", "--socket", f"{sock_dir}/nobody.sock"])
    assert args.func(args) == 0
    assert capsys.readouterr().err == ""


def test_topology_naming_a_root_does_not_ask_the_agent(server, fake, snapshot, capsys):
    fake.sysfs_root = "/elsewhere"
    root, _ = snapshot("intel-snb-2s-2numa-pci-nvme-nic")
    assert run(topology_cmd, ["topology", "--json", "--sysfs-root", str(root)], server) == 0
    assert "health" not in fake.service_calls()
    assert capsys.readouterr().err == ""


# ------------------------------------------------------------ resize
def test_resize(server, fake, capsys):
    admit(server, {"name": "web-1", "cpus": 2})
    assert run(resize_cmd, ["resize", "web-1", "--cpus", "4", "--memory", "2Gi"], server) == 0
    assert capsys.readouterr().out.strip() == "resized web-1: cpus 0-3, memory 2 GiB"
    assert fake.calls[-1] == ("resize", {"name": "web-1", "cpus": 4, "memory_bytes": 2 << 30})


def test_resize_needs_something_to_change(server, capsys):
    assert run(resize_cmd, ["resize", "web-1"], server) == 2
    assert "give --cpus N, --memory SIZE or both" in capsys.readouterr().err


def test_a_refused_resize_says_why_as_an_admission_does(server, fake, capsys):
    admit(server, {"name": "web-1", "cpus": 2})
    assert run(resize_cmd, ["resize", "web-1", "--cpus", "9"], server) == 1
    err = capsys.readouterr().err
    assert err.startswith("numa-agent resize: refused: TopologyAffinityError: 9 CPUs asked")
    assert "merged hint: {0,1} not preferred" in err


@pytest.mark.parametrize("argv,code", [(["resize", "web-1", "--cpus", "9"], "topology_affinity_error"),
                                       (["resize", "nope", "--cpus", "2"], "not_found")])
def test_resize_json_answers_an_error_as_json(server, fake, capsys, argv, code):
    admit(server, {"name": "web-1", "cpus": 2})
    assert run(resize_cmd, [*argv, "--json"], server) == 1
    assert json.loads(capsys.readouterr().out)["error"]["code"] == code


def test_resize_of_an_unknown_workload_is_one_line_exit_1(server, capsys):
    assert run(resize_cmd, ["resize", "nope", "--cpus", "2"], server) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "nope" in err[0]


def test_resize_warns_of_a_memory_size_below_a_page_and_goes_on(server, fake, capsys):
    admit(server, {"name": "web-1", "cpus": 2})
    assert run(resize_cmd, ["resize", "web-1", "--memory", "1024"], server) == 0
    captured = capsys.readouterr()
    page = os.sysconf("SC_PAGE_SIZE")
    assert captured.err.startswith("numa-agent resize: warning: --memory 1024 is 1,024 bytes, less than a ")
    assert "did you mean 1024Mi or 1024M?" in captured.err and len(captured.err.splitlines()) == 1
    assert page > 1024 and fake.calls[-1] == ("resize", {"name": "web-1", "cpus": None, "memory_bytes": 1024})


def test_explain_warns_of_a_memory_size_below_a_page(server, capsys):
    assert run(explain_cmd, ["explain", "--cpus", "1", "--memory", "100"], server) == 0
    assert capsys.readouterr().err.startswith("numa-agent explain: warning: --memory 100 is 100 bytes")
