"""No import cycle between numa_agent's modules.

Every module under numa_agent/ is parsed with ast; every import statement
counts, wherever it sits (module level, under ``if TYPE_CHECKING``, inside a
function), and ``from pkg import name`` counts as importing ``pkg.name`` when
that is a module. A module depends on its package's ``__init__`` only when it
imports it.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "numa_agent"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _resolve(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[:len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def import_graph() -> dict[str, set[str]]:
    files = {_module_name(p): p for p in sorted((ROOT / PACKAGE).rglob("*.py"))}
    graph: dict[str, set[str]] = {}
    for module, path in files.items():
        is_package = path.name == "__init__.py"
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = _resolve(module, is_package, node)
                targets.add(base)
                targets.update(f"{base}.{alias.name}" for alias in node.names)
        graph[module] = {t for t in targets if t in files and t != module}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_graph_sees_the_known_edges():
    graph = import_graph()
    assert "numa_agent.admission.cpu_topology" in graph["numa_agent.admission.cpu_take"]
    assert "numa_agent.core.hints" in graph["numa_agent.admission.topology_manager"]


def test_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycle():
    assert cycles(import_graph()) == []


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """numa_agent's packages (core, state, admission...) and which others each imports;
    the package's own __init__ and the top-level modules count as "numa_agent"."""
    def package(module: str) -> str:
        parts = module.split(".")
        return parts[1] if len(parts) > 2 or (len(parts) == 2 and (ROOT / PACKAGE / parts[1]).is_dir()) \
            else PACKAGE
    out: dict[str, set[str]] = {}
    for module, targets in graph.items():
        deps = out.setdefault(package(module), set())
        deps.update(package(t) for t in targets)
    return {p: deps - {p} for p, deps in out.items()}


def test_no_package_cycle():
    """A module-level cycle test cannot see a ring of packages (observe importing the
    service that imports observe, through different modules): this one does."""
    assert cycles(package_graph(import_graph())) == []


def test_package_graph_sees_package_edges():
    packages = package_graph(import_graph())
    assert "core" in packages["admission"] and "admission" not in packages["core"]
    assert packages["core"] <= {PACKAGE}  # the vocabulary every layer shares imports none of them


# The layers, lowest first (docs/architecture.md, "Layers"): a package imports only from
# layers below its own. The service is the application core: it speaks no protocol, and
# the adapters above it (the HTTP API, the kubelet's files and PodResources, the OCI
# hook) each say its refusals and its state in theirs.
LAYERS: tuple[frozenset[str], ...] = tuple(frozenset(layer.split()) for layer in (
    "numa_agent",                  # the version, nothing else
    "core",                        # the shared vocabulary: cpusets, hints, names, units, the caller
    "state discovery",             # the state model and its files; sysfs read into a Topology
    "admission isolation",         # the pure managers and merge; the isolation planner and knobs
    "enforcement hotplug",         # cgroups and affinity; fitting state to changed hardware
    "observe",                     # intruders and memory per node
    "views",                       # renderings of values: the topology report, the metrics collector
    "service",                     # the use-cases: their requests and refusals, the state's one owner
    "api kubelet",                 # adapters: the local HTTP API; the kubelet's files and PodResources
    "engines",                     # the OCI hook, a client of the API
    "nri",                         # NRI: the wire and plugin session (which reach only core and
                                   # state, below), and the Kubernetes handler over the service
    "daemon",                      # assembly, the event loop, configuration, logging, sd_notify
    "cli",                         # the commands
))


def layer_of(package: str) -> int:
    return next(i for i, layer in enumerate(LAYERS) if package in layer)


def upward_imports(packages: dict[str, set[str]]) -> list[str]:
    return sorted(f"{p} -> {q}" for p, deps in packages.items() for q in deps
                  if layer_of(q) >= layer_of(p))


def test_every_package_has_a_layer():
    packages = package_graph(import_graph())
    assert sorted(p for p in packages if not any(p in layer for layer in LAYERS)) == []


def test_no_package_imports_from_its_own_layer_or_above():
    assert upward_imports(package_graph(import_graph())) == []


