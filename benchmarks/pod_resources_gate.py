"""Benchmark (a script, not a test): what the PodResources gate
(numa_agent/kubelet/gate.py) adds to a List, against grpcio's own socket
behind it (reachable here because the benchmark runs as the agent's user).

The answer is a fixed payload of SIZE bytes (the encoder is replaced: the
cost measured is the path, not the encoding). Measured, p50 and p99:

- warm: one channel, List after List;
- cold: a new channel (connect, HTTP/2 handshake) and one List.

Run: python benchmarks/pod_resources_gate.py [SIZE] (default 20000 bytes,
about a hundred pods' answer)
"""

import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import grpc  # noqa: E402

from benchmarks.stats import fmt, percentile, table  # noqa: E402
from numa_agent.kubelet import grpc_server  # noqa: E402
from numa_agent.kubelet import podresources_pb2 as pb  # noqa: E402
from numa_agent.kubelet import podresources_pb2_grpc as pb_grpc  # noqa: E402

WARM = 2000
COLD = 200


class _Fixed:
    def __init__(self, size: int) -> None:
        self.data = pb.ListPodResourcesResponse(
            pod_resources=[pb.PodResources(name="p" * max(1, size // 100 - 10), namespace="n")
                           for _ in range(100)]).SerializeToString()

    def update(self, machine, state):
        return self.data


class _Service:
    def view(self):
        return (None, None)


def _warm(path: str) -> list[float]:
    with grpc.insecure_channel(f"unix:{path}") as channel:
        stub = pb_grpc.PodResourcesListerStub(channel)
        stub.List(pb.ListPodResourcesRequest(), timeout=10)
        out = []
        for _ in range(WARM):
            t = time.perf_counter()
            stub.List(pb.ListPodResourcesRequest(), timeout=10)
            out.append(time.perf_counter() - t)
    return out


def _cold(path: str) -> list[float]:
    out = []
    for _ in range(COLD):
        t = time.perf_counter()
        with grpc.insecure_channel(f"unix:{path}") as channel:
            pb_grpc.PodResourcesListerStub(channel).List(pb.ListPodResourcesRequest(), timeout=10)
        out.append(time.perf_counter() - t)
    return out


def main() -> None:
    size = int(sys.argv[1]) if len(sys.argv) > 1 else 20000
    where = tempfile.mkdtemp(prefix="na-prgate-bench-")
    srv = grpc_server.PodResourcesServer(os.path.join(where, "pr.sock")).bind()
    fixed = _Fixed(size)
    srv._encoder = fixed  # type: ignore[assignment]
    srv.attach(_Service())
    srv.start()
    try:
        assert srv._gate is not None
        direct = srv._gate.upstream
        rows = []
        for name, measure in (("warm", _warm), ("cold", _cold)):
            for via, path in (("direct", direct), ("gate", srv.socket_path)):
                ms = [s * 1000 for s in measure(path)]
                rows.append([name, via, fmt(percentile(ms, 50)), fmt(percentile(ms, 99))])
        print(f"List answer of {len(fixed.data)} bytes")
        print(table(["List", "path", "p50 ms", "p99 ms"], rows))
    finally:
        srv.stop()
        shutil.rmtree(where)


if __name__ == "__main__":
    main()
