"""bench-scale runs each mode with the kubelet interfaces on and off and sets
the two p50s side by side (figures only; nothing here times anything)."""

from pathlib import Path

from benchmarks import scale


def test_each_mode_runs_with_the_kubelet_interfaces_on_and_off():
    modes = scale.modes(["affinity", "simulated"], Path("/snap"), ("shared",), ("on", "off"))
    assert [(m.name, m.kubelet) for m in modes] == [("affinity", "on"), ("affinity", "off"),
                                                    ("simulated", "on"), ("simulated", "off")]
    for m in modes:
        assert (m.agent_args[-4:] == scale.KUBELET_OFF_ARGS) == (m.kubelet == "off")


def test_on_over_off_pairs_rows_of_the_same_mode_kind_and_count():
    def row(kubelet, live, p50):
        return {"mode": "simulated", "kind": "shared", "workloads": live, "kubelet": kubelet,
                "admit_p50_ms": p50, "admit_p99_ms": 2 * p50, "release_p50_ms": p50, "release_p99_ms": p50,
                "exclusive_live": 0}

    pairs = scale.kubelet_ratios([row("on", 20, 3.0), row("off", 20, 2.0), row("on", 1000, 4.0)])
    assert [(r["workloads"], r["admit_p50_ratio"]) for r in pairs] == [(20, 1.5)]
    text = scale.render({"samples": 5, "snapshot": "s", "rows": [row("on", 20, 3.0), row("off", 20, 2.0)],
                         "ratios": [], "kubelet_ratios": pairs})
    assert "on over off" in text and "1.50x" in text