def test_an_upward_import_is_caught():
    assert upward_imports({"core": {"state"}, "state": {"core"}}) == ["core -> state"]
    assert upward_imports({"service": {"kubelet"}, "kubelet": set()}) == ["service -> kubelet"]
    assert upward_imports({"api": {"kubelet"}, "kubelet": set()}) == ["api -> kubelet"]  # one layer


def test_the_application_core_speaks_no_protocol():
    """The use-cases import none of their adapters (HTTP, the kubelet's files and gRPC,
    the OCI hook), nor the daemon that assembles them, nor the commands."""
    assert package_graph(import_graph())["service"].isdisjoint({"api", "kubelet", "engines", "daemon", "cli"})


# What a container means to the agent (nri/kubernetes.py, nri/handler.py); every other
# module of nri/ is the wire and the plugin session, given a handler from above.
NRI_MEANING = frozenset({"numa_agent.nri.kubernetes", "numa_agent.nri.handler"})


def test_the_nri_wire_knows_no_use_case():
    """NRI's wire and plugin session reach the vocabulary and the state's files only:
    what a container means is the handler's, given to the session from above."""
    graph = import_graph()
    wire = [m for m in graph if m.startswith("numa_agent.nri") and m not in NRI_MEANING]
    assert "numa_agent.nri.plugin" in wire
    allowed = ("numa_agent.core", "numa_agent.state", "numa_agent.nri")
    assert {m: sorted(t for t in reachable(graph, m) if not t.startswith(allowed) or t in NRI_MEANING)
            for m in wire} == {m: [] for m in wire}


def reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    """Every module `start` imports, directly or through others."""
    seen: set[str] = set()
    todo = [start]
    while todo:
        for t in graph[todo.pop()]:
            if t not in seen:
                seen.add(t)
                todo.append(t)
    return seen


def test_reachable_follows_imports_through_others():
    assert reachable({"a": {"b"}, "b": {"c"}, "c": set(), "d": {"a"}}, "a") == {"b", "c"}


SERVICE = "numa_agent.service"
ADAPTER_PACKAGES = ("api", "kubelet", "views", "engines", "nri")


def test_the_read_side_reaches_no_writer():
    """Status, health and the metrics' views never write: the read side imports
    neither the commit unit nor the assembled service (service/read_side.py)."""
    assert reachable(import_graph(), f"{SERVICE}.read_side") & {f"{SERVICE}.commit", f"{SERVICE}.agent_service"} \
        == set()


def test_the_adapters_hold_the_protocol_not_the_service():
    """The API, the kubelet's servers, the views, the OCI hook and NRI name the service by
    service/ports.py's AgentApi: none reaches the implementation or its commit unit."""
    graph = import_graph()
    implementation = {f"{SERVICE}.agent_service", f"{SERVICE}.commit"}
    reached = {m: sorted(reachable(graph, m) & implementation) for m in graph
               if m.split(".")[1:2] and m.split(".")[1] in ADAPTER_PACKAGES}
    assert {m: r for m, r in reached.items() if r} == {}
    assert f"{SERVICE}.ports" in graph["numa_agent.api.server"]
    assert f"{SERVICE}.ports" in graph["numa_agent.kubelet.grpc_server"]


def test_the_use_cases_reach_no_adapter():
    """service/cases/ (admit, release, resize) are given their ports (cases/ports.py):
    they reach no adapter, no assembly, nor the assembled service itself."""
    graph = import_graph()
    cases = [m for m in graph if m.startswith(f"{SERVICE}.cases.")]
    assert {f"{SERVICE}.cases.admit", f"{SERVICE}.cases.release", f"{SERVICE}.cases.resize"} <= set(cases)
    outside = ("numa_agent.api", "numa_agent.kubelet", "numa_agent.daemon", "numa_agent.cli", "numa_agent.engines",
               f"{SERVICE}.agent_service")
    assert {m: sorted(t for t in reachable(graph, m) if t.startswith(outside)) for m in cases} \
        == {m: [] for m in cases}
