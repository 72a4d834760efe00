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

import os
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Callable, Literal, Mapping

import msgspec
from msgspec import UNSET, UnsetType

from numa_agent.admission.cpu_options import CpuManagerOptions
from numa_agent.admission.device_manager import DeviceResource
from numa_agent.admission.machine import PolicyConfig, device_selector
from numa_agent.admission.memory_manager import MEMORY, hugepages_resource
from numa_agent.admission.quota import Limits, Quotas
from numa_agent.admission.topology_manager import TopologyManagerOptions
from numa_agent.core.cpuset import CpuSet, CpuSetParseError
from numa_agent.core.names import DEFAULT_SOCKET
from numa_agent.core.policy import TopologyPolicy, TopologyScope
from numa_agent.core.units import format_bytes, parse_hugepage_size, parse_size
from numa_agent.daemon.logging_setup import check_level
from numa_agent.isolation.plan import parse_kinds
from numa_agent.views.metrics import check_address_form, socket_path_of

DEFAULT_CONFIG = "/etc/numa-agent/config.toml"
DEFAULT_STATE_DIR = "/var/lib/numa-agent"
DEFAULT_METRICS = "127.0.0.1:9464"
AUTO = "auto"
POD_RESOURCES_SOCKET_NAME = "pod-resources.sock"
# The runtime's NRI socket (numa_agent.nri.plugin.DEFAULT_SOCKET; not imported here, which
# would load protobuf for every command that reads the configuration; a test holds them equal).
DEFAULT_NRI_SOCKET = "/var/run/nri/nri.sock"


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
    quotas: Quotas = field(default_factory=Quotas)  # [quotas]; empty: nobody is limited
    # [nri]: the agent as an NRI plugin of the container runtime (containerd, CRI-O)
    nri_enabled: bool = False
    nri_socket: str = DEFAULT_NRI_SOCKET
    nri_plugin_name: str = "numa-agent"
    nri_plugin_index: str = "10"  # two digits: the runtime calls its plugins in this order
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
# The kubelet writes the CPU manager's policy `static`/`none` and the memory manager's
# `Static`/`None`; either section takes both, as written (kept lowercase inside).
ManagerPolicy = Literal["none", "static", "None", "Static"]


class AgentSection(_Section, frozen=True):
    sysfs_root: str | UnsetType = UNSET
    cgroup_root: str | UnsetType = UNSET
    state_dir: str | UnsetType = UNSET
    socket: str | UnsetType = UNSET
    socket_mode: str | int | UnsetType = UNSET  # "0660" or 432
    socket_group: str | UnsetType = UNSET
    metrics_address: str | UnsetType = UNSET  # HOST:PORT or unix:PATH; "" disables
    log_level: str | UnsetType = UNSET
    on_policy_change: Literal["refuse", "reconcile"] | UnsetType = UNSET
    hotplug: bool | UnsetType = UNSET
    cpuset_partitions: Literal["off", "isolated", "root"] | UnsetType = UNSET


class CpuManagerSection(_Section, frozen=True):
    cpu_policy: ManagerPolicy | UnsetType = msgspec.field(default=UNSET, name="policy")
    cpu_options: Options | UnsetType = msgspec.field(default=UNSET, name="options")
    reserved_cpus: str | UnsetType = UNSET
    reserved_cpu_count: Count | UnsetType = UNSET


class MemoryManagerSection(_Section, frozen=True):
    memory_policy: ManagerPolicy | UnsetType = msgspec.field(default=UNSET, name="policy")
    # [[memory_manager.reserved_memory]] tables: numa_node plus resource = size, or the
    # kubelet's reservedMemory entry: numaNode plus a limits table
    reserved_memory: list[dict[str, Any]] | UnsetType = UNSET
    # "explicit": memory-only NUMA nodes (GPU memory, CXL) only where a request names them
    memory_only_nodes: Literal["explicit", "ordinary"] | UnsetType = UNSET


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
    # 0 (off), else at least a tenth of a second (a scan reads every task) and at most a day
    # (inf would overflow the timer's wait)
    intruder_scan_seconds: Annotated[float, msgspec.Meta(ge=0, le=86_400)] | UnsetType = UNSET

    def given(self) -> dict[str, Any]:
        fields = super().given()
        if 0 < fields.get("intruder_scan_seconds", 0) < MIN_SCAN_SECONDS:
            raise ConfigError(f"observe.intruder_scan_seconds: {fields['intruder_scan_seconds']!r} is 0 (off) "
                              f"or at least {MIN_SCAN_SECONDS}")
        return fields


