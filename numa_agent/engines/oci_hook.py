"""The OCI hook a container engine (podman, CRI-O) runs: `numa-agent oci-hook STAGE`.

The engine writes the container's OCI state (id, pid, bundle, annotations) on
stdin. A container without a `numa-agent.io/` annotation is left alone: the hook
reads its state and exits 0 without connecting to the agent. For an annotated one:

- createRuntime (or prestart): ask the agent to admit a workload named after the
  container, enforced on the container's own cgroup (the `0::` line of
  /proc/PID/cgroup). A refusal, a bad annotation or an unreachable agent exits 1,
  which makes the engine fail the container: annotated containers fail closed.
  The request id is derived from the container id, so a retried hook gets the
  booking already made instead of a second one. A `numa-agent.io/pod` names a pod
  of the container's own sandbox only (the engine's sandbox id annotation):
  `sbx-<sandbox id12>-<pod>`, never another sandbox's pod.
- poststop: release that workload if this container's request id made it (already
  gone, or another container's of the same 12-digit name: fine). The agent also
  releases it when the cgroup empties, since an engine that dies skips poststop.

The pure part (state, names, cgroup line) is apart from `run`, the edge.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from numa_agent.api.client import AgentUnreachable, ClientError, request
from numa_agent.enforcement.processes import parse_cgroup
from numa_agent.engines.annotations import HEX64, AnnotationError, admission_body, ours, sandbox_pod

PROG = "numa-agent"
MAX_STATE_BYTES = 1 << 20
CREATE_STAGES = ("createRuntime", "prestart")  # before the container's process runs
RELEASE_STAGES = ("poststop",)
STAGES = CREATE_STAGES + RELEASE_STAGES
EXIT_OK = 0
EXIT_FAILED = 1
# How long an annotated container waits for an agent that is restarting before it
# fails closed; the hook definition's timeout must stay well above it.
RETRY_SECONDS = 10.0
RETRY_ENV = "NUMA_AGENT_RETRY_SECONDS"
ANSWER_TIMEOUT = 90.0  # one admission under load (20 containers at once in an emulated guest)


class HookError(Exception):
    """What to print (one line, already prefixed) and exit 1 for."""


@dataclass(frozen=True)
class ContainerState:
    """The fields of the OCI state the hook uses."""

    id: str
    status: str = ""
    pid: int | None = None
    bundle: str = ""
    annotations: dict[str, Any] = field(default_factory=dict)

    @property
    def short_id(self) -> str:
        return self.id[:12] if HEX64.fullmatch(self.id) else _digest(self.id)[:12]

    @property
    def workload_name(self) -> str:
        """`ctr-` and the id's first 12 hex digits (what `podman ps` shows)."""
        return f"ctr-{self.short_id}"

    @property
    def request_id(self) -> str:
        """The container id itself when it is 64 lower-case hex (the agent's request id
        form), else its sha256: the same container always asks with the same id."""
        return self.id if HEX64.fullmatch(self.id) else _digest(self.id)


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def parse_state(raw: bytes) -> ContainerState:
    """The OCI state from the engine's bytes; HookError saying what is wrong."""
    if len(raw) > MAX_STATE_BYTES:
        raise HookError(f"{PROG}: oci-hook: the OCI state on stdin is over {MAX_STATE_BYTES} bytes; "
                        "is this run by a container engine?")
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:  # (nested past the parser's limit)
        raise HookError(f"{PROG}: oci-hook: stdin is not an OCI state (JSON object with id, pid, "
                        f"annotations): {str(exc)[:200]}") from None
    if not isinstance(doc, dict):
        raise HookError(f"{PROG}: oci-hook: stdin is not an OCI state: a JSON {type(doc).__name__}, "
                        "expected an object with id, pid, annotations")
    cid = doc.get("id")
    if not isinstance(cid, str) or not cid or len(cid) > 1024:
        raise HookError(f"{PROG}: oci-hook: the OCI state has no container id (\"id\": {cid!r})")
    annotations = doc.get("annotations")
    if annotations is None:
        annotations = {}
    if not isinstance(annotations, dict):
        raise HookError(f"{PROG}: oci-hook: the OCI state's \"annotations\" is not an object")
    pid = doc.get("pid")
    if pid is not None and (not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0):
        raise HookError(f"{PROG}: oci-hook: the OCI state's \"pid\" is {pid!r}, not a process id")
    status, bundle = doc.get("status"), doc.get("bundle")
    return ContainerState(id=cid, status=status if isinstance(status, str) else "",
                          pid=pid, bundle=bundle if isinstance(bundle, str) else "",
                          annotations=annotations)


def cgroup_from_proc(text: str) -> str | None:
    """The cgroup v2 path in /proc/PID/cgroup's text (its `0::` line), or None."""
    path = parse_cgroup(text)
    return path if path is not None and path.startswith("/") else None


