"""Benchmark (a script, not a test): how long the runtime waits for numa-agent's
answer to a CreateContainer, next to decide() alone on the same machine and state.

Machines of 8 and 64 NUMA nodes hold 1,000 live containers: about half the
usable CPUs booked by exclusive 2-CPU containers, the rest BestEffort
containers on the shared pool, all of them known to the handler. Each probe
creates one container and stops it again (the stop untimed), so every probe
sees the same state. Probes:

- `exclusive`: a Guaranteed 2-CPU container. It is admitted, and the pool
  shrinks, so the answer carries an update for every shared container.
- `shared`: a BestEffort container: the pool's CPUs, no admission, no update.

Each is timed two ways:

- `handler`: `KubernetesHandler.create_container` called directly;
- `session`: through `PluginSession` and the fake runtime's socket (the
  request encoded, multiplexed, read by the session's thread, handed to its
  worker, answered and decoded at the runtime's end): what the runtime waits.
  It includes the fake runtime's own reading, in Python, of an answer that
  carries a thousand updates (about 90 kB in 23 frames); the plugin's side of
  that (serialize, ttrpc, mux) is about 0.2 ms of it, and containerd reads it
  in Go.

`decide` is `admission.admit.decide` alone for the same request on the same
machine and state. The AgentApi is tests/nri/fake_api.py's FakeApi: the real
admission core (decide, release) without the service's checkpoint, enforcement
and lock: what the plugin adds is measured apart from what any admission
costs the service (`benchmarks/service_scale_micro.py`). Prints p50 and p99 in
milliseconds and each path's p50 over decide's. Nothing here asserts a time.

Run: python benchmarks/nri_latency.py [--probes N] [--nodes 8 64] [--containers 1000]
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.stats import fmt, percentile, table  # noqa: E402
from numa_agent.admission.admit import decide  # noqa: E402
from numa_agent.admission.machine import Machine, PolicyConfig, build_machine  # noqa: E402
from numa_agent.core.caller import Caller  # noqa: E402
from numa_agent.nri import kubernetes as k8s  # noqa: E402
from numa_agent.nri import nri_api_pb2 as api  # noqa: E402
from numa_agent.nri import plugin  # noqa: E402
from numa_agent.nri.handler import KubernetesHandler  # noqa: E402
from numa_agent.service.requests import AdmitRequest, to_admission_request  # noqa: E402
from tests.nri.fake_api import FakeApi, container, create, resources, sandbox  # noqa: E402
from tests.nri.fake_runtime import FakeRuntime  # noqa: E402
from tests.support.synthetic import make_topology  # noqa: E402

GIB = 1 << 30
CORES_PER_NODE = {8: 8, 64: 4}  # 128 and 512 CPUs with 2 threads a core


def machine_of(nodes: int) -> Machine:
    topo = make_topology(sockets=max(1, nodes // 4), nodes_per_socket=min(nodes, 4),
                         cores_per_node=CORES_PER_NODE.get(nodes, 4), threads_per_core=2,
                         memory_per_node_bytes=64 << 30)
    return build_machine(topo, PolicyConfig(topology_policy="best-effort"))


def _id(kind: int, n: int) -> str:
    """64 hex whose first 12 differ for every (kind, n): the names (ctr-<12 hex>) differ."""
    return f"{kind:02x}{n:010x}" + "0" * 52


def filled(nodes: int, containers: int) -> tuple[FakeApi, KubernetesHandler, int]:
    """The fake API and a handler that know `containers` live containers; the
    number of exclusive ones among them."""
    fake = FakeApi(machine=machine_of(nodes))
    handler = KubernetesHandler(fake)
    exclusive = min(containers, len(fake.machine.usable_cpus) // 4)  # half the CPUs, 2 each
    pods = []
    for n in range(containers):
        pod = sandbox(n % 250) if n < exclusive else sandbox(n % 250, "besteffort")
        pod.id = _id(0x5A, n)
        res = resources(cpus=2, memory=GIB) if n < exclusive else resources()
        pods.append(pod)
        ctr = container(0, pod, res)
        ctr.id = _id(0xC0, n)
        handler.create_container(create(pod, ctr))
    fake.calls.clear()
    return fake, handler, exclusive


def probe(n: int, exclusive: bool) -> api.CreateContainerRequest:
    pod = sandbox(1) if exclusive else sandbox(1, "besteffort")
    pod.id = _id(0x5B, n)
    ctr = container(0, pod, resources(cpus=2, memory=GIB) if exclusive else resources())
    ctr.id = _id(0xC1, n)
    return create(pod, ctr)


def stop(handler: KubernetesHandler, request: api.CreateContainerRequest) -> None:
    handler.stop_container(api.StopContainerRequest(pod=request.pod, container=request.container))


def time_decide(fake: FakeApi, probes: int) -> list[float]:
    """decide() alone for the exclusive probe's request, on the same state."""
    caller = Caller(pid=os.getpid(), uid=0, gid=0)
    out = []
    for n in range(probes):
        body = AdmitRequest(name=k8s.workload_name(probe(n, True).container.id), cpus=2, memory_bytes=GIB)
        req = to_admission_request(body, caller, name=body.name, created_unix=0.0)
        started = time.perf_counter()
        decide(fake.machine, fake.state, req)
        out.append(time.perf_counter() - started)
    return out


