"""The shipped sample config must load, and what it shows must be the defaults."""

import os
import re
from pathlib import Path

import pytest

from numa_agent.admission.quota import Limits, Quotas
from numa_agent.daemon.config import AgentConfig, ConfigError, load_config

EXAMPLE = Path(__file__).resolve().parents[2] / "systemd" / "config.example.toml"


def test_example_loads_and_shows_the_defaults():
    assert load_config(EXAMPLE, required=True) == AgentConfig()


def test_commented_examples_are_valid_when_enabled(tmp_path):
    # Uncomment every "# key = value" / "# [table]" line: the hints must be real syntax.
    lines = []
    for line in EXAMPLE.read_text().splitlines():
        m = re.match(r"^# ((\[\[?[a-z_.]+\]\]?)|([\"A-Za-z_0-9.-]+ = .+))$", line)
        lines.append(m.group(1) if m else line)
    # The example shows the count's default and a list: one of the two, not both.
    lines.remove("reserved_cpu_count = 1")
    enabled = tmp_path / "config.toml"
    enabled.write_text("\n".join(lines) + "\n")
    cfg = load_config(enabled, required=True)
    assert cfg.socket_group == "numa"
    assert cfg.policy.reserved_cpus == "0,32"
    assert cfg.policy.reserved_memory == {0: {"memory": 1 << 30, "hugepages-2048kB": 0},
                                          1: {"memory": 1100 << 20, "hugepages-1048576kB": 1 << 30}}
    assert cfg.policy.cpu_options == {"full-pcpus-only": "true"}
    assert set(cfg.policy.devices) == {"gpu", "nic"}
    assert cfg.policy.devices["nic"] == {"driver": "mlx5_core"}
    assert cfg.quotas == Quotas(default=Limits(cpus=8, memory_bytes=64 << 30),
                                users={"alice": Limits(cpus=32)},
                                groups={"hpc": Limits(cpus=48, memory_bytes=256 << 30, devices={"gpu": 2})})


def _error(tmp_path, text):
    path = _write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_config(path, required=True)
    message = str(info.value)
    assert message.startswith(f"{path}: ") and "machine" not in message
    return message[len(f"{path}: "):]


def test_unknown_key_is_named_with_the_known_ones(tmp_path):
    assert _error(tmp_path, '[cpu_manager]\npolcy = "static"\n') == (
        "unknown key cpu_manager.polcy: did you mean cpu_manager.policy? "
        "(known: options, policy, reserved_cpu_count, reserved_cpus)")
    assert _error(tmp_path, '[topology]\npolicy = "none"\n').startswith(
        "unknown key topology (known: agent, cpu_manager, devices, isolation, kubelet, memory_manager, nri, observe, "
        "quotas, topology_manager)")
    assert _error(tmp_path, '[devices.gpu]\nvendr = "0x10de"\n').startswith(
        "unknown key devices.gpu.vendr: did you mean devices.gpu.vendor?")


@pytest.mark.parametrize("text,guess", [
    ('[agent]\nreserved_cpus = "0"\n', "unknown key agent.reserved_cpus: did you mean cpu_manager.reserved_cpus?"),
    ('reserved_cpus = "0"\n', "unknown key reserved_cpus: did you mean cpu_manager.reserved_cpus?"),
    ('[agent]\nnamespace = "x"\n', "unknown key agent.namespace: did you mean kubelet.namespace?"),
    ('[agent]\npolicy = "static"\n',
     "unknown key agent.policy: did you mean cpu_manager.policy or memory_manager.policy or topology_manager.policy?"),
    ('[kubelet]\nreservd_cpus = "0"\n', "unknown key kubelet.reservd_cpus: did you mean cpu_manager.reserved_cpus?"),
    ('[cpu_manger]\npolicy = "static"\n', "unknown key cpu_manger: did you mean cpu_manager?"),
    ('[agent]\nlog_levl = "debug"\n', "unknown key agent.log_levl: did you mean agent.log_level?"),
])
def test_a_key_in_the_wrong_section_or_misspelt_names_the_one_meant(tmp_path, text, guess):
    assert _error(tmp_path, text).startswith(guess + " (known: ")