def admission(state: ContainerState, cgroup: str) -> dict[str, Any]:
    """The POST /v1/workloads body for an annotated container (AnnotationError if one is bad)."""
    body = admission_body(state.annotations)
    if "pod" in body:  # never the pod the annotation names alone: that pod of the container's sandbox
        body["pod"] = sandbox_pod(state.annotations, body["pod"], _digest)
    body.update(name=state.workload_name, cgroup=cgroup, request_id=state.request_id)
    return body


# ------------------------------------------------------------------ the edge
Requester = Callable[..., tuple[int, dict]]


def run(stage: str, raw: bytes, socket_path: str, *, proc_root: str = "/proc", send: Requester = request,
        refusal_lines: Callable[[str, dict], list[str]] | None = None) -> tuple[int, list[str]]:
    """The hook: (exit status, lines for stderr). `refusal_lines` formats the agent's refusal
    (the CLI's, with the explanation); without it, its message alone."""
    try:
        state = parse_state(raw)
    except HookError as exc:
        return EXIT_FAILED, [str(exc)]
    if not ours(state.annotations):
        return EXIT_OK, []  # not ours: no connection, no cost
    retry = _retry_budget()
    if stage in RELEASE_STAGES:
        return _release(state, socket_path, send, retry)
    try:
        body = admission(state, _container_cgroup(state, proc_root))
    except AnnotationError as exc:
        return EXIT_FAILED, [f"{PROG}: container {state.short_id} refused: {exc}"]
    except HookError as exc:
        return EXIT_FAILED, [str(exc)]
    try:
        status, answer = send(socket_path, "POST", "/v1/workloads", body, timeout=ANSWER_TIMEOUT,
                              busy_retry=retry)
    except ClientError as exc:
        return EXIT_FAILED, [_unreachable(exc, socket_path, state)]
    if status < 400:
        return EXIT_OK, []
    error = _error_of(answer)
    prefix = f"{PROG}: container {state.short_id} refused"
    if refusal_lines is not None:
        return EXIT_FAILED, refusal_lines(prefix, error)
    return EXIT_FAILED, [f"{prefix}: {error.get('message') or f'the agent answered HTTP {status}'}"]


def _container_cgroup(state: ContainerState, proc_root: str) -> str:
    if state.pid is None:
        raise HookError(f"{PROG}: oci-hook: container {state.short_id}: the OCI state has no pid; "
                        "run the hook at createRuntime or prestart, when the container's process exists")
    path = os.path.join(proc_root, str(state.pid), "cgroup")
    try:
        with open(path) as f:
            cgroup = cgroup_from_proc(f.read())
    except OSError as exc:
        raise HookError(f"{PROG}: container {state.short_id}: cannot read {path}: "
                        f"{exc.strerror or exc}") from None
    if cgroup is None:
        raise HookError(f"{PROG}: container {state.short_id}: {path} has no cgroup v2 (0::) line; "
                        "the agent needs the unified hierarchy")
    return cgroup


def _release(state: ContainerState, socket_path: str, send: Requester, retry: float) -> tuple[int, list[str]]:
    name = state.workload_name
    try:
        # By the whole id: two containers whose ids share the first 12 digits share the
        # name, and one's poststop must not release the other (404 for it: not ours).
        status, answer = send(socket_path, "DELETE", f"/v1/workloads/{name}?request_id={state.request_id}",
                              None, timeout=ANSWER_TIMEOUT, busy_retry=retry)
    except ClientError as exc:
        # The agent releases it itself when the cgroup empties, and reconciles on restart.
        return EXIT_FAILED, [f"{PROG}: cannot release {name} (container {state.short_id}): {exc}"]
    if status < 400 or status == 404:  # 404: released already (its cgroup emptied first)
        return EXIT_OK, []
    error = _error_of(answer)
    return EXIT_FAILED, [f"{PROG}: cannot release {name} (container {state.short_id}): "
                         f"{error.get('message') or f'the agent answered HTTP {status}'}"]


def _error_of(answer: dict) -> dict:
    error = answer.get("error")
    return error if isinstance(error, dict) else {}


def _unreachable(exc: ClientError, socket_path: str, state: ContainerState) -> str:
    reason = str(exc)
    if isinstance(exc, AgentUnreachable):  # "cannot reach the agent at X: REASON; is the agent running?..."
        reason = reason.removeprefix(f"cannot reach the agent at {socket_path}: ").split(";")[0]
    return (f"{PROG}: cannot reach the agent at {socket_path} ({reason}); container {state.short_id} "
            "is not started (annotated containers fail closed)")


def _retry_budget() -> float:
    raw = os.environ.get(RETRY_ENV, "").strip()
    try:
        return max(0.0, min(float(raw), 3600.0)) if raw else RETRY_SECONDS
    except ValueError:
        return RETRY_SECONDS
