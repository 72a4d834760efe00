"""numactl's habits in numa-run: memory policies, list forms, --show, and the
numactl options it refuses, against the fake agent of tests/api."""

import json
import sys

import pytest

from numa_agent.api.errors import BadRequest
from numa_agent.api.server import ApiServer
from numa_agent.cli import common
from numa_agent.cli.numa_run import main, parse_args
from tests.cli.test_numa_run import run_numa_run


def admitted_request(fake):
    request, _ = fake.calls[[name for name, _ in fake.calls].index("admit")][1]
    return request


# ------------------------------------------------------------ the done-when commands
@pytest.mark.parametrize("options,policy_line,membind", [
    (["-i", "all"], "  memory policy: interleave nodes 0-1", [0, 1]),
    (["-p", "0"], "  memory policy: preferred nodes 0", [0]),
    (["-l"], "  memory policy: local", None),
])
def test_dry_run_with_a_memory_policy(server, fake, options, policy_line, membind):
    out = run_numa_run(server, "--dry-run", *options, "--cpus", "1", "--", "true")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("would admit wl-1: cpus 1 (exclusive)")
    assert lines[1] == policy_line
    assert admitted_request(fake).membind == membind
    assert fake.workloads == {}


def with_memory_only_node(fake, monkeypatch, mode=None):
    """The fake machine plus node 2, memory-only (a GPU's or a CXL expander's memory)."""
    topology = fake.topology

    def grown():
        doc = topology()
        nodes = [{**n, "kind": "cpu"} for n in doc["numa_nodes"]] + [{"id": 2, "cpus": "", "kind": "memory-only"}]
        return {**doc, "numa_nodes": nodes, **({"memory_only_nodes": mode} if mode else {})}
    monkeypatch.setattr(fake, "topology", grown)


@pytest.mark.parametrize("option", ["-i", "-w", "-m"])
def test_all_leaves_memory_only_nodes_out(server, fake, monkeypatch, option):
    with_memory_only_node(fake, monkeypatch, "explicit")
    out = run_numa_run(server, "--dry-run", option, "all", "--cpus", "1", "--", "true")
    assert out.returncode == 0, out.stderr
    assert admitted_request(fake).membind == [0, 1]


def test_all_takes_memory_only_nodes_when_they_are_ordinary(server, fake, monkeypatch):
    with_memory_only_node(fake, monkeypatch, "ordinary")
    run_numa_run(server, "--dry-run", "-i", "all", "--cpus", "1", "--", "true")
    assert admitted_request(fake).membind == [0, 1, 2]


def test_a_memory_only_node_named_by_number_is_asked_for(server, fake, monkeypatch):
    with_memory_only_node(fake, monkeypatch)
    run_numa_run(server, "--dry-run", "-i", "0,2", "--cpus", "1", "--", "true")
    assert admitted_request(fake).membind == [0, 2]


def test_all_asks_the_agent_for_its_topology_only_when_needed(server, fake):
    assert run_numa_run(server, "--dry-run", "-i", "0", "--cpus", "1").returncode == 0
    assert "topology" not in fake.service_calls()
    assert run_numa_run(server, "--dry-run", "-N", "all", "--cpus", "1").returncode == 0
    assert "topology" in fake.service_calls()
    assert admitted_request(fake).cpunodebind is None  # the first admit
    assert [c[1][0].cpunodebind for c in fake.calls if c[0] == "admit"][1] == [0, 1]


def test_inverted_cpu_list(server, fake):
    out = run_numa_run(server, "--dry-run", "-C", "!0", "--", "true")
    assert out.returncode == 0, out.stderr
    assert admitted_request(fake).physcpubind == "1-7"  # the fake machine's CPUs 0-7 but 0


def test_relative_lists_count_in_the_allowed_set(server, fake, monkeypatch):
    topology = fake.topology
    monkeypatch.setattr(fake, "topology", lambda: {**topology(), "allowed_cpus": "2-3,6-7",
                                                   "allowed_mems": "1"})
    out = run_numa_run(server, "--dry-run", "-C", "+1-2", "-m", "+0", "--", "true")
    assert out.returncode == 0, out.stderr
    request = admitted_request(fake)
    assert (request.physcpubind, request.membind) == ("3,6", [1])
    out = run_numa_run(server, "--dry-run", "-m", "+1", "--", "true")
    assert out.returncode == 125 and "position 1 is beyond the 1 allowed (1)" in out.stderr


