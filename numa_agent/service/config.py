"""Configuration: a TOML file, overridden by command-line flags.

The knobs a kubelet user knows, in snake_case. The file's layout is declared
once, as the msgspec Structs below (`ConfigFile` and its sections): unknown
keys, wrong types and values outside an enumeration or range stop the start
with a message that names the key; nothing is guessed. See
systemd/config.example.toml for every key with its default.

A section's fields are named after the `AgentConfig` / `PolicyConfig` field
they set (the TOML key is the msgspec `name`), and a key that is absent stays
UNSET, so the defaults live in one place: the dataclasses.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal, Mapping

import msgspec
from msgspec import UNSET, UnsetType

from numa_agent.admission.machine import PolicyConfig
from numa_agent.core.cpuset import CpuSet, CpuSetParseError
from numa_agent.core.names import DEFAULT_SOCKET
from numa_agent.core.policy import TopologyPolicy, TopologyScope
from numa_agent.core.units import parse_size
from numa_agent.isolation.plan import parse_kinds

DEFAULT_CONFIG = "/etc/numa-agent/config.toml"
DEFAULT_STATE_DIR = "/var/lib/numa-agent"
DEFAULT_METRICS = "127.0.0.1:9464"
AUTO = "auto"
POD_RESOURCES_SOCKET_NAME = "pod-resources.sock"


class ConfigError(ValueError):
    """The configuration file (or the settings it combines with) is wrong;
    the message names the key."""


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
    intruder_scan_seconds: float = 2.0  # [observe]; 0: no intruder scan
    isolate_default: tuple[str, ...] = ()  # numa-run --isolate when a request does not say
    idle_latency_us: int = 0  # the PM QoS resume latency `idle` isolation sets; 0: none at all
    isolate_group: str | None = None  # who besides root may ask for --isolate; None: root only
    # [kubelet]: "auto" = beside the API socket / in the state directory; "" = off
    pod_resources_socket: str = AUTO
    kubelet_state_dir: str = AUTO
    pod_namespace: str = "numa-agent"
    policy: PolicyConfig = field(default_factory=PolicyConfig)

    def pod_resources_path(self) -> str | None:
        """Where PodResources is served: the configured path, or `pod-resources.sock`
        beside the API socket; None when turned off."""
        if self.pod_resources_socket == AUTO:
            return str(Path(self.socket).parent / POD_RESOURCES_SOCKET_NAME)
        return self.pod_resources_socket or None

    def kubelet_state_path(self) -> str | None:
        """The directory of cpu_manager_state and memory_manager_state, or None (off)."""
        if self.kubelet_state_dir == AUTO:
            return self.state_dir
        return self.kubelet_state_dir or None


# ---- the file, as declared types -------------------------------------------
class _Section(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    def given(self) -> dict[str, Any]:
        """The fields the file set, by AgentConfig / PolicyConfig name."""
        return {f: v for f in self.__struct_fields__ if (v := getattr(self, f)) is not UNSET}


# Tables whose keys are names the file chooses (options, device resources,
# reserved resources) are typed per value below, one key at a time, so that an
# error names the key (msgspec reports a dict key as "[...]").
Options = dict[str, Any]  # kubelet option name -> str | bool | int, kept as text
OptionValue = str | bool | int
Count = Annotated[int, msgspec.Meta(ge=0)]
NodeId = Annotated[int, msgspec.Meta(ge=0)]
Size = str | int  # "1Gi", "512Mi" or bytes
Paths = str | list[str]


class AgentSection(_Section, frozen=True):
    sysfs_root: str | UnsetType = UNSET
    cgroup_root: str | UnsetType = UNSET
    state_dir: str | UnsetType = UNSET
    socket: str | UnsetType = UNSET
    socket_mode: str | int | UnsetType = UNSET  # "0660" or 432
    socket_group: str | UnsetType = UNSET
    metrics_address: str | UnsetType = UNSET  # "" disables
    log_level: str | UnsetType = UNSET
    on_policy_change: Literal["refuse", "reconcile"] | UnsetType = UNSET
    hotplug: bool | UnsetType = UNSET
    cpuset_partitions: Literal["off", "isolated", "root"] | UnsetType = UNSET


class CpuManagerSection(_Section, frozen=True):
    cpu_policy: Literal["static", "none"] | UnsetType = msgspec.field(default=UNSET, name="policy")
    cpu_options: Options | UnsetType = msgspec.field(default=UNSET, name="options")
    reserved_cpus: str | UnsetType = UNSET
    reserved_cpu_count: Count | UnsetType = UNSET


class MemoryManagerSection(_Section, frozen=True):
    memory_policy: Literal["static", "none"] | UnsetType = msgspec.field(default=UNSET, name="policy")
    # [[memory_manager.reserved_memory]] tables: numa_node plus resource = size
    reserved_memory: list[dict[str, Any]] | UnsetType = UNSET


class TopologyManagerSection(_Section, frozen=True):
    topology_policy: TopologyPolicy | UnsetType = msgspec.field(default=UNSET, name="policy")
    topology_scope: TopologyScope | UnsetType = msgspec.field(default=UNSET, name="scope")
    topology_options: Options | UnsetType = msgspec.field(default=UNSET, name="options")


class DeviceSelectorSection(_Section, frozen=True):
    """Every given field must match a PCI device."""

    vendor: str | UnsetType = UNSET
    device: str | UnsetType = UNSET
    class_prefixes: Paths | UnsetType = UNSET
    driver: str | UnsetType = UNSET
    addresses: Paths | UnsetType = UNSET


class ObserveSection(_Section, frozen=True):
    intruder_scan_seconds: Annotated[float, msgspec.Meta(ge=0)] | UnsetType = UNSET


class IsolationSection(_Section, frozen=True):
    isolate_default: list[Literal["irqs", "idle", "freq", "all"]] | UnsetType = \
        msgspec.field(default=UNSET, name="default")
    idle_latency_us: Annotated[int, msgspec.Meta(ge=0, le=2_000_000)] | UnsetType = UNSET
    isolate_group: str | UnsetType = msgspec.field(default=UNSET, name="group")


class KubeletSection(_Section, frozen=True):
    kubelet_state_dir: str | UnsetType = msgspec.field(default=UNSET, name="state_dir")
    pod_resources_socket: str | UnsetType = UNSET
    pod_namespace: Annotated[str, msgspec.Meta(min_length=1, max_length=63, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")] \
        | UnsetType = msgspec.field(default=UNSET, name="namespace")


class ConfigFile(_Section, frozen=True):
    agent: AgentSection = AgentSection()
    kubelet: KubeletSection = KubeletSection()
    observe: ObserveSection = ObserveSection()
    cpu_manager: CpuManagerSection = CpuManagerSection()
    memory_manager: MemoryManagerSection = MemoryManagerSection()
    topology_manager: TopologyManagerSection = TopologyManagerSection()
    isolation: IsolationSection = IsolationSection()
    devices: dict[str, Any] = {}  # resource name -> DeviceSelectorSection


# ---- loading -----------------------------------------------------------------
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
    parsed = _convert(doc, ConfigFile)
    isolation = parsed.isolation.given()
    if "isolate_default" in isolation:
        isolation["isolate_default"] = parse_kinds(isolation["isolate_default"])
    return AgentConfig(**_agent_fields(parsed.agent), **parsed.observe.given(), **isolation,
                       **parsed.kubelet.given(), policy=_policy(parsed))


def _agent_fields(agent: AgentSection) -> dict[str, Any]:
    fields = agent.given()
    if "socket_mode" in fields:
        fields["socket_mode"] = _socket_mode(fields["socket_mode"])
    if "metrics_address" in fields:
        fields["metrics_address"] = fields["metrics_address"] or None
    return fields


def _policy(parsed: ConfigFile) -> PolicyConfig:
    fields = {**parsed.cpu_manager.given(), **parsed.memory_manager.given(),
              **parsed.topology_manager.given()}
    for key in ("topology_policy", "topology_scope"):
        if key in fields:
            fields[key] = str(fields[key])
    for key, where in (("cpu_options", "cpu_manager.options"), ("topology_options", "topology_manager.options")):
        if key in fields:
            fields[key] = _options(fields[key], where)
    if "reserved_memory" in fields:
        fields["reserved_memory"] = _reserved_memory(fields["reserved_memory"])
    if "reserved_cpus" in fields and "reserved_cpu_count" not in fields:
        # As the kubelet's reservedSystemCPUs: the list alone sets how many are reserved.
        try:
            fields["reserved_cpu_count"] = len(CpuSet.parse(fields["reserved_cpus"]))
        except CpuSetParseError as exc:
            raise ConfigError(f"cpu_manager.reserved_cpus: {exc}") from None
    if parsed.devices:
        fields["devices"] = {name: _convert(sel, DeviceSelectorSection, f"devices.{name}").given()
                             for name, sel in parsed.devices.items()}
    return PolicyConfig(**fields)


def _socket_mode(value: str | int) -> int:
    try:
        mode = int(value, 8) if isinstance(value, str) else value
    except ValueError:
        raise ConfigError(f"agent.socket_mode: {value!r} is not an octal mode like \"0660\"") from None
    if not 0 <= mode <= 0o777:
        raise ConfigError(f"agent.socket_mode: {value!r} is not a file mode")
    return mode


def _options(options: Options, where: str) -> dict[str, str]:
    """Option values as the text the managers parse (true/false, numbers)."""
    out = {}
    for name, value in options.items():
        value = _convert(value, OptionValue, f"{where}.{name}")
        out[name] = ("true" if value else "false") if isinstance(value, bool) else str(value)
    return out


def _reserved_memory(entries: list[dict[str, Any]]) -> dict[int, dict[str, int]]:
    out: dict[int, dict[str, int]] = {}
    for i, entry in enumerate(entries):
        where = f"memory_manager.reserved_memory[{i}]"
        if "numa_node" not in entry:
            raise ConfigError(f"{where}: needs numa_node and at least one resource")
        node = _convert(entry["numa_node"], NodeId, f"{where}.numa_node")
        for resource, amount in entry.items():
            if resource == "numa_node":
                continue
            if resource != "memory" and not re.fullmatch(r"hugepages-\d+kB", resource):
                raise ConfigError(f"{where}.{resource}: unknown resource (use memory or hugepages-<size>kB)")
            size = _convert(amount, Size, f"{where}.{resource}")
            try:
                out.setdefault(node, {})[resource] = parse_size(size)
            except ValueError as exc:
                raise ConfigError(f"{where}.{resource}: {exc}") from None
    return out


# ---- msgspec's errors, in the file's terms ---------------------------------------
_AT = re.compile(r"^(?P<what>.*?)(?: - at `\$(?P<path>[^`]*)`)?$", re.DOTALL)
_UNKNOWN = re.compile(r"^Object contains unknown field `(?P<key>.*)`$", re.DOTALL)
_BAD_ENUM = re.compile(r"^Invalid enum value (?P<value>.*)$", re.DOTALL)
_TOML_WORDS = {"`object`": "a table", "`array`": "an array"}


def _convert(value: Any, typ: Any, where: str = "") -> Any:
    """`value` as `typ`; ConfigError naming the key (`where` is the key of `value`)."""
    try:
        return msgspec.convert(value, typ)
    except msgspec.ValidationError as exc:
        raise ConfigError(_config_message(str(exc), typ, where)) from None


def _config_message(error: str, root: Any, where: str) -> str:
    """Turn msgspec's "<what> - at `$.a.b`" into "a.b: <what>" naming TOML keys."""
    m = _AT.match(error)
    assert m is not None  # the pattern matches any text
    what, inner = m["what"], (m["path"] or "").lstrip(".")
    path = ".".join(p for p in (where, inner) if p)
    unknown = _UNKNOWN.match(what)
    if unknown:
        key = f"{path}.{unknown['key']}" if path else unknown["key"]
        known = _keys_at(root, inner)
        return f"unknown key {key}" + (f" (known: {', '.join(known)})" if known else "")
    bad = _BAD_ENUM.match(what)
    if bad:
        choices = _choices_at(root, inner)
        return f"{path}: {bad['value']} is not one of {', '.join(choices)}" if choices \
            else f"{path}: invalid value {bad['value']}"
    for word, toml in _TOML_WORDS.items():
        what = what.replace(word, toml)
    what = what[:1].lower() + what[1:]
    return f"{path}: {what}" if path else what