MIN_SCAN_SECONDS = 0.1


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


class NriSection(_Section, frozen=True):
    nri_enabled: bool | UnsetType = msgspec.field(default=UNSET, name="enabled")
    nri_socket: str | UnsetType = msgspec.field(default=UNSET, name="socket")
    # Shown by the runtime beside the index ("10-numa-agent"): a name, not a path.
    nri_plugin_name: str | UnsetType = msgspec.field(default=UNSET, name="plugin_name")
    # Exactly two digits, as NRI orders its plugins: text ("05"), where a number would lose a zero.
    nri_plugin_index: str | int | UnsetType = msgspec.field(default=UNSET, name="plugin_index")

    def given(self) -> dict[str, Any]:
        fields = super().given()
        for key, check in (("nri_socket", _absolute), ("nri_plugin_name", _plugin_name),
                           ("nri_plugin_index", _plugin_index)):
            if key in fields:
                name = key.removeprefix("nri_")
                try:
                    check(fields[key])
                except ValueError as exc:
                    raise ConfigError(f"nri.{name}: {exc}") from None
        return fields


class QuotaEntry(_Section, frozen=True):
    """One [quotas] entry: `default`, `users.<name>` or `groups.<name>`."""

    cpus: Count | UnsetType = UNSET
    memory: Size | UnsetType = UNSET
    devices: dict[str, Any] | UnsetType = UNSET  # device resource -> count


class QuotasSection(_Section, frozen=True):
    default: dict[str, Any] | UnsetType = UNSET  # a QuotaEntry, converted with its key
    users: dict[str, Any] = {}  # user name -> QuotaEntry
    groups: dict[str, Any] = {}  # group name -> QuotaEntry


class ConfigFile(_Section, frozen=True):
    agent: AgentSection = AgentSection()
    kubelet: KubeletSection = KubeletSection()
    observe: ObserveSection = ObserveSection()
    cpu_manager: CpuManagerSection = CpuManagerSection()
    memory_manager: MemoryManagerSection = MemoryManagerSection()
    topology_manager: TopologyManagerSection = TopologyManagerSection()
    isolation: IsolationSection = IsolationSection()
    nri: NriSection = NriSection()
    devices: dict[str, Any] = {}  # resource name -> DeviceSelectorSection
    quotas: QuotasSection = QuotasSection()


# ---- loading -----------------------------------------------------------------
def load_config(path: str | Path | None, *, required: bool = False) -> AgentConfig:
    """Read `path` (default file when None). A missing default file means
    defaults; a missing file that was asked for is an error."""
    file = Path(path or DEFAULT_CONFIG)
    raw = read_config_bytes(file, required=required)
    if raw is None:
        return AgentConfig()
    return config_from_bytes(raw, file)


# A configuration file is a few kilobytes; anything near this is not one (a log, an
# image, /dev/zero), and reading it whole would only spend the agent's memory.
MAX_CONFIG_BYTES = 1 << 20


