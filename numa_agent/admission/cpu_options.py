"""The CPU manager's options (the kubelet's static policy options), parsed
and checked. Shared by the CPU manager and the CPU picking algorithms."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Mapping

from numa_agent.admission.cpu_topology import CpuTopology


class CpuPolicyConfigError(ValueError):
    """CPU manager options that are unknown, malformed or incompatible."""


# option name -> field name
_OPTION_FIELDS = {
    "full-pcpus-only": "full_pcpus_only",
    "distribute-cpus-across-numa": "distribute_cpus_across_numa",
    "align-by-socket": "align_by_socket",
    "distribute-cpus-across-cores": "distribute_cpus_across_cores",
    "strict-cpu-reservation": "strict_cpu_reservation",
    "prefer-align-cpus-by-uncorecache": "prefer_align_cpus_by_uncorecache",
}
_FIELD_OPTIONS = {v: k for k, v in _OPTION_FIELDS.items()}

# Pairs the kubelet refuses to combine, in the order it checks them.
_INCOMPATIBLE = (
    ("full_pcpus_only", "distribute_cpus_across_cores"),
    ("distribute_cpus_across_numa", "distribute_cpus_across_cores"),
    ("prefer_align_cpus_by_uncorecache", "distribute_cpus_across_cores"),
    ("prefer_align_cpus_by_uncorecache", "distribute_cpus_across_numa"),
)

# Go's strconv.ParseBool spellings, which is what the kubelet accepts.
_TRUE = {"1", "t", "T", "TRUE", "true", "True"}
_FALSE = {"0", "f", "F", "FALSE", "false", "False"}


def _parse_bool(name: str, value: object) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise CpuPolicyConfigError(f"bad value for CPU manager option {name!r}: {value!r} (want true or false)")


@dataclass(frozen=True, slots=True)
class CpuManagerOptions:
    full_pcpus_only: bool = False
    distribute_cpus_across_numa: bool = False
    align_by_socket: bool = False
    distribute_cpus_across_cores: bool = False
    strict_cpu_reservation: bool = False
    prefer_align_cpus_by_uncorecache: bool = False

    @classmethod
    def from_mapping(cls, mapping: Mapping[str, object] | None) -> "CpuManagerOptions":
        """From the kubelet's option names ({"full-pcpus-only": "true", ...});
        unknown names, non-boolean values and incompatible pairs are refused."""
        values: dict[str, bool] = {}
        mapping = mapping or {}
        for name in sorted(mapping):
            field = _OPTION_FIELDS.get(name)
            if field is None:
                known = ", ".join(sorted(_OPTION_FIELDS))
                raise CpuPolicyConfigError(f"unknown CPU manager option {name!r} (known: {known})")
            values[field] = _parse_bool(name, mapping[name])
        options = cls(**values)
        options.check_combinations()
        return options

    def to_mapping(self) -> dict[str, str]:
        return {_FIELD_OPTIONS[f.name]: "true" for f in fields(self) if getattr(self, f.name)}

    def check_combinations(self) -> None:
        for a, b in _INCOMPATIBLE:
            if getattr(self, a) and getattr(self, b):
                raise CpuPolicyConfigError(
                    f"CPU manager options {_FIELD_OPTIONS[a]} and {_FIELD_OPTIONS[b]} "
                    "cannot be used at the same time"
                )

    def validate(self, topo: CpuTopology, topology_policy: str | None = None) -> None:
        """Refuse combinations the kubelet refuses, on this machine and under
        this topology manager policy (when given)."""
        self.check_combinations()
        if self.align_by_socket:
            if topology_policy == "single-numa-node":
                raise CpuPolicyConfigError(
                    "CPU manager option align-by-socket cannot be used with the topology "
                    "manager policy single-numa-node"
                )
            if topo.num_sockets > topo.num_numa_nodes:
                raise CpuPolicyConfigError(
                    "CPU manager option align-by-socket needs sockets at least as large as NUMA "
                    f"nodes; this machine has {topo.num_sockets} sockets and "
                    f"{topo.num_numa_nodes} NUMA nodes"
                )