def _type_at(root: Any, path: str) -> Any:
    """The msgspec.inspect type of the value at `path` ("a.b[0].c") in `root`."""
    t: Any = msgspec.inspect.type_info(root)
    for part in re.findall(r"[^.\[\]]+|\[\d+\]", path):
        t = _one(t)
        if isinstance(t, msgspec.inspect.StructType):
            t = next((f.type for f in t.fields if f.encode_name == part), None)
        elif isinstance(t, msgspec.inspect.DictType):
            t = t.value_type
        elif isinstance(t, msgspec.inspect.ListType):
            t = t.item_type
        else:
            return None
    return t


def _one(t: Any) -> Any:
    """The table-like member of a union (e.g. `str | list[str]`: the list)."""
    if isinstance(t, msgspec.inspect.UnionType):
        tables = (msgspec.inspect.StructType, msgspec.inspect.DictType, msgspec.inspect.ListType)
        return next((m for m in t.types if isinstance(m, tables)), t)
    return t


def _keys_at(root: Any, path: str) -> list[str]:
    t = _one(_type_at(root, path))
    if isinstance(t, msgspec.inspect.StructType):
        return sorted(f.encode_name for f in t.fields)
    return []


def _choices_at(root: Any, path: str) -> list[str]:
    t = _type_at(root, path)
    members = t.types if isinstance(t, msgspec.inspect.UnionType) else (t,)
    for m in members:
        if isinstance(m, msgspec.inspect.LiteralType):
            return [str(v) for v in m.values]
        if isinstance(m, msgspec.inspect.EnumType):
            return [str(v.value) for v in m.cls]
    return []