def read_config_bytes(file: Path, *, required: bool = False) -> bytes | None:
    """The file's bytes, or None when it is missing and was not asked for.
    Only a regular file is read (a symlink to one is fine, as /etc often has),
    and at most MAX_CONFIG_BYTES of it: a device (but /dev/null, read as empty), FIFO or socket is refused
    without blocking on it (O_NONBLOCK), and an endless file is never read whole."""
    import stat

    try:
        fd = os.open(file, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except FileNotFoundError:
        if required:
            raise ConfigError(f"config file {file} does not exist") from None
        return None
    except OSError as exc:
        raise ConfigError(f"cannot read config file {file}: {exc.strerror}") from None
    try:
        st = os.fstat(fd)
        if stat.S_ISCHR(st.st_mode) and (os.major(st.st_rdev), os.minor(st.st_rdev)) == (1, 3):
            return b""  # /dev/null, the usual way to say "no file, the defaults"
        if not stat.S_ISREG(st.st_mode):
            raise ConfigError(f"config file {file} is {_file_kind(st.st_mode)}, not a regular file")
        if st.st_size > MAX_CONFIG_BYTES:
            raise ConfigError(f"config file {file} is {format_bytes(st.st_size)}, larger than the "
                              f"{format_bytes(MAX_CONFIG_BYTES)} a configuration may be")
        chunks, left = [], MAX_CONFIG_BYTES + 1  # the size may change between fstat and read
        while left > 0 and (chunk := os.read(fd, min(left, 1 << 16))):
            chunks.append(chunk)
            left -= len(chunk)
    except OSError as exc:
        raise ConfigError(f"cannot read config file {file}: {exc.strerror}") from None
    finally:
        os.close(fd)
    if left <= 0:
        raise ConfigError(f"config file {file} is larger than the {format_bytes(MAX_CONFIG_BYTES)} "
                          "a configuration may be")
    return b"".join(chunks)


def _file_kind(mode: int) -> str:
    import stat

    for test, kind in ((stat.S_ISDIR, "a directory"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return kind
    return "of another kind"


def config_from_bytes(raw: bytes, file: Path) -> AgentConfig:
    """The configuration a file's bytes hold; ConfigError naming `file` and the key."""
    try:
        doc = tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{file}: not UTF-8 text (byte {exc.start}); TOML files are UTF-8") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{file}: not valid TOML: {exc}") from None
    except RecursionError:  # tomllib recurses per level of nesting
        raise ConfigError(f"{file}: not valid TOML: arrays or tables nested too deeply") from None
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
                       **_kubelet_fields(parsed.kubelet), **parsed.nri.given(),
                       quotas=_quotas(parsed.quotas, set(parsed.devices)),
                       policy=_policy(parsed))


def _kubelet_fields(kubelet: KubeletSection) -> dict[str, Any]:
    fields = kubelet.given()
    for key, value in fields.items():
        try:
            agent_value(key, value)
        except ValueError as exc:
            name = kubelet.__struct_encode_fields__[kubelet.__struct_fields__.index(key)]
            raise ConfigError(f"kubelet.{name}: {exc}") from None
    return fields


def _quotas(section: QuotasSection, device_resources: set[str]) -> Quotas:
    """[quotas], each entry converted under its own key so that an error names it.
    Whether the users and groups named exist is asked at start (service/caller.py)."""
    def entries(kind: str, table: dict[str, Any]) -> dict[str, Limits]:
        return {name: _quota_entry(entry, f"quotas.{kind}.{name}", device_resources) for name, entry in table.items()}

    default = None if section.default is UNSET else _quota_entry(section.default, "quotas.default",
                                                                   device_resources)
    return Quotas(default=default, users=entries("users", section.users), groups=entries("groups", section.groups))


def _quota_entry(table: Any, where: str, device_resources: set[str]) -> Limits:
    entry = _convert(table, QuotaEntry, where)
    memory = None
    if entry.memory is not UNSET:
        try:
            memory = parse_size(entry.memory)
        except ValueError as exc:
            raise ConfigError(f"{where}.memory: {exc}") from None
    devices = {}
    for resource, count in ({} if entry.devices is UNSET else entry.devices).items():
        if resource not in device_resources:
            known = ", ".join(sorted(device_resources)) or "none configured"
            raise ConfigError(f"{where}.devices.{resource}: no such device resource in [devices] (known: {known})")
        devices[resource] = _convert(count, Count, f"{where}.devices.{resource}")
    return Limits(cpus=None if entry.cpus is UNSET else entry.cpus, memory_bytes=memory, devices=devices)


def _agent_fields(agent: AgentSection) -> dict[str, Any]:
    fields = agent.given()
    for key, value in fields.items():
        try:
            fields[key] = agent_value(key, value)
        except ValueError as exc:
            raise ConfigError(f"agent.{key}: {exc}") from None
    return fields


def agent_value(key: str, value: Any) -> Any:
    """An [agent] value (or the `serve` flag that overrides it) as AgentConfig
    holds it; ValueError saying what is wrong, for the caller to name the key."""
    check = _AGENT_CHECKS.get(key)
    return value if check is None else check(value)


def _metrics_address(address: str) -> str | None:
    if address:
        check_address_form(address)
    return address or None


def _cgroup_root(root: str) -> str:
    if root not in ("auto", "none") and not root.startswith("/"):
        # a relative directory here is a misspelt keyword, not a cgroup found from the cwd
        raise ValueError(f"{root!r} is not auto, none or an absolute directory")
    return root


def _socket_mode(value: str | int) -> int:
    try:
        mode = int(value, 8) if isinstance(value, str) else value
    except ValueError:
        raise ValueError(f"{value!r} is not an octal mode like \"0660\"") from None
    if not 0 <= mode <= 0o777:
        raise ValueError(f"{value!r} is not a file mode")
    return mode


def _log_level(level: str) -> str:
    check_level(level)
    return level  # as written: logging_setup reads any case


def _not_empty(value: str) -> str:
    if not value.strip():
        raise ValueError("must not be empty")
    return _no_nul(value)


_PLUGIN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")


def _plugin_name(value: str) -> str:
    if not _PLUGIN_NAME.fullmatch(value):
        raise ValueError(f"{value!r} is not a plugin name: 1 to 63 letters, digits, '.', '_' or '-', "
                         "starting with a letter or digit")
    return value


def _plugin_index(value: str | int) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{value!r} is a number; write the index as two digits in quotes, e.g. \"{value:02d}\""
                         if isinstance(value, int) and 0 <= value <= 99 else f"{value!r} is not two digits in quotes")
    if len(value) != 2 or not value.isascii() or not value.isdigit():
        raise ValueError(f"{value!r} is not two digits (\"00\" to \"99\"): NRI orders its plugins by them")
    return value


