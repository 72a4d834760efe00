"""The JSON of a decision's explanation, and of a refusal's, pinned as it was
on main before the explanation became a typed value: the API's answers and
`numa-agent explain` read exactly this. The golden file was written from main
(`python tests/admission/test_explanation_json.py --write` there)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from numa_agent.admission.admit import InvalidRequest, Refusal, Request, Resources, decide
from numa_agent.admission.machine import PolicyConfig, build_machine
from numa_agent.admission.resize import resize
from numa_agent.core.cpuset import CpuSet
from numa_agent.state.model import AgentState

try:
    from tests.support.synthetic import make_topology
except ImportError:  # run as a script
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from tests.support.synthetic import make_topology

GOLDEN = Path(__file__).with_name("data") / "explanations.json"
GIB = 1 << 30


def _machine(policy: str, scope: str = "container"):
    topo = make_topology(sockets=2, nodes_per_socket=2, cores_per_node=4, threads_per_core=2,
                         memory_per_node_bytes=8 * GIB, hugepages_2m_per_node=256)
    return build_machine(topo, PolicyConfig(topology_policy=policy, topology_scope=scope,
                                            topology_options={"max-allowable-numa-nodes": "64"}))


def _json(value: Any) -> Any:
    """The JSON the API answers: as_json() of the typed value (a dict on main)."""
    as_json = getattr(value, "as_json", None)
    return json.loads(json.dumps(as_json() if as_json is not None else value, sort_keys=True))


def _run(machine, state, req, explain):
    try:
        d = decide(machine, state, req, explain=explain)
    except Refusal as exc:
        return state, {"refused": exc.code, "message": exc.message, "explanation": _json(exc.explanation)}
    except InvalidRequest as exc:
        return state, {"invalid": str(exc)}
    return d.state, {"admitted": d.workload.name, "explanation": _json(d.explanation)}


def cases() -> dict[str, Any]:
    out: dict[str, Any] = {}
    for policy in ("none", "best-effort", "restricted", "single-numa-node"):
        m = _machine(policy)
        state = AgentState()
        steps = [
            ("shared", Request("shared", 1000, Resources(memory_bytes=GIB), shared=True)),
            ("cpus2", Request("cpus2", 1000, Resources(cpus=2, memory_bytes=2 * GIB))),
            ("pages", Request("pages", 1000, Resources(cpus=1, hugepages={2048: 64}))),
            ("big", Request("big", 1000, Resources(cpus=6, memory_bytes=6 * GIB))),
            ("physcpubind", Request("phys", 1000, Resources(cpus=2), physcpubind=CpuSet.parse("4-5"))),
            ("cpunodebind", Request("nodebind", 1000, Resources(cpus=1), cpunodebind=(1,))),
            ("pod-first", Request("p1", 1000, Resources(cpus=1), pod="pod",
                                  pod_budget=Resources(cpus=4, memory_bytes=2 * GIB))),
            ("pod-member", Request("p2", 1000, Resources(cpus=1), pod="pod")),
            ("too-much", Request("huge", 1000, Resources(cpus=60))),
            ("too-much-memory", Request("mem", 1000, Resources(memory_bytes=100 * GIB))),
        ]
        for explain in (False, True):
            state = AgentState()
            for label, req in steps:
                state, out[f"{policy}/{label}/explain={explain}"] = _run(m, state, req, explain)
            for label, kwargs in (("resize-up", {"cpus": 4}), ("resize-down", {"cpus": 1}),
                                  ("resize-memory", {"memory_bytes": 3 * GIB}),
                                  ("resize-too-much", {"cpus": 60})):
                try:
                    d = resize(m, state, "cpus2", **kwargs)
                except Refusal as exc:
                    out[f"{policy}/{label}/explain={explain}"] = {
                        "refused": exc.code, "message": exc.message, "explanation": _json(exc.explanation)}
                except InvalidRequest as exc:
                    out[f"{policy}/{label}/explain={explain}"] = {"invalid": str(exc)}
                else:
                    state = d.state
                    out[f"{policy}/{label}/explain={explain}"] = {"explanation": _json(d.explanation)}
    return out


def test_the_explanations_json_is_as_on_main():
    want = json.loads(GOLDEN.read_text())
    got = cases()
    assert sorted(got) == sorted(want)
    for key in want:
        assert got[key] == want[key], key


if __name__ == "__main__" and sys.argv[1:] == ["--write"]:
    GOLDEN.parent.mkdir(exist_ok=True)
    GOLDEN.write_text(json.dumps(cases(), indent=1, sort_keys=True) + "\n")


def test_the_explanation_is_a_typed_value_no_one_can_change():
    import pytest

    from numa_agent.admission.explanation import Explanation

    m = _machine("single-numa-node")
    d = decide(m, AgentState(), Request("a", 1000, Resources(cpus=2)), explain=True)
    e = d.explanation
    assert isinstance(e, Explanation) and e.admit
    assert e.topology is not None and (e.topology.policy, e.topology.verdict) == ("single-numa-node", "aligned")
    assert e.providers is not None and [p.provider for p in e.providers] == ["cpu"]
    with pytest.raises(AttributeError):  # frozen
        e.admit = False  # type: ignore[misc]
    with pytest.raises(TypeError):
        e["admit"] = False  # type: ignore[index]
    with pytest.raises(Refusal) as refused:
        decide(m, d.state, Request("b", 1000, Resources(cpus=60)))
    assert isinstance(refused.value.explanation, Explanation) and not refused.value.explanation.admit
    assert refused.value.explanation.reason is not None and e.admit  # the first one is untouched