def test_no_guess_when_nothing_is_close(tmp_path):
    assert _error(tmp_path, "[agent]\nzzz = 1\n").startswith("unknown key agent.zzz (known: ")


def test_wrong_type_names_the_key(tmp_path):
    assert _error(tmp_path, "[agent]\nsocket = 5\n") == "agent.socket: expected `str`, got `int`"
    assert _error(tmp_path, '[agent]\nhotplug = "yes"\n') == "agent.hotplug: expected `bool`, got `str`"
    assert _error(tmp_path, 'agent = "x"\n') == "agent: expected a table, got `str`"
    assert _error(tmp_path, "[cpu_manager]\nreserved_cpu_count = -1\n") == \
        "cpu_manager.reserved_cpu_count: expected `int` >= 0"
    assert _error(tmp_path, "[cpu_manager]\noptions = { a = 1.5 }\n").startswith("cpu_manager.options.a: expected")
    assert _error(tmp_path, "[[memory_manager.reserved_memory]]\nnuma_node = true\nmemory = \"1Gi\"\n") == \
        "memory_manager.reserved_memory[0].numa_node: expected `int`, got `bool`"


def test_bad_enum_value_lists_the_choices(tmp_path):
    assert _error(tmp_path, '[topology_manager]\npolicy = "strict"\n') == (
        "topology_manager.policy: 'strict' is not one of none, best-effort, restricted, single-numa-node")
    assert _error(tmp_path, '[topology_manager]\nscope = "node"\n') == \
        "topology_manager.scope: 'node' is not one of container, pod"
    assert _error(tmp_path, '[cpu_manager]\npolicy = "dynamic"\n') == \
        "cpu_manager.policy: 'dynamic' is not one of None, Static, none, static"
    assert _error(tmp_path, '[agent]\ncpuset_partitions = "on"\n') == \
        "agent.cpuset_partitions: 'on' is not one of isolated, off, root"
    assert _error(tmp_path, '[memory_manager]\nmemory_only_nodes = "kubelet"\n') == \
        "memory_manager.memory_only_nodes: 'kubelet' is not one of explicit, ordinary"


def test_memory_only_nodes_reaches_the_policy(tmp_path):
    path = _write(tmp_path, '[memory_manager]\nmemory_only_nodes = "ordinary"\n')
    assert load_config(path, required=True).policy.memory_only_nodes == "ordinary"


def test_observe_section(tmp_path):
    assert _error(tmp_path, "[observe]\nintruder_scan_seconds = -1\n").startswith(
        "observe.intruder_scan_seconds:")
    assert _error(tmp_path, "[observe]\nscan = 1\n") == "unknown key observe.scan (known: intruder_scan_seconds)"
    # inf would overflow the scan timer's wait; a tiny interval would scan without pause
    assert _error(tmp_path, "[observe]\nintruder_scan_seconds = inf\n") == \
        "observe.intruder_scan_seconds: expected `float` <= 86400.0"
    assert _error(tmp_path, "[observe]\nintruder_scan_seconds = 1e-300\n") == \
        "observe.intruder_scan_seconds: 1e-300 is 0 (off) or at least 0.1"
    path = tmp_path / "ok.toml"
    path.write_text("[observe]\nintruder_scan_seconds = 0\n")
    assert load_config(path, required=True).intruder_scan_seconds == 0