def _absolute(value: str) -> str:
    if not value.startswith("/"):
        raise ValueError(f"{value!r} is not an absolute path")
    return _no_nul(value)


def _no_nul(value: str) -> str:
    if "\0" in value:
        raise ValueError(f"{value!r} holds a NUL character")
    return value


_AGENT_CHECKS: dict[str, Callable[[Any], Any]] = {
    "socket_mode": _socket_mode,
    "metrics_address": _metrics_address,
    "cgroup_root": _cgroup_root,
    "log_level": _log_level,
    "sysfs_root": _not_empty,
    "state_dir": _not_empty,
    "socket": _not_empty,
    "socket_group": _not_empty,
    "pod_resources_socket": _no_nul,  # "" turns these off
    "kubelet_state_dir": _no_nul,
}


def check_endpoints_apart(cfg: AgentConfig) -> None:
    """ConfigError when two of the agent's sockets would be placed at one path (the
    second would take the first for another agent's)."""
    paths = {"agent.socket (--socket)": cfg.socket,
             "kubelet.pod_resources_socket (--pod-resources-socket)": cfg.pod_resources_path(),
             "agent.metrics_address (--metrics-address)": socket_path_of(cfg.metrics_address or "")}
    seen: dict[str, str] = {}
    for key, path in paths.items():
        if path is None:
            continue
        where = os.path.abspath(path)
        if where in seen:
            raise ConfigError(f"{seen[where]} and {key} are the same path {path}: each needs its own")
        seen[where] = key


# ---- what a reload changed ------------------------------------------------------
def _key_names() -> dict[str, str]:
    """AgentConfig field (PolicyConfig's as "policy.<field>") -> the TOML key that sets it."""
    names = {"quotas": "quotas", "policy.devices": "devices"}
    for section in msgspec.structs.fields(ConfigFile):
        if isinstance(section.default, _Section) and section.name != "quotas":  # quotas: one whole
            prefix = "policy." if section.name.endswith("_manager") else ""
            for f in msgspec.structs.fields(type(section.default)):
                names[prefix + f.name] = f"{section.encode_name}.{f.encode_name}"
    return names


