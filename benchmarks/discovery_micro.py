"""Print how long discovery takes on each snapshot (a script, not a test).

    .venv/bin/python benchmarks/discovery_micro.py [REPEATS]
"""

from __future__ import annotations

import sys
import tarfile
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from numa_agent.discovery.sysfs import read_topology  # noqa: E402

ARCHIVES = sorted((Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "sysfs").glob("*.tar.gz"))


def main() -> None:
    repeats = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    with tempfile.TemporaryDirectory() as tmp:
        for archive in ARCHIVES:
            with tarfile.open(archive) as tar:
                tar.extractall(tmp, filter="tar")
            root = Path(tmp) / archive.name[: -len(".tar.gz")]
            best = float("inf")
            for _ in range(repeats):
                start = time.perf_counter()
                topo = read_topology(root)
                best = min(best, time.perf_counter() - start)
            print(f"{root.name:48s} {len(topo.cpus):4d} cpus {len(topo.pci_devices):4d} pci  "
                  f"best of {repeats}: {best * 1000:7.1f} ms")


if __name__ == "__main__":
    main()
