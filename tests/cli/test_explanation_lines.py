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