def changed_keys(old: AgentConfig, new: AgentConfig) -> list[tuple[str, str]]:
    """(field, TOML key) of each setting `new` holds otherwise than `old`, in the
    file's order; a field is an AgentConfig field or "policy.<PolicyConfig field>"."""
    changed = []
    for path, key in _key_names().items():
        field_name = path.removeprefix("policy.")
        if path.startswith("policy."):
            before, after = getattr(old.policy, field_name), getattr(new.policy, field_name)
        else:
            before, after = getattr(old, field_name), getattr(new, field_name)
        if before != after:
            changed.append((path, key))
    return sorted(changed, key=lambda pair: _KEY_ORDER.get(pair[1].partition(".")[0], len(_KEY_ORDER)))


_KEY_ORDER = {f.encode_name: i for i, f in enumerate(msgspec.structs.fields(ConfigFile))}


def _policy(parsed: ConfigFile) -> PolicyConfig:
    fields = {**parsed.cpu_manager.given(), **parsed.memory_manager.given(),
              **parsed.topology_manager.given()}
    for key in ("topology_policy", "topology_scope"):
        if key in fields:
            fields[key] = str(fields[key])
    for key in ("cpu_policy", "memory_policy"):
        if key in fields:
            fields[key] = fields[key].lower()
    # Option names and values are checked here, so that a misspelt one is a configuration
    # error; what depends on the machine is checked when the machine is built.
    for key, where, options in (("cpu_options", "cpu_manager.options", CpuManagerOptions),
                                ("topology_options", "topology_manager.options", TopologyManagerOptions)):
        if key in fields:
            fields[key] = _options(fields[key], where)
            try:
                options.from_mapping(fields[key])
            except ValueError as exc:
                raise ConfigError(f"{where}: {exc}") from None
    if "reserved_memory" in fields:
        fields["reserved_memory"] = _reserved_memory(fields["reserved_memory"])
    if "reserved_cpus" in fields:
        try:
            listed = len(CpuSet.parse(fields["reserved_cpus"]))
        except CpuSetParseError as exc:
            raise ConfigError(f"cpu_manager.reserved_cpus: {fields['reserved_cpus']!r}: {exc}") from None
        if "reserved_cpu_count" in fields:
            # Two answers to one question; which one was meant cannot be guessed.
            raise ConfigError("cpu_manager.reserved_cpus and cpu_manager.reserved_cpu_count: give one "
                              "of them (the list sets the count, as the kubelet's reservedSystemCPUs)")
        # As the kubelet's reservedSystemCPUs: the list alone sets how many are reserved.
        fields["reserved_cpu_count"] = listed
    if parsed.devices:
        fields["devices"] = {name: _device(name, sel) for name, sel in parsed.devices.items()}
    return PolicyConfig(**fields)


def _device(name: str, table: Any) -> dict[str, Any]:
    """A [devices.<name>] table's given fields, its name and ids checked here (a typo
    would otherwise select nothing, or be reported as not fitting the machine)."""
    fields = _convert(table, DeviceSelectorSection, f"devices.{name}").given()
    try:
        DeviceResource(name, device_selector(fields))
    except ValueError as exc:
        raise ConfigError(f"devices.{name}: {exc}") from None
    return fields


def _options(options: Options, where: str) -> dict[str, str]:
    """Option values as the text the managers parse (true/false, numbers)."""
    out = {}
    for name, value in options.items():
        value = _convert(value, OptionValue, f"{where}.{name}")
        out[name] = ("true" if value else "false") if isinstance(value, bool) else str(value)
    return out