def test_socket_mode_and_option_values(tmp_path):
    assert _error(tmp_path, '[agent]\nsocket_mode = "rw"\n') == \
        "agent.socket_mode: 'rw' is not an octal mode like \"0660\""
    assert _error(tmp_path, "[agent]\nsocket_mode = 4096\n") == "agent.socket_mode: 4096 is not a file mode"
    path = tmp_path / "ok.toml"
    path.write_text('[agent]\nsocket_mode = 384\nmetrics_address = ""\n'
                    '[cpu_manager]\noptions = { "full-pcpus-only" = true }\n'
                    '[topology_manager]\noptions = { "max-allowable-numa-nodes" = 3 }\n')
    cfg = load_config(path, required=True)
    assert cfg.socket_mode == 0o600 and cfg.metrics_address is None
    assert cfg.policy.cpu_options == {"full-pcpus-only": "true"}
    assert cfg.policy.topology_options == {"max-allowable-numa-nodes": "3"}


def test_a_reserved_cpu_list_alone_sets_the_count_as_the_kubelets_reserved_system_cpus(tmp_path):
    path = tmp_path / "config.toml"
    path.write_text('[cpu_manager]\nreserved_cpus = "0-1,8"\n')
    assert load_config(path, required=True).policy.reserved_cpu_count == 3
    assert _error(tmp_path, '[cpu_manager]\nreserved_cpus = "zero"\n').startswith(
        "cpu_manager.reserved_cpus: 'zero': ")


@pytest.mark.parametrize("count", [1, 2])
def test_a_reserved_cpu_list_and_a_count_together_are_refused_even_when_they_agree(tmp_path, count):
    assert _error(tmp_path, f'[cpu_manager]\nreserved_cpus = "0"\nreserved_cpu_count = {count}\n') == (
        "cpu_manager.reserved_cpus and cpu_manager.reserved_cpu_count: give one of them "
        "(the list sets the count, as the kubelet's reservedSystemCPUs)")


def test_isolation_keys_are_read_and_a_bad_one_named(tmp_path):
    path = tmp_path / "ok.toml"
    path.write_text('[isolation]\ndefault = ["all"]\nidle_latency_us = 20\ngroup = "isolators"\n')
    cfg = load_config(path, required=True)
    assert cfg.isolate_default == ("irqs", "idle", "freq") and cfg.idle_latency_us == 20
    assert cfg.isolate_group == "isolators" and load_config(tmp_path / "none.toml").isolate_group is None
    assert _error(tmp_path, '[isolation]\ndefault = ["irq"]\n') == \
        "isolation.default[0]: 'irq' is not one of all, freq, idle, irqs"
    assert _error(tmp_path, "[isolation]\nidle_latency_us = -1\n").startswith("isolation.idle_latency_us: expected")


# ---- the kubelet's spellings --------------------------------------------------------
def _load(tmp_path, text):
    path = tmp_path / "ok.toml"
    path.write_text(text)
    return load_config(path, required=True)


@pytest.mark.parametrize("written,kept", [("Static", "static"), ("None", "none"),
                                          ("static", "static"), ("none", "none")])
def test_manager_policies_as_the_kubelet_writes_them(tmp_path, written, kept):
    cfg = _load(tmp_path, f'[cpu_manager]\npolicy = "{written}"\n[memory_manager]\npolicy = "{written}"\n')
    assert (cfg.policy.cpu_policy, cfg.policy.memory_policy) == (kept, kept)


@pytest.mark.parametrize("section", ["cpu_manager", "memory_manager"])
@pytest.mark.parametrize("written", ["STATIC", "NONE", "BestEffort", "Dynamic"])
def test_other_cases_and_values_are_refused_with_the_accepted_ones(tmp_path, section, written):
    assert _error(tmp_path, f'[{section}]\npolicy = "{written}"\n') == (
        f"{section}.policy: '{written}' is not one of None, Static, none, static")


def test_reserved_memory_with_the_kubelets_resource_names_and_quantities(tmp_path):
    cfg = _load(tmp_path, """
[[memory_manager.reserved_memory]]
numa_node = 0
memory = "1Gi"
"hugepages-2Mi" = "512Mi"
"hugepages-1Gi" = "2Gi"
[[memory_manager.reserved_memory]]
numa_node = 1
memory = "1G"
"hugepages-2048kB" = 4194304
""")
    assert cfg.policy.reserved_memory == {
        0: {"memory": 1 << 30, "hugepages-2048kB": 512 << 20, "hugepages-1048576kB": 2 << 30},
        1: {"memory": 10 ** 9, "hugepages-2048kB": 4 << 20}}


