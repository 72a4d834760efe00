"""The shipped sample config must load, and what it shows must be the defaults."""

import re
from pathlib import Path

import pytest

from numa_agent.service.config import AgentConfig, ConfigError, load_config

EXAMPLE = Path(__file__).resolve().parents[2] / "systemd" / "config.example.toml"


def test_example_loads_and_shows_the_defaults():
    assert load_config(EXAMPLE, required=True) == AgentConfig()


def test_commented_examples_are_valid_when_enabled(tmp_path):
    # Uncomment every "# key = value" / "# [table]" line: the hints must be real syntax.
    lines = []
    for line in EXAMPLE.read_text().splitlines():
        m = re.match(r"^# ((\[\[?[a-z_.]+\]\]?)|([\"A-Za-z_0-9-]+ = .+))$", line)
        lines.append(m.group(1) if m else line)
    enabled = tmp_path / "config.toml"
    enabled.write_text("\n".join(lines) + "\n")
    cfg = load_config(enabled, required=True)
    assert cfg.socket_group == "numa"
    assert cfg.policy.reserved_cpus == "0,32"
    assert cfg.policy.reserved_memory == {0: {"memory": 1 << 30, "hugepages-2048kB": 0}}
    assert cfg.policy.cpu_options == {"full-pcpus-only": "true"}
    assert set(cfg.policy.devices) == {"gpu", "nic"}
    assert cfg.policy.devices["nic"] == {"driver": "mlx5_core"}


def _error(tmp_path, text):
    path = tmp_path / "config.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(path, required=True)
    message = str(info.value)
    assert message.startswith(f"{path}: ") and "machine" not in message
    return message[len(f"{path}: "):]


def test_unknown_key_is_named_with_the_known_ones(tmp_path):
    assert _error(tmp_path, '[cpu_manager]\npolcy = "static"\n') == (
        "unknown key cpu_manager.polcy (known: options, policy, reserved_cpu_count, reserved_cpus)")
    assert _error(tmp_path, '[topology]\npolicy = "none"\n').startswith(
        "unknown key topology (known: agent, cpu_manager, devices, isolation, kubelet, memory_manager, observe, "
        "topology_manager)")
    assert _error(tmp_path, '[devices.gpu]\nvendr = "0x10de"\n').startswith("unknown key devices.gpu.vendr")


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
        "cpu_manager.policy: 'dynamic' is not one of none, static"
    assert _error(tmp_path, '[agent]\ncpuset_partitions = "on"\n') == \
        "agent.cpuset_partitions: 'on' is not one of isolated, off, root"


def test_observe_section(tmp_path):
    assert _error(tmp_path, "[observe]\nintruder_scan_seconds = -1\n").startswith(
        "observe.intruder_scan_seconds:")
    assert _error(tmp_path, "[observe]\nscan = 1\n") == "unknown key observe.scan (known: intruder_scan_seconds)"
    path = tmp_path / "ok.toml"
    path.write_text("[observe]\nintruder_scan_seconds = 0\n")
    assert load_config(path, required=True).intruder_scan_seconds == 0


def test_socket_mode_and_option_values(tmp_path):
    assert _error(tmp_path, '[agent]\nsocket_mode = "rw"\n') == \
        "agent.socket_mode: 'rw' is not an octal mode like \"0660\""
    assert _error(tmp_path, "[agent]\nsocket_mode = 4096\n") == "agent.socket_mode: 4096 is not a file mode"
    path = tmp_path / "ok.toml"
    path.write_text('[agent]\nsocket_mode = 384\nmetrics_address = ""\n'
                    '[cpu_manager]\noptions = { "full-pcpus-only" = true, n = 3 }\n')
    cfg = load_config(path, required=True)
    assert cfg.socket_mode == 0o600 and cfg.metrics_address is None
    assert cfg.policy.cpu_options == {"full-pcpus-only": "true", "n": "3"}


def test_a_reserved_cpu_list_alone_sets_the_count_as_the_kubelets_reserved_system_cpus(tmp_path):
    path = tmp_path / "config.toml"
    path.write_text('[cpu_manager]\nreserved_cpus = "0-1,8"\n')
    assert load_config(path, required=True).policy.reserved_cpu_count == 3
    path.write_text('[cpu_manager]\nreserved_cpus = "0-1"\nreserved_cpu_count = 1\n')
    assert load_config(path, required=True).policy.reserved_cpu_count == 1  # both given: checked later
    assert _error(tmp_path, '[cpu_manager]\nreserved_cpus = "zero"\n').startswith("cpu_manager.reserved_cpus: ")


def test_isolation_keys_are_read_and_a_bad_one_named(tmp_path):
    path = tmp_path / "ok.toml"
    path.write_text('[isolation]\ndefault = ["all"]\nidle_latency_us = 20\ngroup = "isolators"\n')
    cfg = load_config(path, required=True)
    assert cfg.isolate_default == ("irqs", "idle", "freq") and cfg.idle_latency_us == 20
    assert cfg.isolate_group == "isolators" and load_config(tmp_path / "none.toml").isolate_group is None
    assert _error(tmp_path, '[isolation]\ndefault = ["irq"]\n') == \
        "isolation.default[0]: 'irq' is not one of all, freq, idle, irqs"
    assert _error(tmp_path, "[isolation]\nidle_latency_us = -1\n").startswith("isolation.idle_latency_us: expected")