# ------------------------------------------------------------ refusals
def test_policy_nodes_outside_an_explicit_membind_are_refused_before_booking(server, fake):
    out = run_numa_run(server, "-m", "0", "-i", "0,1", "--cpus", "1", "--", "true")
    assert out.returncode == 125
    assert "node(s) 1 lie outside the booked memory nodes 0" in out.stderr
    assert "admit" not in fake.service_calls()


def test_policy_outside_the_answered_booking_is_refused_and_released(server, fake, monkeypatch):
    admit = fake.admit

    def ignores_membind(request, caller, dry_run=False):
        answer = admit(request, caller, dry_run)
        answer["mems"] = [0]
        return answer
    monkeypatch.setattr(fake, "admit", ignores_membind)
    out = run_numa_run(server, "-i", "1", "--cpus", "1", "--", "true")
    assert out.returncode == 125
    assert "refused: --interleave 1: node(s) 1 lie outside the booked memory nodes 0" in out.stderr
    assert "release" in fake.service_calls() and fake.workloads == {}


@pytest.mark.parametrize("options,named", [
    (["-i", "9"], "--interleave 9: NUMA node(s) 9 do not exist"),
    (["-p", "9"], "--preferred 9: NUMA node(s) 9 do not exist"),
    (["-w", "8-9"], "--weighted-interleave 8-9: NUMA node(s) 9 do not exist"),
    (["-m", "9", "-l"], "membind: NUMA node(s) 9 do not exist"),
])
def test_a_policy_node_the_machine_lacks_is_named_by_the_policy_option(server, fake, monkeypatch,
                                                                       options, named):
    # The agent checks the nodes a policy books as membind; the user wrote the policy's option.
    def checks_nodes(request, caller, dry_run=False):
        raise BadRequest("membind: NUMA node(s) 9 do not exist or are not usable (usable: 0,1)")
    monkeypatch.setattr(fake, "admit", checks_nodes)
    out = run_numa_run(server, "--dry-run", *options, "--cpus", "1", "--", "true")
    assert out.returncode == 125
    assert f"numa-run: error: {named} or are not usable (usable: 0,1)" in out.stderr


def test_two_policies_exclude_each_other(server, fake):
    out = run_numa_run(server, "-i", "0", "-l", "--cpus", "1", "--", "true")
    assert out.returncode == 125 and "exclude each other" in out.stderr
    assert fake.calls == []


@pytest.mark.parametrize("argv,message", [
    (["--touch", "true"], "numactl's -T/--touch is not supported: a policy for a shared memory"),
    (["--shm=/x", "true"], "numactl's -S/--shm is not supported"),
    (["-a", "true"], "numactl's -a/--all is not supported: CPUs and nodes come from"),
    (["--cpus", "1", "-P", "0,1", "true"], "numactl's -P/--preferred-many is not supported: book"),
    (["-H"], "use numa-agent topology"),
    (["--cpu-compress", "true"], "numactl's --cpu-compress is not supported: use numa-agent topology"),
    (["-C", "0x3", "true"], "numactl's -C takes no hex mask"),
    (["-i", "0x1", "true"], "a hex mask is not a node list"),
])
def test_numactl_options_numa_run_lacks_are_refused_with_the_alternative(argv, message, capsys):
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 125
    assert message in capsys.readouterr().err


# ------------------------------------------------------------ applied for real
@pytest.mark.parametrize("enforcement", ["affinity", "cgroup"])
def test_interleave_is_set_before_exec(fake, sock_dir, enforcement):
    """The command itself reads its policy with get_mempolicy (mode 3: MPOL_INTERLEAVE)."""
    fake.enforcement = enforcement
    code = ("from numa_agent.enforcement.mempolicy import get_policy; p = get_policy(); "
            "print(p.mode, list(p.nodes))")
    with ApiServer(fake, f"{sock_dir}/agent.sock") as srv:
        out = run_numa_run(srv, "-v", "-i", "0", "--cpus", "1", "--", sys.executable, "-c", code)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "3 [0]"
    assert "numa-run: memory policy interleave nodes 0 (set)" in out.stderr