def test_reserved_memory_in_the_kubelets_reserved_memory_shape(tmp_path):
    cfg = _load(tmp_path, """
[memory_manager]
reserved_memory = [
  { numaNode = 0, limits = { memory = "1100Mi" } },
  { numaNode = 1, limits = { memory = "1Gi", "hugepages-1Gi" = "1Gi" } },
]
""")
    assert cfg.policy.reserved_memory == {0: {"memory": 1100 << 20},
                                          1: {"memory": 1 << 30, "hugepages-1048576kB": 1 << 30}}


@pytest.mark.parametrize("entry,message", [
    ('numa_node = 0\n"hugepages-2M" = "1Gi"',
     "memory_manager.reserved_memory[0].hugepages-2M: invalid hugepage size '2M': 2000000 bytes "
     "is not a power of two of at least 1 KiB; did you mean 2Mi?"),
    ('numa_node = 0\nmemory = "1GG"',
     "memory_manager.reserved_memory[0].memory: invalid size '1GG': use a whole number"),
    ('numa_node = 0\nmemory = "512m"',
     "memory_manager.reserved_memory[0].memory: invalid size '512m': m is milli"),
    ('numa_node = 0\nmemroy = "1Gi"',
     "memory_manager.reserved_memory[0].memroy: unknown resource 'memroy' (use memory or hugepages-"),
    ('numaNode = 0\nlimits = { "hugepages_1Gi" = "1Gi" }',
     "memory_manager.reserved_memory[0].limits.hugepages_1Gi: unknown resource"),
    ('numaNode = 0\nlimits = "1Gi"',
     "memory_manager.reserved_memory[0].limits: expected a table, got `str`"),
    ('numaNode = 0\nmemory = "1Gi"\nlimits = { memory = "1Gi" }',
     "memory_manager.reserved_memory[0]: resources go either in limits"),
    ('numa_node = 0\nnumaNode = 0\nmemory = "1Gi"', "needs exactly one of numa_node"),
    ('memory = "1Gi"', "needs exactly one of numa_node"),
    ('numa_node = 0\nmemory = "1Gi"\n[[memory_manager.reserved_memory]]\nnumaNode = 0\n'
     'limits = { memory = "2Gi" }',
     "memory_manager.reserved_memory[1].limits.memory: memory of NUMA node 0 is reserved twice"),
    ('numa_node = 0\n"hugepages-2Mi" = "2Mi"\n"hugepages-2048kB" = "2Mi"',
     "hugepages-2048kB of NUMA node 0 is reserved twice"),
])
def test_a_reserved_memory_mistake_names_the_key_and_the_value(tmp_path, entry, message):
    assert message in _error(tmp_path, f"[[memory_manager.reserved_memory]]\n{entry}\n")


@pytest.mark.parametrize("text,message", [
    ('[topology_manager]\noptions = { "prefer-closest-numa-node" = true }\n',
     "topology_manager.options: unknown topology manager option(s) 'prefer-closest-numa-node'; "
     "known: prefer-closest-numa-nodes, max-allowable-numa-nodes, numa-allocation-strategy"),
    ('[topology_manager]\noptions = { "numa-allocation-strategy" = "spread" }\n',
     "topology_manager.options: topology manager option numa-allocation-strategy: unknown value 'spread'; "
     "expected one of "
     "none, least-allocated, most-allocated"),
    ('[topology_manager]\noptions = { "prefer-closest-numa-nodes" = "yes" }\n',
     "topology_manager.options: topology manager option prefer-closest-numa-nodes: expected true or "
     "false, got 'yes'"),
    ('[topology_manager]\noptions = { "max-allowable-numa-nodes" = "many" }\n',
     "topology_manager.options: topology manager option max-allowable-numa-nodes: expected a positive "
     "integer, got 'many'"),
    ('[cpu_manager]\noptions = { "full-pcpu-only" = true }\n',
     "cpu_manager.options: unknown CPU manager option 'full-pcpu-only' (known: align-by-socket,"),
    ('[cpu_manager]\noptions = { "full-pcpus-only" = "on" }\n',
     "cpu_manager.options: bad value for CPU manager option 'full-pcpus-only': 'on' (want true or false)"),
])
def test_a_misspelt_option_is_a_configuration_error(tmp_path, text, message):
    assert _error(tmp_path, text).startswith(message)


