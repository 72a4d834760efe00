"""The workload tally the metrics give, followed through updates, equals the one
computed afresh from the resulting state, whatever the updates."""

from hypothesis import given, settings
from hypothesis import strategies as st

from numa_agent.service.tally import WorkloadTally, workload_tally
from numa_agent.state.model import QUARANTINED, REBUILT, AgentState, Pod, Workload

NAMES = [f"w{i}" for i in range(6)]
PODS = ["p0", "p1"]

workloads = st.builds(
    lambda name, pod, lost, quarantined: Workload(
        name=name, owner_uid=1000, pod=pod, lost=("cpu 3",) if lost else (),
        request={REBUILT: QUARANTINED} if quarantined else {}),
    st.sampled_from(NAMES), st.none() | st.sampled_from(PODS), st.booleans(), st.booleans())
steps = st.lists(st.one_of(
    st.tuples(st.just("put"), workloads),
    st.tuples(st.just("drop"), st.sampled_from(NAMES)),
    st.tuples(st.just("pod"), st.sampled_from(PODS)),
    st.tuples(st.just("unpod"), st.sampled_from(PODS))), max_size=30)


def _afresh(state: AgentState) -> WorkloadTally:
    return WorkloadTally().after_workloads((), AgentState(workloads=state.workloads, pods=state.pods).workloads)


def _fresh_count(state: AgentState) -> tuple[int, int]:
    held = [w for w in state.workloads if w.request.get(REBUILT) != QUARANTINED]
    return len(held), sum(1 for w in held if w.lost)


@settings(max_examples=200, deadline=None)
@given(steps)
def test_followed_tally_equals_the_one_counted_afresh(ops):
    state = AgentState()
    workload_tally(state)  # kept from the first state on: followed, never recounted
    for op, arg in ops:
        if op == "put":
            state = state.with_workload(arg)
        elif op == "drop":
            state = state.without_workload(arg)
        elif op == "pod":
            state = state.with_pod(Pod(name=arg, owner_uid=1000))
        else:
            state = state.without_pod(arg)
        assert "workload_tally" in state.memo  # handed on, not recomputed
        kept = workload_tally(state)
        assert (kept.held, kept.lost) == _fresh_count(state)
        assert kept == _afresh(state)


def test_quarantine_is_the_workloads_own_property():
    """Read by the service, the observer and the tally alike, from the workload itself."""
    held = Workload(name="held", owner_uid=0, request={REBUILT: QUARANTINED})
    partial = Workload(name="p", owner_uid=0, request={REBUILT: "partial"})
    assert held.quarantined and not partial.quarantined
    assert not Workload(name="plain", owner_uid=0).quarantined
    assert Workload.from_json(held.to_json()).quarantined  # as the checkpoint keeps it