def time_handler(handler: KubernetesHandler, probes: int, exclusive: bool) -> tuple[list[float], int]:
    out, updates = [], 0
    for n in range(probes):
        request = probe(n, exclusive)
        started = time.perf_counter()
        answer = handler.create_container(request)
        out.append(time.perf_counter() - started)
        updates = max(updates, len(answer.update))
        stop(handler, request)
    return out, updates


def time_session(handler: KubernetesHandler, probes: int, exclusive: bool) -> list[float]:
    with tempfile.TemporaryDirectory() as tmp:
        rt = FakeRuntime(os.path.join(tmp, "nri.sock"))
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(rt.path)
        session = plugin.PluginSession(sock, handler, "numa-agent", "10")
        thread = threading.Thread(target=session.run, daemon=True)
        thread.start()
        rt.accept()
        rt.expect_register()
        out = []
        try:
            for n in range(probes):
                request = probe(n, exclusive)
                started = time.perf_counter()
                code, message, _ = rt.call("CreateContainer", request, None)
                out.append(time.perf_counter() - started)
                if code:
                    raise SystemExit(f"CreateContainer refused: {message}")
                code, message, _ = rt.call("StopContainer", api.StopContainerRequest(
                    pod=request.pod, container=request.container), None)
                if code:
                    raise SystemExit(f"StopContainer refused: {message}")
        finally:
            rt.close()
            thread.join(10)
        return out


def ms(values: list[float], q: float) -> str:
    value = percentile(values, q)
    return fmt(None if value is None else value * 1000)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--probes", type=int, default=200)
    parser.add_argument("--nodes", type=int, nargs="+", default=[8, 64])
    parser.add_argument("--containers", type=int, default=1000)
    args = parser.parse_args(argv)
    rows = []
    for nodes in args.nodes:
        fake, handler, exclusive = filled(nodes, args.containers)
        cpus = len(fake.machine.usable_cpus)
        decided = time_decide(fake, args.probes)
        base = percentile(decided, 50) or 0.0
        rows.append([str(nodes), str(cpus), f"{exclusive}+{args.containers - exclusive}", "decide", "-", "-",
                     ms(decided, 50), ms(decided, 99), "1.0"])
        for kind in ("exclusive", "shared"):
            timed, updates = time_handler(handler, args.probes, kind == "exclusive")
            over = time_session(handler, args.probes, kind == "exclusive")
            for path, values in (("handler", timed), ("session", over)):
                p50 = percentile(values, 50) or 0.0
                rows.append([str(nodes), str(cpus), f"{exclusive}+{args.containers - exclusive}", path, kind,
                             str(updates), ms(values, 50), ms(values, 99), f"{p50 / base:.1f}" if base else "-"])
    print(table(["nodes", "cpus", "live excl+shared", "path", "probe", "updates", "p50 ms", "p99 ms",
                 "p50/decide"], rows))


if __name__ == "__main__":
    main()
