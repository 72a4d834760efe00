"""A container's `numa-agent.io/` annotations -> the admission request (pure).

The values are numa-run's syntax, read by the parsers numa-run uses
(core.request_syntax, core.units, core.policy): `numa-agent.io/memory: 16Gi`
means what `numa-run --memory 16Gi` means. Any error names the annotation,
its value and the expected syntax, because it is all a container's author sees.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from numa_agent.core import request_syntax, units
from numa_agent.core.cpuset import EMPTY
from numa_agent.core.listforms import parse_list_form, resolve
from numa_agent.core.names import NAME_MAX, NAME_RULE, SANDBOX_POD_PREFIX, is_workload_name, sandbox_pod_name
from numa_agent.core.policy import POLICY_NAMES, STRATEGY_NAMES

PREFIX = "numa-agent.io/"
HUGEPAGES = "hugepages-"
_SHOWN_VALUE_CHARS = 80
_SHOWN_KEY_CHARS = 120
HEX64 = re.compile(r"[0-9a-f]{64}")
MAX_VALUE_CHARS = 256  # no value of ours is longer; the parsers' messages repeat what they read

# sbx-, 12 hex digits, '-': what the sandbox adds to the pod annotation's name.
POD_NAME_MAX = NAME_MAX - len(SANDBOX_POD_PREFIX) - 13

# annotation (after the prefix) -> the syntax of its value, for error messages and the docs.
SYNTAX: dict[str, str] = {
    "cpus": "N, a whole number of exclusive CPUs (whole cores first; 0: the shared pool), e.g. 4",
    "memory": "SIZE, e.g. 16Gi or 512Mi (binary), 512M (decimal: 1000s), or plain bytes",
    "hugepages-<size>": "COUNT pages of the size the name gives, e.g. numa-agent.io/hugepages-2Mi: 512 "
                        "(sizes as numa-run --hugepages: 2Mi, 1Gi, the kernel's 2048kB)",
    "devices": "RESOURCE=COUNT[,RESOURCE=COUNT...], e.g. gpu=1 or gpu=2,nic=1 (a bare RESOURCE means 1)",
    "membind": "NODES, NUMA node ids as numa-run -m takes them, e.g. 0,250 or 0-1 (numactl's all, + and ! "
               "are not taken here); the only way to book a memory-only node",
    "policy": "one of " + ", ".join(POLICY_NAMES),
    "numa-allocation-strategy": "one of " + ", ".join(STRATEGY_NAMES)
                                + " (how equally good NUMA nodes are chosen: spread, pack, or the lowest)",
    "pod": f"a pod name ({NAME_RULE}; at most {POD_NAME_MAX}): a pod of the container's own sandbox",
}
KNOWN = tuple(PREFIX + key for key in SYNTAX)
POD = PREFIX + "pod"
# Where the engine itself says which sandbox (pod) a container belongs to: CRI-O's
# (podman writes it too for a container of a pod), containerd's CRI. Written by the
# engine, not by the container's author: the one identity a pod membership is taken from.
# Both present and different (an engine that passes a pod's own annotations through can
# carry the other engine's key, set by the tenant): refused, neither is trusted.
SANDBOX_KEYS = ("io.kubernetes.cri-o.SandboxID", "io.kubernetes.cri.sandbox-id")


class AnnotationError(ValueError):
    """One bad annotation: which, its value, what is wrong and what is expected."""

    def __init__(self, key: str, value: object, problem: str, expected: str) -> None:
        shown = value if isinstance(value, str) else repr(value)
        if len(shown) > _SHOWN_VALUE_CHARS:
            shown = shown[:_SHOWN_VALUE_CHARS] + "..."
        # The key is the container author's too: escaped and cut like the value, so that
        # the engine's log gets one printable line (no forged line, no terminal escape).
        super().__init__(f"annotation {_printable(key)}={shown!r}: {problem} (syntax: {expected})")
        self.key = key


def _printable(key: str) -> str:
    shown = key if key.isprintable() else repr(key)[1:-1]
    return shown if len(shown) <= _SHOWN_KEY_CHARS else shown[:_SHOWN_KEY_CHARS] + "..."


def ours(annotations: Mapping[str, Any] | None) -> dict[str, Any]:
    """The annotations addressed to numa-agent (empty: the container is not ours)."""
    return {k: v for k, v in (annotations or {}).items() if isinstance(k, str) and k.startswith(PREFIX)}


def sandbox_pod(annotations: Mapping[str, Any], pod: str, digest: Callable[[str], str]) -> str:
    """The agent's name of the pod `pod` (the `numa-agent.io/pod` annotation) within the
    sandbox the engine's own annotation names (`SANDBOX_KEYS`): `sbx-<sandbox id12>-<pod>`,
    so that a container cannot join another sandbox's pod, whatever it names.
    AnnotationError when the engine names no sandbox. `digest`: a sandbox id's hex digest
    when it is not 64 hex digits itself (as for a container id)."""
    named = {v for k in SANDBOX_KEYS if isinstance(v := annotations.get(k), str) and v}
    if len(named) > 1:  # one is not the engine's: an annotation passed through from the pod
        raise AnnotationError(POD, pod, f"the container's annotations name two different sandboxes "
                              f"({' and '.join(SANDBOX_KEYS)}); the pod is not joined when its "
                              "sandbox is in doubt", SYNTAX["pod"])
    sandbox = next(iter(named), None)
    if sandbox is None:
        raise AnnotationError(POD, pod, "the container's engine names no sandbox (pod) it belongs to "
                              f"({' or '.join(SANDBOX_KEYS)}); a container joins only its own sandbox's pod",
                              SYNTAX["pod"])
    if len(pod) > POD_NAME_MAX:
        raise AnnotationError(POD, pod, f"longer than {POD_NAME_MAX} characters", SYNTAX["pod"])
    hex_id = sandbox if HEX64.fullmatch(sandbox) else digest(sandbox)
    return sandbox_pod_name(hex_id[:12], pod)


def admission_body(annotations: Mapping[str, Any]) -> dict[str, Any]:
    """The POST /v1/workloads body the annotations ask for (AnnotationError if one is bad).
    Annotations without the prefix are ignored."""
    body: dict[str, Any] = {"cpus": 0, "memory_bytes": 0, "hugepages": {}, "devices": {}}
    for key, value in sorted(ours(annotations).items()):
        name = key[len(PREFIX):]
        syntax_key = "hugepages-<size>" if name.startswith(HUGEPAGES) else name
        if syntax_key not in SYNTAX:
            raise AnnotationError(key, value, "unknown numa-agent annotation",
                                  "one of " + ", ".join(KNOWN))
        expected = SYNTAX[syntax_key]
        if not isinstance(value, str):
            raise AnnotationError(key, value, "not a string", expected)
        if len(value) > MAX_VALUE_CHARS:
            raise AnnotationError(key, value, f"longer than {MAX_VALUE_CHARS} characters", expected)
        try:
            _apply(body, name, value.strip())
        except ValueError as exc:
            raise AnnotationError(key, value, str(exc), expected) from None
    body["shared"] = body["cpus"] == 0  # what numa-run does without --cpus
    return body


# annotation -> (body field, the names it takes, what it is)
_CHOICES: dict[str, tuple[str, tuple[str, ...], str]] = {
    "policy": ("policy", POLICY_NAMES, "topology manager policy"),
    "numa-allocation-strategy": ("numa_allocation_strategy", STRATEGY_NAMES, "numa-allocation-strategy"),
}


def _apply(body: dict[str, Any], name: str, value: str) -> None:
    if name == "cpus":
        body["cpus"] = request_syntax.parse_count(value, "CPU count")
    elif name == "memory":
        body["memory_bytes"] = units.parse_size(value)
    elif name.startswith(HUGEPAGES):
        size_kb, count = request_syntax.parse_hugepages_item(f"{name[len(HUGEPAGES):]}={value}")
        if size_kb in body["hugepages"]:  # hugepages-2Mi and hugepages-2048kB
            raise ValueError(f"hugepages of {units.page_size_text(int(size_kb))} given twice")
        body["hugepages"][size_kb] = count
    elif name == "devices":
        for item in value.split(","):
            resource, count = request_syntax.parse_device_item(item)
            if resource in body["devices"]:
                raise ValueError(f"device {resource} given twice")
            body["devices"][resource] = count
    elif name == "membind":
        form = parse_list_form(value, what="NUMA node", highest=1023)
        if form.needs_context:  # the hook knows the machine no better than the container's author
            raise ValueError("name the nodes by number")
        body["membind"] = list(resolve(form, machine=EMPTY, allowed=EMPTY, what="NUMA node").ids())
    elif name in _CHOICES:
        field, names, what = _CHOICES[name]
        if value not in names:
            raise ValueError(f"unknown {what} {value!r}")
        body[field] = value
    elif name == "pod":
        if not is_workload_name(value):
            raise ValueError(f"invalid pod name {value!r}")
        body["pod"] = value