def test_simulated_enforcement_books_but_sets_nothing(fake, sock_dir):
    fake.enforcement = "simulated"
    code = "from numa_agent.enforcement.mempolicy import get_policy; print(get_policy().mode)"
    with ApiServer(fake, f"{sock_dir}/agent.sock") as srv:
        out = run_numa_run(srv, "-v", "-p", "1", "--", sys.executable, "-c", code)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "0"  # node 1 is the simulated machine's, not this one's
    assert "memory policy preferred nodes 1 (not applied: enforcement simulated)" in out.stderr


def test_dry_run_json_carries_the_policy(server):
    out = run_numa_run(server, "--dry-run", "--json", "-w", "0,1", "--cpus", "1")
    assert out.returncode == 0, out.stderr
    record = json.loads(out.stdout)
    assert record["memory_policy"] == {"mode": "weighted-interleave", "nodes": [0, 1]}
    assert record["mems"] == [0, 1]


# ------------------------------------------------------------ --show
def test_show_prints_numactls_lines_without_the_agent(sock_dir):
    out = run_numa_run(type("S", (), {"socket_path": f"{sock_dir}/absent.sock"}), "-s")
    assert out.returncode == 0, out.stderr
    keys = [line.split(":")[0] for line in out.stdout.splitlines()]
    assert keys == ["policy", "preferred node", "physcpubind", "cpubind", "nodebind", "membind",
                    "preferred"]


def test_show_after_an_interleave(fake, sock_dir):
    with ApiServer(fake, f"{sock_dir}/agent.sock") as srv:
        out = run_numa_run(srv, "-i", "0", "--shared", "--", sys.executable, "-m",
                           "numa_agent.cli.numa_run", "-s")
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[:3] == ["policy: interleave", "preferred node: 0 (interleave next)",
                                           "interleavemask: 0 "]


@pytest.mark.parametrize("argv", [["-c", "1"], ["--cpubind", "1"], ["--cpubind=1"]])
def test_numactls_older_cpubind_is_its_cpunodebind(argv):
    # numactl takes -c/--cpubind as -N/--cpunodebind (its --cpu-compress has no short form).
    assert parse_args([*argv, "x"]).cpunodebind == parse_args(["-N", "1", "x"]).cpunodebind


def test_list_forms_parse_into_the_request():
    args = parse_args(["-C", "!0", "-N", "+0", "-m", "all", "x"])
    context = common.ListContext.from_topology(
        {"numa_nodes": [{"id": 0, "cpus": "0-1"}, {"id": 1, "cpus": "2-3"}],
         "online_cpus": "0-3", "allowed_cpus": "1-3", "allowed_mems": "1"})
    body = common.build_request(args, args.command, context)
    assert (body["physcpubind"], body["cpunodebind"], body["membind"]) == ("1-3", [1], [1])


def test_explain_takes_the_same_list_forms(server, fake, capsys):
    from numa_agent.cli import explain_cmd
    from tests.cli.test_admin_commands import run
    assert run(explain_cmd, ["explain", "-C", "!0-3", "-m", "all"], server) == 0
    request = admitted_request(fake)
    assert (request.physcpubind, request.membind) == ("4-7", [0, 1])


def test_weighted_interleave_on_an_older_kernel_is_refused_naming_the_need(server, fake,
                                                                          monkeypatch, capsys):
    # What a kernel before 6.9 answers for MPOL_WEIGHTED_INTERLEAVE (this one has it).
    from numa_agent.enforcement import mempolicy
    monkeypatch.setattr(mempolicy, "set_policy", lambda mode, nodes, label: mempolicy.PolicyResult(
        False, f"set_mempolicy({label}) failed: EINVAL (Invalid argument)", "EINVAL"))
    monkeypatch.setenv("NUMA_AGENT_SOCKET", server.socket_path)
    assert main(["-w", "0", "--cpus", "1", "--", "true"]) == 125
    err = capsys.readouterr().err
    assert "refused: --weighted-interleave needs Linux 6.9 or later" in err
    assert "release" in fake.service_calls() and fake.workloads == {}
