"""Configuration: a TOML file, overridden by command-line flags.

The knobs a kubelet user knows, in snake_case. Unknown keys and bad values
stop the start with a message that names the key; nothing is guessed.
See systemd/config.example.toml for every key with its default.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping

from numa_agent.admission.machine import ConfigError, PolicyConfig
from numa_agent.core.names import DEFAULT_SOCKET
from numa_agent.core.units import parse_size

DEFAULT_CONFIG = "/etc/numa-agent/config.toml"
DEFAULT_STATE_DIR = "/var/lib/numa-agent"
DEFAULT_METRICS = "127.0.0.1:9464"

@dataclass(frozen=True)
class AgentConfig:
    sysfs_root: str = "/"
    cgroup_root: str = "auto"  # "auto" | "none" | a directory
    state_dir: str = DEFAULT_STATE_DIR
    socket: str = DEFAULT_SOCKET
    socket_mode: int = 0o660
    socket_group: str | None = None
    metrics_address: str | None = DEFAULT_METRICS  # None: no metrics endpoint
    log_level: str = "info"
    on_policy_change: str = "refuse"  # "refuse" | "reconcile"
    hotplug: bool = True
    cpuset_partitions: str = "off"  # "off" | "isolated" | "root"
    policy: PolicyConfig = field(default_factory=PolicyConfig)


_AGENT_KEYS = {"sysfs_root", "cgroup_root", "state_dir", "socket", "socket_mode", "socket_group",
               "metrics_address", "log_level", "on_policy_change", "hotplug", "cpuset_partitions"}
_SECTIONS = {"agent", "cpu_manager", "memory_manager", "topology_manager", "devices"}


def load_config(path: str | Path | None, *, required: bool = False) -> AgentConfig:
    """Read `path` (default file when None). A missing default file means
    defaults; a missing file that was asked for is an error."""
    file = Path(path or DEFAULT_CONFIG)
    try:
        raw = file.read_bytes()
    except FileNotFoundError:
        if required:
            raise ConfigError(f"config file {file} does not exist") from None
        return AgentConfig()
    except OSError as exc:
        raise ConfigError(f"cannot read config file {file}: {exc.strerror}") from None
    try:
        doc = tomllib.loads(raw.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{file}: not valid TOML: {exc}") from None
    try:
        return config_from_mapping(doc)
    except ConfigError as exc:
        raise ConfigError(f"{file}: {exc}") from None


def config_from_mapping(doc: Mapping[str, Any]) -> AgentConfig:
    _no_unknown(doc, _SECTIONS, "")
    agent = _table(doc, "agent")
    _no_unknown(agent, _AGENT_KEYS, "agent.")
    cfg = AgentConfig()
    kwargs: dict[str, Any] = {}
    for key in ("sysfs_root", "cgroup_root", "state_dir", "socket", "log_level"):
        if key in agent:
            kwargs[key] = _str(agent[key], f"agent.{key}")
    if "socket_group" in agent:
        kwargs["socket_group"] = _str(agent["socket_group"], "agent.socket_group")
    if "socket_mode" in agent:
        value = agent["socket_mode"]
        try:
            mode = int(value, 8) if isinstance(value, str) else int(value)
        except ValueError:
            raise ConfigError(f"agent.socket_mode: {value!r} is not an octal mode like \"0660\"") from None
        if not 0 <= mode <= 0o777:
            raise ConfigError(f"agent.socket_mode: {value!r} is not a file mode")
        kwargs["socket_mode"] = mode
    if "metrics_address" in agent:
        value = _str(agent["metrics_address"], "agent.metrics_address")
        kwargs["metrics_address"] = value or None
    if "on_policy_change" in agent:
        value = _str(agent["on_policy_change"], "agent.on_policy_change")
        if value not in ("refuse", "reconcile"):
            raise ConfigError(f"agent.on_policy_change: {value!r} is not 'refuse' or 'reconcile'")
        kwargs["on_policy_change"] = value
    if "cpuset_partitions" in agent:
        value = _str(agent["cpuset_partitions"], "agent.cpuset_partitions")
        if value not in ("off", "isolated", "root"):
            raise ConfigError(f"agent.cpuset_partitions: {value!r} is not 'off', 'isolated' or 'root'")
        kwargs["cpuset_partitions"] = value
    if "hotplug" in agent:
        if not isinstance(agent["hotplug"], bool):
            raise ConfigError("agent.hotplug: must be true or false")
        kwargs["hotplug"] = agent["hotplug"]

    policy: dict[str, Any] = {}
    cpu = _table(doc, "cpu_manager")
    _no_unknown(cpu, {"policy", "options", "reserved_cpus", "reserved_cpu_count"}, "cpu_manager.")
    if "policy" in cpu:
        policy["cpu_policy"] = _str(cpu["policy"], "cpu_manager.policy")
    if "options" in cpu:
        policy["cpu_options"] = _options(cpu["options"], "cpu_manager.options")
    if "reserved_cpus" in cpu:
        policy["reserved_cpus"] = _str(cpu["reserved_cpus"], "cpu_manager.reserved_cpus")
    if "reserved_cpu_count" in cpu:
        value = cpu["reserved_cpu_count"]
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ConfigError(f"cpu_manager.reserved_cpu_count: {value!r} is not a count >= 0")
        policy["reserved_cpu_count"] = value

    mem = _table(doc, "memory_manager")
    _no_unknown(mem, {"policy", "reserved_memory"}, "memory_manager.")
    if "policy" in mem:
        policy["memory_policy"] = _str(mem["policy"], "memory_manager.policy")
    if "reserved_memory" in mem:
        policy["reserved_memory"] = _reserved_memory(mem["reserved_memory"])

    tm = _table(doc, "topology_manager")
    _no_unknown(tm, {"policy", "scope", "options"}, "topology_manager.")
    if "policy" in tm:
        policy["topology_policy"] = _str(tm["policy"], "topology_manager.policy")
    if "scope" in tm:
        policy["topology_scope"] = _str(tm["scope"], "topology_manager.scope")
    if "options" in tm:
        policy["topology_options"] = _options(tm["options"], "topology_manager.options")

    devices = _table(doc, "devices")
    for name, sel in devices.items():
        if not isinstance(sel, Mapping):
            raise ConfigError(f"devices.{name}: must be a table of selector keys")
    if devices:
        policy["devices"] = {k: dict(v) for k, v in devices.items()}

    return replace(cfg, policy=replace(cfg.policy, **policy), **kwargs)


def _reserved_memory(value: Any) -> dict[int, dict[str, int]]:
    if not isinstance(value, list):
        raise ConfigError("memory_manager.reserved_memory: must be an array of tables "
                          "([[memory_manager.reserved_memory]])")
    out: dict[int, dict[str, int]] = {}
    for i, entry in enumerate(value):
        where = f"memory_manager.reserved_memory[{i}]"
        if not isinstance(entry, Mapping) or "numa_node" not in entry:
            raise ConfigError(f"{where}: needs numa_node and at least one resource")
        node = entry["numa_node"]
        if isinstance(node, bool) or not isinstance(node, int) or node < 0:
            raise ConfigError(f"{where}.numa_node: {node!r} is not a NUMA node id")
        for resource, amount in entry.items():
            if resource == "numa_node":
                continue
            if resource != "memory" and not re.fullmatch(r"hugepages-\d+kB", resource):
                raise ConfigError(f"{where}.{resource}: unknown resource (use memory or hugepages-<size>kB)")
            try:
                out.setdefault(node, {})[resource] = parse_size(amount)
            except ValueError as exc:
                raise ConfigError(f"{where}.{resource}: {exc}") from None
    return out


def _table(doc: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = doc.get(key, {})
    if not isinstance(value, Mapping):
        raise ConfigError(f"{key}: must be a table")
    return value


def _no_unknown(doc: Mapping[str, Any], known: set[str], prefix: str) -> None:
    unknown = sorted(set(doc) - known)
    if unknown:
        raise ConfigError(f"unknown key {prefix}{unknown[0]} (known: {', '.join(sorted(known))})")


def _str(value: Any, key: str) -> str:
    if not isinstance(value, str):
        raise ConfigError(f"{key}: must be a string, got {value!r}")
    return value


def _options(value: Any, key: str) -> dict[str, str]:
    if not isinstance(value, Mapping):
        raise ConfigError(f"{key}: must be a table like {{ \"full-pcpus-only\" = \"true\" }}")
    out = {}
    for k, v in value.items():
        if isinstance(v, bool):
            v = "true" if v else "false"
        elif isinstance(v, int):
            v = str(v)
        if not isinstance(v, str):
            raise ConfigError(f"{key}.{k}: must be a string, boolean or number")
        out[str(k)] = v
    return out