@pytest.mark.parametrize("text,message", [
    ('[devices.gpu]\nvendor = "nvidia"\n',
     "devices.gpu: vendor 'nvidia' is not a hexadecimal PCI vendor of at most 4 digits, e.g. 0x10de"),
    ('[devices.gpu]\ndevice = "0x20b0f"\n', "devices.gpu: device '0x20b0f' is not a hexadecimal PCI device"),
    ('[devices.gpu]\nclass_prefixes = ["display"]\n', "devices.gpu: class 'display' is not a hexadecimal"),
    ('[devices.nic]\naddresses = ["3b:00.0"]\n', "devices.nic: address '3b:00.0' is not a PCI address"),
    ('[devices.GPU]\nvendor = "0x10de"\n', "devices.GPU: invalid device resource name 'GPU'"),
    ('[devices.gpu]\n', "devices.gpu: device resource 'gpu' has an empty selector"),
])
def test_a_device_selector_mistake_is_a_configuration_error(tmp_path, text, message):
    assert _error(tmp_path, text).startswith(message)


def test_a_misspelt_log_level_is_named_by_its_key_when_the_file_is_read(tmp_path):
    # Not by the flag --log-level, and not only once logging is set up after loading.
    assert _error(tmp_path, '[agent]\nlog_level = "verbose"\n') == (
        "agent.log_level: invalid log level 'verbose'; valid levels: debug, info, warning, error, critical")
    assert load_config(_write(tmp_path, '[agent]\nlog_level = "DEBUG"\n'), required=True).log_level == "DEBUG"


def _write(tmp_path, text):
    path = tmp_path / "config.toml"
    path.write_text(text)
    return path


@pytest.mark.parametrize("text,message", [
    ('[agent]\nmetrics_address = "9464"\n',
     "agent.metrics_address: metrics address '9464' has no port; expected HOST:PORT"),
    ('[agent]\nmetrics_address = "127.0.0.1:99999"\n',
     "agent.metrics_address: metrics address '127.0.0.1:99999': port must be a number"),
    ('[agent]\ncgroup_root = "autoo"\n',
     "agent.cgroup_root: 'autoo' is not auto, none or an absolute directory"),
])
def test_an_agent_value_mistake_is_a_configuration_error_naming_the_key(tmp_path, text, message):
    # Not found only at start-up, as a metrics or cgroup failure, or as a relative directory.
    assert _error(tmp_path, text).startswith(message)


def test_an_agent_value_that_is_right_loads(tmp_path):
    cfg = load_config(_write(tmp_path, '[agent]\nmetrics_address = "[::1]:9464"\ncgroup_root = "/sys/fs/cgroup/x"\n'),
                      required=True)
    assert (cfg.metrics_address, cfg.cgroup_root) == ("[::1]:9464", "/sys/fs/cgroup/x")
    assert load_config(_write(tmp_path, '[agent]\nmetrics_address = ""\n'), required=True).metrics_address is None


