"""`numa-agent serve` refuses to start with one clear line, and leaves nothing
behind, for each way a start can go wrong: exit 78 (EX_CONFIG, which the unit
does not restart) when the configuration itself is wrong, 1 otherwise."""

import os
import subprocess
import sys

import pytest

from tests.support.agent_process import AgentProcess, wait_for


def serve(tmp_path, *args, timeout=60):
    return subprocess.run([sys.executable, "-m", "numa_agent.cli.numa_agent", "serve",
                           "--state-dir", str(tmp_path / "state"), "--socket", str(tmp_path / "s.sock"),
                           "--metrics-address", "", "--no-hotplug", *args],
                          capture_output=True, text=True, timeout=timeout)


EX_CONFIG = 78


def one_clear_line(result, *needles, code=1):
    assert result.returncode == code, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr
    line = [l for l in result.stderr.splitlines() if l.startswith("numa-agent:")]
    assert line, result.stderr
    for needle in needles:
        assert needle in line[-1], line[-1]


def test_unknown_config_key(tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text("[cpu_manager]\npolicy = \"static\"\nreserved_cpu = 2\n")
    r = serve(tmp_path, "--config", str(cfg))
    one_clear_line(r, "unknown key cpu_manager.reserved_cpu", str(cfg), code=EX_CONFIG)
    assert not (tmp_path / "s.sock").exists() and not (tmp_path / "state").exists()


def test_bad_config_value(tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text("[topology_manager]\npolicy = \"strict\"\n")
    one_clear_line(serve(tmp_path, "--config", str(cfg)), "topology_manager.policy", "'strict'", code=EX_CONFIG)


@pytest.mark.parametrize("text,needles", [
    ('[topology_manager]\noptions = { "prefer-closest-numa-node" = true }\n',
     ["topology_manager.options", "'prefer-closest-numa-node'", "known: prefer-closest-numa-nodes"]),
    ('[cpu_manager]\noptions = { "full-pcpu-only" = true }\n',
     ["cpu_manager.options", "'full-pcpu-only'", "known:"]),
    ('[cpu_manager]\nreserved_cpus = "0-"\n', ["cpu_manager.reserved_cpus", "'0-'"]),
    ('[cpu_manager]\nreserved_cpus = "0"\nreserved_cpu_count = 1\n',
     ["cpu_manager.reserved_cpus and cpu_manager.reserved_cpu_count: give one of them"]),
    ('[agent]\nsocket_group = "no-such-group-here"\n', ["agent.socket_group: no group named 'no-such-group-here'"]),
    ('[isolation]\ngroup = "no-such-group-here"\n', ["isolation.group: no group named 'no-such-group-here'"]),
    ("[agent]\nsocket = " + "[" * 100_000 + "]" * 100_000 + "\n", ["nested too deeply"]),
    ('[[memory_manager.reserved_memory]]\nnuma_node = 0\n"hugepages-2M" = "1Gi"\n',
     ["memory_manager.reserved_memory[0].hugepages-2M", "did you mean 2Mi?"]),
    ('[devices.GPU]\nvendor = "0x10de"\n', ["devices.GPU", "invalid device resource name 'GPU'"]),
    ('[memory_manager]\nmemory_only_nodes = "kubelet"\n',
     ["memory_manager.memory_only_nodes", "'kubelet' is not one of explicit, ordinary"]),
])
def test_a_spelling_mistake_is_a_configuration_error_not_a_misfit(tmp_path, text, needles):
    cfg = tmp_path / "c.toml"
    cfg.write_text(text)
    r = serve(tmp_path, "--config", str(cfg))
    one_clear_line(r, str(cfg), *needles, code=EX_CONFIG)
    assert "does not fit" not in r.stderr
    assert not (tmp_path / "s.sock").exists() and not (tmp_path / "state").exists()


@pytest.mark.parametrize("key", ["users.no-such-user-q25", "groups.no-such-group-q25"])
def test_a_quota_for_a_user_or_group_that_does_not_exist(tmp_path, key):
    cfg = tmp_path / "c.toml"
    cfg.write_text(f"[quotas]\n{key} = {{ cpus = 1 }}\n")
    r = serve(tmp_path, "--config", str(cfg))
    one_clear_line(r, f"{cfg}: quotas.{key}: no ", "in the user database", code=EX_CONFIG)
    assert not (tmp_path / "s.sock").exists() and not (tmp_path / "state").exists()


@pytest.mark.parametrize("args,needles", [
    (["--socket-group", "no-such-group-here"], ["--socket-group: no group named 'no-such-group-here'"]),
    (["--metrics-address", "9464"], ["--metrics-address: metrics address '9464' has no port"]),
    (["--cgroup-root", "numa"], ["--cgroup-root: 'numa' is not auto, none or an absolute directory"]),
    (["--state-dir", ""], ["--state-dir: must not be empty"]),
    (["--socket", " "], ["--socket: must not be empty"]),
])
def test_a_bad_flag_value_is_named_by_its_flag(tmp_path, args, needles):
    one_clear_line(serve(tmp_path, *args), *needles, code=EX_CONFIG)
    assert not (tmp_path / "s.sock").exists() and not (tmp_path / "state").exists()


def test_the_flag_is_named_not_the_file_it_overrides(tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text('[agent]\nsocket_group = "root"\n')
    r = serve(tmp_path, "--config", str(cfg), "--socket-group", "no-such-group-here")
    one_clear_line(r, "--socket-group: no group named", code=EX_CONFIG)
    assert str(cfg) not in r.stderr


@pytest.mark.parametrize("args", [["--pod-resources-socket", "{tmp}/s.sock"],
                                  ["--metrics-address", "unix:{tmp}/s.sock"],
                                  ["--pod-resources-socket", "{tmp}/p.sock", "--metrics-address", "unix:{tmp}/p.sock"]])
def test_two_endpoints_on_one_path_are_a_configuration_error(tmp_path, args):
    """Not "another agent is already serving" from the second bind: the configuration says it twice."""
    r = serve(tmp_path, *[a.format(tmp=tmp_path) for a in args])
    one_clear_line(r, "are the same path", "each needs its own", code=EX_CONFIG)
    assert not (tmp_path / "state").exists()


def test_too_few_file_descriptors_is_one_line(tmp_path):
    import resource

    def few():
        resource.setrlimit(resource.RLIMIT_NOFILE, (16, 16))

    r = subprocess.run([sys.executable, "-m", "numa_agent.cli.numa_agent", "serve",
                        "--state-dir", str(tmp_path / "state"), "--socket", str(tmp_path / "s.sock"),
                        "--metrics-address", "", "--no-hotplug", "--cgroup-root", "none"],
                       capture_output=True, text=True, timeout=60, preexec_fn=few)
    one_clear_line(r, "open-files limit (RLIMIT_NOFILE) is 16", "LimitNOFILE=", code=EX_CONFIG)
    assert not (tmp_path / "state").exists()


def test_a_snapshot_that_is_no_archive_is_one_line(tmp_path):
    junk = tmp_path / "machine.tar.gz"
    junk.write_text("not an archive\n")
    r = serve(tmp_path, "--sysfs-root", str(junk))
    one_clear_line(r, "is not a readable tar archive")
    assert len([l for l in r.stderr.splitlines() if not l.startswith("20")]) == 1, r.stderr


def _not_a_config(tmp_path, kind):
    if kind == "device":
        return "/dev/zero", "is a character device, not a regular file"
    if kind == "fifo":
        os.mkfifo(tmp_path / "fifo")
        return str(tmp_path / "fifo"), "is a FIFO, not a regular file"
    if kind == "directory":
        return str(tmp_path), "is a directory, not a regular file"
    big = tmp_path / "big.toml"
    with open(big, "wb") as f:  # sparse: no disk spent on it
        f.truncate(64 << 20)
    return str(big), "is 64 MiB, larger than the 1 MiB a configuration may be"


@pytest.mark.parametrize("kind", ["device", "fifo", "directory", "endless"])
def test_a_config_that_is_no_regular_file_or_too_big_is_one_line(tmp_path, kind):
    """Never read whole (/dev/zero would eat memory until a MemoryError), never
    blocked on (a FIFO): one line, exit 78."""
    path, needle = _not_a_config(tmp_path, kind)
    r = serve(tmp_path, "--config", path)
    one_clear_line(r, f"config file {path} {needle}", code=EX_CONFIG)
    assert not (tmp_path / "s.sock").exists() and not (tmp_path / "state").exists()


def test_a_symlink_to_a_regular_config_file_is_read(tmp_path):
    cfg = tmp_path / "real.toml"
    cfg.write_text('[agent]\nlog_level = "chatty"\n')
    (tmp_path / "link.toml").symlink_to(cfg)
    one_clear_line(serve(tmp_path, "--config", str(tmp_path / "link.toml")), "agent.log_level", code=EX_CONFIG)


def test_missing_config_file_that_was_asked_for(tmp_path):
    one_clear_line(serve(tmp_path, "--config", str(tmp_path / "nope.toml")), "does not exist", code=EX_CONFIG)


def test_broken_sysfs_root(tmp_path):
    (tmp_path / "fake" / "sys").mkdir(parents=True)
    one_clear_line(serve(tmp_path, "--sysfs-root", str(tmp_path / "fake")), "topology discovery failed")


def test_explicit_cgroup_root_that_cannot_be_used(tmp_path):
    one_clear_line(serve(tmp_path, "--cgroup-root", str(tmp_path / "no-such-cgroup")),
                   "cannot be used", "no-such-cgroup")


def test_bad_log_level(tmp_path):
    one_clear_line(serve(tmp_path, "--log-level", "chatty"), "--log-level", code=EX_CONFIG)
    cfg = tmp_path / "c.toml"
    cfg.write_text('[agent]\nlog_level = "chatty"\n')
    one_clear_line(serve(tmp_path, "--config", str(cfg)), "agent.log_level", code=EX_CONFIG)


def test_a_configuration_that_does_not_fit_this_machine_is_restarted(tmp_path):
    """Judged against the hardware (CPUs may still come online during boot),
    not a configuration error: exit 1, which the unit restarts."""
    cfg = tmp_path / "c.toml"
    cfg.write_text('[cpu_manager]\nreserved_cpus = "4095"\n')
    one_clear_line(serve(tmp_path, "--config", str(cfg), "--cgroup-root", "none"),
                   "configuration does not fit this machine", "cpu_manager.reserved_cpus")


def test_changed_policies_under_a_checkpoint_are_a_configuration_error(tmp_path):
    """Restarting cannot book the checkpoint's workloads under other policies:
    the remedy is in the configuration, so the start exits 78."""
    first = AgentProcess(tmp_path, "--cgroup-root", "none").start()
    kept = subprocess.Popen([sys.executable, "-m", "numa_agent.cli.numa_run", "--socket", first.socket,
                             "--name", "kept", "--shared", "--", "sleep", "60"])
    try:
        wait_for(lambda: any(w["name"] == "kept" for w in first.call("GET", "/v1/workloads")[1]["workloads"]))
    finally:
        assert first.stop() == 0
    try:
        cfg = tmp_path / "c.toml"
        cfg.write_text('[topology_manager]\npolicy = "single-numa-node"\n')
        r = subprocess.run([sys.executable, "-m", "numa_agent.cli.numa_agent", "serve", "--config", str(cfg),
                            "--state-dir", str(first.state_dir), "--socket", first.socket,
                            "--metrics-address", "", "--no-hotplug", "--cgroup-root", "none"],
                           capture_output=True, text=True, timeout=60)
        one_clear_line(r, "booked under other policies", "on_policy_change", code=EX_CONFIG)
    finally:
        kept.kill()
        kept.wait()


def test_second_agent_on_the_same_socket_is_refused(tmp_path):
    first = AgentProcess(tmp_path, "--cgroup-root", "none").start()
    try:
        r = subprocess.run([sys.executable, "-m", "numa_agent.cli.numa_agent", "serve",
                            "--state-dir", str(tmp_path / "state2"), "--socket", first.socket,
                            "--metrics-address", "", "--no-hotplug", "--cgroup-root", "none"],
                           capture_output=True, text=True, timeout=60)
        one_clear_line(r, first.socket)
        assert first.call("GET", "/v1/health")[0] == 200  # the first one is untouched
    finally:
        first.stop()


def test_second_agent_on_the_same_state_dir_is_refused_before_any_write(tmp_path):
    """Another socket, the same --state-dir: the second agent stops at once,
    names the holder, and the live agent's checkpoint is byte for byte intact."""
    first = AgentProcess(tmp_path, "--cgroup-root", "none").start()
    kept = subprocess.Popen([sys.executable, "-m", "numa_agent.cli.numa_run", "--socket", first.socket,
                             "--name", "kept", "--shared", "--", "sleep", "60"])
    try:
        wait_for(lambda: any(w["name"] == "kept" for w in first.call("GET", "/v1/workloads")[1]["workloads"]))
        files = [first.state_dir / "checkpoint.json", first.state_dir / "checkpoint.journal"]

        def state_bytes():
            return b"".join(f.read_bytes() for f in files if f.exists())

        assert b'"kept"' in state_bytes()  # in the snapshot or in the journal after it
        before = state_bytes()
        r = subprocess.run([sys.executable, "-m", "numa_agent.cli.numa_agent", "serve",
                            "--state-dir", str(first.state_dir), "--socket", str(tmp_path / "other.sock"),
                            "--metrics-address", "", "--no-hotplug", "--cgroup-root", "none"],
                           capture_output=True, text=True, timeout=60)
        one_clear_line(r, "in use by another numa-agent", f"PID {first.proc.pid}")
        assert state_bytes() == before
        assert not (tmp_path / "other.sock").exists()
        assert first.call("GET", "/v1/health")[0] == 200
    finally:
        kept.kill()
        kept.wait()
        first.stop()


def test_world_writable_state_dir_is_refused(tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    os.chmod(state, 0o777)
    one_clear_line(serve(tmp_path, "--cgroup-root", "none"), "writable by its group or by others", "chmod go-w",
                   "owner root (uid 0), mode 0777", code=EX_CONFIG)
    assert os.listdir(state) == []


@pytest.mark.parametrize("what,option", [("kubelet state directory", "--kubelet-state-dir"),
                                         ("socket directory", "--socket"),
                                         ("socket directory", "--pod-resources-socket"),
                                         ("socket directory", "--metrics-address")])
def test_a_directory_others_can_write_is_refused_before_anything_is_written(tmp_path, what, option):
    """Exit 78, one line naming the directory, its owner and mode; nothing made in it."""
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    value = str(shared) if option == "--kubelet-state-dir" else str(shared / "x.sock")
    if option == "--metrics-address":
        value = f"unix:{value}"
    r = serve(tmp_path, "--cgroup-root", "none", option, value)
    one_clear_line(r, f"{what} {shared} is writable by its group or by others", "mode 0777", code=EX_CONFIG)
    assert os.listdir(shared) == []
    assert not (tmp_path / "state").exists()


def test_failed_start_leaves_no_state_dir(tmp_path):
    (tmp_path / "fake" / "sys").mkdir(parents=True)
    one_clear_line(serve(tmp_path, "--sysfs-root", str(tmp_path / "fake")), "topology discovery failed")
    assert not (tmp_path / "state").exists()


def _damaged_state(tmp_path):
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    (state / "checkpoint.json").write_text('{"version": 1, "checksum": "sha256:00", "data": {}}\n')
    os.chmod(state / "checkpoint.json", 0o600)
    return state


def test_a_taken_socket_stops_the_start_before_recovery_writes(tmp_path):
    """Recovery would quarantine this damaged checkpoint; a start that cannot
    have its socket must not get that far."""
    first = AgentProcess(tmp_path / "first", "--cgroup-root", "none").start()
    try:
        state = _damaged_state(tmp_path)
        r = subprocess.run([sys.executable, "-m", "numa_agent.cli.numa_agent", "serve",
                            "--state-dir", str(state), "--socket", first.socket,
                            "--metrics-address", "", "--no-hotplug", "--cgroup-root", "none"],
                           capture_output=True, text=True, timeout=60)
        one_clear_line(r, first.socket)
        assert sorted(os.listdir(state)) == ["checkpoint.json", "lock"]
    finally:
        first.stop()


def test_a_taken_metrics_port_stops_the_start_before_recovery_writes(tmp_path):
    import socket

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    try:
        state = _damaged_state(tmp_path)
        port = taken.getsockname()[1]
        r = serve(tmp_path, "--cgroup-root", "none", "--metrics-address", f"127.0.0.1:{port}")
        one_clear_line(r, f"127.0.0.1:{port}")
        assert sorted(os.listdir(state)) == ["checkpoint.json", "lock"]
        assert not (tmp_path / "s.sock").exists()
    finally:
        taken.close()


LISTENERS = [("--socket", "{}", "agent.socket"),
             ("--pod-resources-socket", "{}", "kubelet.pod_resources_socket"),
             ("--metrics-address", "unix:{}", "agent.metrics_address")]


@pytest.mark.parametrize("option,form,key", LISTENERS)
def test_a_socket_path_too_long_is_a_configuration_error(tmp_path, option, form, key):
    path = str(tmp_path / ("x" * 120 + ".sock"))
    r = serve(tmp_path, "--cgroup-root", "none", option, form.format(path))
    one_clear_line(r, "longer than a Unix socket's 107", key, code=EX_CONFIG)
    assert not (tmp_path / "state").exists()


@pytest.mark.parametrize("option,form,key", LISTENERS)
def test_a_socket_path_that_is_a_file_is_a_configuration_error(tmp_path, option, form, key):
    """Someone's file at the path: no restart removes it."""
    blocker = tmp_path / "blocker"
    blocker.write_text("not a socket")
    r = serve(tmp_path, "--cgroup-root", "none", option, form.format(blocker))
    one_clear_line(r, f"{blocker} exists and is not a socket", key, code=EX_CONFIG)
    assert blocker.read_text() == "not a socket" and not (tmp_path / "state").exists()


@pytest.mark.parametrize("option,form,key", LISTENERS)
def test_a_socket_under_a_file_is_a_configuration_error(tmp_path, option, form, key):
    blocker = tmp_path / "blocker"
    blocker.write_text("not a socket")
    r = serve(tmp_path, "--cgroup-root", "none", option, form.format(blocker / "x.sock"))
    one_clear_line(r, f"socket directory {blocker}", "is not a directory", code=EX_CONFIG)
    assert not (tmp_path / "state").exists()


@pytest.mark.parametrize("option", ["--state-dir", "--kubelet-state-dir"])
def test_a_state_directory_under_a_file_is_a_configuration_error(tmp_path, option):
    blocker = tmp_path / "blocker"
    blocker.write_text("not a directory")
    r = serve(tmp_path, "--cgroup-root", "none", option, str(blocker / "state"))
    one_clear_line(r, str(blocker), code=EX_CONFIG)
    assert blocker.read_text() == "not a directory"


@pytest.mark.parametrize("option,key", [("--state-dir", "agent.state_dir"), ("--kubelet-state-dir", "kubelet.state_dir")])
def test_a_directory_name_no_file_system_takes_is_a_configuration_error(tmp_path, option, key):
    """ENAMETOOLONG, as EROFS or EACCES: the path fails the same way at every restart."""
    r = serve(tmp_path, "--cgroup-root", "none", option, str(tmp_path / ("x" * 300)))
    one_clear_line(r, "File name too long", key, code=EX_CONFIG)