def _reserved_memory(entries: list[dict[str, Any]]) -> dict[int, dict[str, int]]:
    """Per node, per resource, bytes. An entry is this file's form (numa_node = 0,
    memory = "1Gi", "hugepages-2Mi" = "1Gi") or the kubelet's reservedMemory entry
    (numaNode = 0, limits = { memory = "1Gi" }); resources are named as the kubelet
    names them (hugepages-2Mi, hugepages-1Gi) or as the kernel does (hugepages-2048kB)."""
    out: dict[int, dict[str, int]] = {}
    for i, entry in enumerate(entries):
        where = f"memory_manager.reserved_memory[{i}]"
        node_keys = [k for k in ("numa_node", "numaNode") if k in entry]
        if len(node_keys) != 1:
            raise ConfigError(f"{where}: needs exactly one of numa_node (or the kubelet's numaNode) "
                              "and at least one resource")
        node = _convert(entry[node_keys[0]], NodeId, f"{where}.{node_keys[0]}")
        amounts = {k: v for k, v in entry.items() if k != node_keys[0]}
        if "limits" in amounts:
            if len(amounts) > 1:
                raise ConfigError(f"{where}: resources go either in limits (the kubelet's form) or "
                                  f"beside {node_keys[0]}, not both (found {', '.join(sorted(amounts))})")
            where = f"{where}.limits"
            amounts = _convert(amounts["limits"], dict[str, Any], where)
        for key, amount in amounts.items():
            resource = _memory_resource(key, f"{where}.{key}")
            size = _convert(amount, Size, f"{where}.{key}")
            try:
                value = parse_size(size)
            except ValueError as exc:
                raise ConfigError(f"{where}.{key}: {exc}") from None
            if resource in out.get(node, {}):
                raise ConfigError(f"{where}.{key}: {resource} of NUMA node {node} is reserved twice")
            out.setdefault(node, {})[resource] = value
    return out


def _memory_resource(key: str, where: str) -> str:
    """The memory manager's name for a reserved resource key."""
    if key == MEMORY:
        return MEMORY
    if key.startswith("hugepages-"):
        try:
            return hugepages_resource(parse_hugepage_size(key[len("hugepages-"):]))
        except ValueError as exc:
            raise ConfigError(f"{where}: {exc}") from None
    raise ConfigError(f"{where}: unknown resource {key!r} (use memory or hugepages-<page size>, "
                      "e.g. hugepages-2Mi, hugepages-1Gi or the kernel's hugepages-2048kB)")


# ---- msgspec's errors, in the file's terms ---------------------------------------
# Each section's keys, for "did you mean": a key put in the wrong section is found in its own.
_SECTION_KEYS = {f.encode_name: sorted(g.encode_name for g in msgspec.structs.fields(type(f.default)))
                 for f in msgspec.structs.fields(ConfigFile) if isinstance(f.default, _Section)}
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
        guess = _did_you_mean(unknown["key"], path, known, inner if root is ConfigFile and not where else None)
        return f"unknown key {key}" + (f": did you mean {guess}?" if guess else "") + \
            (f" (known: {', '.join(known)})" if known else "")
    bad = _BAD_ENUM.match(what)
    if bad:
        choices = _choices_at(root, inner)
        return f"{path}: {bad['value']} is not one of {', '.join(choices)}" if choices \
            else f"{path}: invalid value {bad['value']}"
    for word, toml in _TOML_WORDS.items():
        what = what.replace(word, toml)
    what = what[:1].lower() + what[1:]
    return f"{path}: {what}" if path else what


def _did_you_mean(key: str, path: str, known: list[str], section: str | None) -> str:
    """The key meant by `key`, unknown at `path`, in full: the same name in the section it
    belongs to, else the closest spelling at `path`, else elsewhere in the file; "" if none
    is close. `section` is the section (or "" the top) `key` stands in; None below that,
    where only the keys at `path` are looked at."""
    import difflib

    close = difflib.get_close_matches(key, known, n=1, cutoff=0.75)
    if section is None or "." in section or "[" in section:
        return ".".join(p for p in (path, *close[:1]) if p) if close else ""
    elsewhere = {f"{name}.{k}": k for name, keys in _SECTION_KEYS.items() if name != section for k in keys}
    same = sorted(full for full, k in elsewhere.items() if k == key)
    if same:
        return " or ".join(same)
    if close:
        return ".".join(p for p in (path, close[0]) if p)
    nearest = difflib.get_close_matches(key, sorted(set(elsewhere.values())), n=1, cutoff=0.75)
    return " or ".join(sorted(full for full, k in elsewhere.items() if nearest and k == nearest[0]))


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