def test_quota_entries_are_read_and_a_bad_one_named(tmp_path):
    path = tmp_path / "ok.toml"
    path.write_text('[devices.gpu]\nvendor = "0x10de"\n[quotas]\ndefault = { memory = "1Gi" }\n'
                    'groups.hpc = { devices = { gpu = 0 } }\n')
    assert load_config(path, required=True).quotas == Quotas(default=Limits(memory_bytes=1 << 30),
                                                            groups={"hpc": Limits(devices={"gpu": 0})})
    assert load_config(tmp_path / "none.toml").quotas == Quotas()
    assert _error(tmp_path, "[quotas]\nusers.alice = { cpu = 1 }\n") == \
        "unknown key quotas.users.alice.cpu: did you mean quotas.users.alice.cpus? (known: cpus, devices, memory)"
    assert _error(tmp_path, "[quotas]\ngroups.hpc = { cpus = -1 }\n") == "quotas.groups.hpc.cpus: expected `int` >= 0"
    assert _error(tmp_path, '[quotas]\ndefault = { memory = "1x" }\n').startswith("quotas.default.memory: invalid size '1x'")
    assert _error(tmp_path, "[quotas]\nusers.bob = { devices = { gpu = 1 } }\n") == \
        "quotas.users.bob.devices.gpu: no such device resource in [devices] (known: none configured)"
    assert _error(tmp_path, "[quotas]\nuser.bob = { cpus = 1 }\n") == \
        "unknown key quotas.user: did you mean quotas.users? (known: default, groups, users)"


# ---- files that are not a configuration --------------------------------------------
def test_nesting_past_the_parsers_depth_is_a_configuration_error(tmp_path):
    deep = "[" * 100_000 + "]" * 100_000
    assert _error(tmp_path, f"[agent]\nsocket = {deep}\n") == \
        "not valid TOML: arrays or tables nested too deeply"
    assert _error(tmp_path, "a = " + "{ b = " * 3000 + "1" + " }" * 3000 + "\n") == \
        "not valid TOML: arrays or tables nested too deeply"


def test_a_file_not_in_utf8_is_named_with_the_byte(tmp_path):
    path = tmp_path / "latin1.toml"
    path.write_bytes(b'[agent]\nlog_level = "d\xe9bug"\n')
    with pytest.raises(ConfigError) as info:
        load_config(path, required=True)
    assert str(info.value) == f"{path}: not UTF-8 text (byte 22); TOML files are UTF-8"


def test_a_fifo_is_refused_rather_than_waited_on(tmp_path):
    import os

    os.mkfifo(tmp_path / "config.toml")
    with pytest.raises(ConfigError, match=f"config file {tmp_path}/config.toml is a FIFO, not a regular file"):
        load_config(tmp_path / "config.toml", required=True)


def test_a_directory_or_unreadable_file_is_named(tmp_path, monkeypatch):
    with pytest.raises(ConfigError, match=f"config file {tmp_path} is a directory, not a regular file"):
        load_config(tmp_path, required=True)
    path = _write(tmp_path, "")
    real_open = os.open

    def refused(name, *args, **kwargs):
        if str(name) == str(path):
            raise PermissionError(13, "Permission denied")
        return real_open(name, *args, **kwargs)

    monkeypatch.setattr(os, "open", refused)  # root reads a mode-000 file all the same
    with pytest.raises(ConfigError, match=f"cannot read config file {path}: Permission denied"):
        load_config(path, required=True)


@pytest.mark.parametrize("text,message", [
    ('[agent]\nsocket = ""\n', "agent.socket: must not be empty"),
    ('[agent]\nstate_dir = " "\n', "agent.state_dir: must not be empty"),
    ('[agent]\nsocket = "/run/a\\u0000b"\n', "agent.socket: '/run/a\\x00b' holds a NUL character"),
    ('[agent]\nsocket_group = ""\n', "agent.socket_group: must not be empty"),
    ('[kubelet]\nstate_dir = "/var/a\\u0000"\n', "kubelet.state_dir: '/var/a\\x00' holds a NUL character"),
    ('[kubelet]\npod_resources_socket = "\\u0000"\n', "kubelet.pod_resources_socket: '\\x00' holds a NUL"),
    ('[agent]\nmetrics_address = "localhost"\n', "agent.metrics_address: metrics address 'localhost' has no port"),
])
def test_paths_and_names_that_cannot_be_used_are_named(tmp_path, text, message):
    assert _error(tmp_path, text).startswith(message)
