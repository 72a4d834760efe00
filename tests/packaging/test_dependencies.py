"""Every dependency the package declares is imported by the package: one declared and
never used (psutil was) costs every install a download and a build for nothing."""

import ast
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# A distribution's name on PyPI -> the top-level module the package imports.
MODULE_OF = {"prometheus-client": "prometheus_client", "grpcio": "grpc", "protobuf": "google"}


def declared() -> list[str]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    names = []
    for spec in project["dependencies"]:
        name = spec.split(";")[0].strip()
        for stop in "<>=!~[ ":
            name = name.split(stop)[0]
        names.append(name)
    return names


def imported_top_levels() -> set[str]:
    out = set()
    for path in (REPO / "numa_agent").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                out.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                out.add(node.module.split(".")[0])
    return out


def test_every_declared_dependency_is_imported():
    used = imported_top_levels()
    unused = [d for d in declared() if MODULE_OF.get(d, d.replace("-", "_")) not in used]
    assert unused == []


def test_the_check_reads_the_declarations():
    assert {"msgspec", "pyudev", "grpcio"} <= set(declared())
