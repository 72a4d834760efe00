"""How a decision's hint summaries read in numa-run -v and numa-agent explain."""

from numa_agent.cli.common import explanation_lines


def _hint_line(more: int) -> str:
    explanation = {"providers": [{"provider": "cpu", "resource": "cpu", "hints": ["{0} preferred"],
                                  "more": more}]}
    [line] = explanation_lines(explanation)
    return line


def test_counted_hints_not_listed_are_counted():
    assert _hint_line(3) == "  hints cpu: {0} preferred (+3 more)"


def test_hints_too_many_to_count_are_not_given_a_negative_count():
    # more = -1 is the agent's "not counted" (HintSummary); "+-1 more" was printed before.
    line = _hint_line(-1)
    assert "-1" not in line and line == "  hints cpu: {0} preferred (+ wider masks, not counted)"


def test_no_more_hints_adds_nothing():
    assert _hint_line(0) == "  hints cpu: {0} preferred"


def _refused_resize(policy: str, cpus: int | None = None, memory: int | None = None) -> list[str]:
    """The lines `numa-agent resize` prints for the planner's refusal, as the service
    passes it on (its message as the reason, its explanation as the details)."""
    import pytest

    from numa_agent.admission.admit import Refusal
    from numa_agent.admission.resize import resize
    from numa_agent.cli.common import refusal_lines
    from tests.admission.test_resize import admitted, machine

    m = machine(policy)
    state, _ = admitted(m, cpus=6, memory=1 << 30)  # node 0: 7 CPUs to give (CPU 0 reserved)
    with pytest.raises(Refusal) as refused:
        resize(m, state, "web", cpus=cpus, memory_bytes=memory)
    error = {"code": "admission_refused", "message": refused.value.message,
             "details": {**refused.value.explanation, "reason": refused.value.message}}
    return refusal_lines("numa-agent resize: refused", error)


def test_a_refused_growth_says_from_how_many_to_how_many_and_what_is_free_where():
    lines = _refused_resize("best-effort", cpus=20)
    assert lines == ["numa-agent resize: refused: cannot grow web from 6 to 20 CPUs: 14 more needed, 9 free",
                     "  free: node 0: 1 CPU, 7 GiB; node 1: 8 CPUs, 8 GiB"]


def test_a_growth_an_aligned_policy_refuses_says_it_in_the_same_terms():
    lines = _refused_resize("restricted", cpus=8)
    assert lines[0] == ("numa-agent resize: refused: TopologyAffinityError: cannot grow web from 6 to 8 CPUs "
                        "within NUMA node(s) 0 (policy restricted): 2 more needed, 1 free there")
    assert lines[1] == "  free: node 0: 1 CPU, 7 GiB; node 1: 8 CPUs, 8 GiB"


def test_a_refused_memory_growth_says_from_what_to_what():
    lines = _refused_resize("best-effort", memory=64 << 30)
    assert lines[0] == ("numa-agent resize: refused: cannot grow web's memory from 1 GiB to 64 GiB: "
                        "63 GiB more needed, 7 GiB free on its node(s) 0")
    assert lines[1].startswith("  free: node 0: ")
