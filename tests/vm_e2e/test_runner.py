"""The host-side runner and the guest script's refusals, without booting a guest: the
harness's run_in_guest is replaced by a stand-in that answers as a guest would."""

import json
import time

import pytest
from vmharness import GuestBootError, GuestError, GuestResult

from tests.vm_e2e import runner, scenarios
from tests.vm_e2e.plan import DEFAULT_SHAPES, GUEST_MODULES, PLAN, SCENARIOS, guest_module, result_line, scenarios_of


def guest_answering(stdout="", exit_code=0, timed_out=False, raises=None, report=None):
    calls = []

    def run_in_guest(shape, argv, timeout, *, cwd, out_dir, stream):
        calls.append((shape, list(argv), timeout, out_dir))
        if report is not None:
            (runner.Path(out_dir) / f"report-{shape}.json").write_text(json.dumps(report))
        if raises is not None:
            raise raises
        text = stdout(shape) if callable(stdout) else stdout
        return GuestResult(shape, tuple(argv), None if timed_out else exit_code, timed_out, text.encode(),
                           b"Traceback...\nRuntimeError: boom\n", 5.0, 60.0, 65.0, 1)
    run_in_guest.calls = calls
    return run_in_guest


# Counted from the plan, so adding a scenario does not rewrite these tests.
ALL, N2, N4 = len(SCENARIOS), len(PLAN["2node"]), len(PLAN["4node"])
assert len(PLAN["cpuless"]) == 2

def run(argv, fake, tmp_path, capsys, venv_check=lambda: None):
    code = runner.main([*argv, "--out-dir", str(tmp_path)], run_in_guest=fake, venv_check=venv_check,
                       containerd_check=lambda: None)
    out, err = capsys.readouterr()
    return code, out.splitlines(), err


def all_pass(shape):
    return "\n".join(result_line("PASS", s, shape) if s in PLAN[shape] else result_line("SKIP", s, shape, "x")
                     for s in SCENARIOS) + "\n"


def test_all_passing_guests_exit_0_with_one_closing_line(tmp_path, capsys):
    fake = guest_answering(all_pass)
    code, lines, err = run(["--shape", "2node,4node", "--timeout", "300"], fake, tmp_path, capsys)
    assert code == 0
    assert lines == [f"{N2 + N4} passed, 0 failed, {2 * ALL - N2 - N4} skipped"]  # the guest's own lines were streamed, not repeated
    assert [c[0] for c in fake.calls] == ["2node", "4node"]
    assert fake.calls[0][1][-4:] == ["-m", "tests.vm_e2e.scenarios", "--shape", "2node"]
    assert fake.calls[0][2] == 300
    assert "2node: 65.0 s (boot 5.0 s, scenarios 60.0 s" in err


def test_a_guest_that_never_boots_fails_every_planned_scenario_with_the_harness_message(tmp_path, capsys):
    fake = guest_answering(raises=GuestBootError("4node: the guest never started the command in 2 boot(s)"))
    code, lines, _ = run(["--shape", "4node"], fake, tmp_path, capsys)
    assert code == 1
    assert lines[0] == "FAIL 1-pin-core 4node: guest: 4node: the guest never started the command in 2 boot(s)"
    assert lines[3].startswith("SKIP 4-devices 4node: not planned for 4node (it runs 1-pin-core, ")
    assert sum(line.startswith("FAIL") for line in lines) == N4
    assert lines[-1] == f"0 passed, {N4} failed, {ALL - N4} skipped"


def test_a_guest_that_dies_midway_keeps_what_its_report_recorded(tmp_path, capsys):
    report = {"shape": "cpuless", "results": [{"scenario": "1-pin-core", "status": "PASS", "seconds": 3}]}
    fake = guest_answering(raises=GuestError("cpuless: the guest stopped while the command ran"), report=report)
    code, lines, _ = run(["--shape", "cpuless"], fake, tmp_path, capsys)
    assert code == 1
    assert "FAIL 5-memory cpuless: guest: cpuless: the guest stopped while the command ran" in lines
    assert not any(line.split()[1] == "1-pin-core" for line in lines[:-1])  # the guest reported it
    assert lines[-1] == f"1 passed, 1 failed, {ALL - 2} skipped"


def test_scenarios_the_script_never_reached_fail_with_its_exit_status(tmp_path, capsys):
    fake = guest_answering("PASS 1-pin-core 2node\nFAIL 2-exclusive 2node: overlap\n", exit_code=1)
    code, lines, _ = run(["--shape", "2node"], fake, tmp_path, capsys)
    assert code == 1
    assert lines[0] == ("FAIL 3-single-numa 2node: no result: the scenario script exited 1 before reaching it "
                        "(Traceback... | RuntimeError: boom)")
    assert lines[-1] == f"1 passed, {N2 - 1} failed"


def test_a_timed_out_guest_says_so(tmp_path, capsys):
    fake = guest_answering("PASS 1-pin-core 2node\n", timed_out=True)
    code, lines, _ = run(["--shape", "2node", "--timeout", "42"], fake, tmp_path, capsys)
    assert code == 1
    assert lines[0] == "FAIL 2-exclusive 2node: no result: the scenarios did not finish within 42 s"


def test_result_lines_of_another_shape_or_unknown_scenario_are_ignored(tmp_path, capsys):
    fake = guest_answering("PASS 1-pin-core 4node\nPASS 0-bogus 2node\n" + all_pass("2node"))
    code, lines, _ = run(["--shape", "2node"], fake, tmp_path, capsys)
    assert (code, lines) == (0, [f"{N2} passed, 0 failed"])


def test_bad_arguments_and_a_missing_venv_stop_before_any_boot(tmp_path, capsys):
    fake = guest_answering(all_pass)
    with pytest.raises(SystemExit) as info:
        runner.main(["--shape", "2node,9node"], run_in_guest=fake, venv_check=lambda: None)
    assert info.value.code == 2 and "unknown machine shape '9node'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        runner.main(["--timeout", "0"], run_in_guest=fake, venv_check=lambda: None)
    assert "--timeout must be positive, got 0" in capsys.readouterr().err
    code, lines, err = run([], fake, tmp_path, capsys, venv_check=lambda: "cannot set up .venv: no pip")
    assert code == 2 and lines == [] and "vm-e2e: cannot set up .venv: no pip" in err
    assert fake.calls == []


def test_result_line_keeps_a_reason_on_one_line():
    assert result_line("FAIL", "3-single-numa", "2node", "exit 0\n  stderr: x") == \
        "FAIL 3-single-numa 2node: exit 0 stderr: x"
    assert result_line("PASS", "1-pin-core", "2node") == "PASS 1-pin-core 2node"


def test_the_guest_script_refuses_to_run_outside_a_guest(monkeypatch, capsys):
    monkeypatch.delenv("NUMA_AGENT_IN_VM", raising=False)
    assert scenarios.main(["--shape", "2node"]) == 2
    assert "refusing to run outside the QEMU guest (NUMA_AGENT_IN_VM is not 1)" in capsys.readouterr().err


def test_the_guest_script_refuses_unknown_scenarios_and_non_root(monkeypatch, capsys):
    monkeypatch.setenv("NUMA_AGENT_IN_VM", "1")
    monkeypatch.setattr(scenarios.os, "geteuid", lambda: 0)
    assert scenarios.main(["--shape", "2node", "--only", "1-pin-core,9-nope"]) == 2
    assert "unknown scenario(s) 9-nope; known: 1-pin-core" in capsys.readouterr().err
    monkeypatch.setattr(scenarios.os, "geteuid", lambda: 1000)
    assert scenarios.main(["--shape", "2node"]) == 2
    assert "must run as root in the guest" in capsys.readouterr().err


def test_the_systemd_shape_runs_its_own_scenarios_after_the_wheelhouse_is_ready(tmp_path, capsys):
    from tests.vm_e2e.plan import SYSTEMD_SCENARIOS
    fake = guest_answering(lambda shape: "\n".join(result_line("PASS", s, shape) for s in SYSTEMD_SCENARIOS))
    checked = []
    code = runner.main(["--shape", "systemd", "--out-dir", str(tmp_path)], run_in_guest=fake,
                       venv_check=lambda: None, wheelhouse_check=lambda: checked.append(1))
    out, _ = capsys.readouterr()
    assert code == 0 and checked == [1]
    assert fake.calls[0][1][-4:] == ["-m", "tests.vm_e2e.systemd_scenarios", "--shape", "systemd"]
    assert out.splitlines()[-1] == f"{len(SYSTEMD_SCENARIOS)} passed, 0 failed"


def test_a_missing_wheelhouse_stops_before_booting(tmp_path, capsys):
    fake = guest_answering("")
    code = runner.main(["--shape", "systemd", "--out-dir", str(tmp_path)], run_in_guest=fake,
                       venv_check=lambda: None, wheelhouse_check=lambda: "cannot fetch the wheels")
    assert code == 2 and fake.calls == []
    assert "cannot fetch the wheels" in capsys.readouterr().err


def test_the_containerd_shape_fetches_the_runtime_then_runs_its_own_scenarios(tmp_path, capsys):
    from tests.vm_e2e.plan import CONTAINERD_SCENARIOS
    fake = guest_answering(lambda shape: "\n".join(result_line("PASS", s, shape) for s in CONTAINERD_SCENARIOS))
    fetched = []
    code = runner.main(["--shape", "containerd", "--out-dir", str(tmp_path)], run_in_guest=fake,
                       venv_check=lambda: None, containerd_check=lambda: fetched.append(1))
    out, _ = capsys.readouterr()
    assert code == 0 and fetched == [1]
    assert fake.calls[0][1][-4:] == ["-m", "tests.vm_e2e.containerd_scenarios", "--shape", "containerd"]
    assert out.splitlines()[-1] == f"{len(CONTAINERD_SCENARIOS)} passed, 0 failed"


def test_a_runtime_that_cannot_be_fetched_fails_its_guest_alone_and_other_shapes_do_not_fetch(tmp_path, capsys):
    from tests.vm_e2e.plan import CONTAINERD_SCENARIOS
    fake = guest_answering(all_pass)
    (tmp_path / "containerd").mkdir()
    (tmp_path / "containerd" / "report-containerd.json").write_text(json.dumps(  # an earlier run's
        {"shape": "containerd", "results": [{"scenario": CONTAINERD_SCENARIOS[0], "status": "PASS"}]}))
    code = runner.main(["--shape", "cpuless,containerd", "--out-dir", str(tmp_path)], run_in_guest=fake,
                       venv_check=lambda: None, containerd_check=lambda: "cannot fetch containerd")
    out, err = capsys.readouterr()
    assert code == 1 and [c[0] for c in fake.calls] == ["cpuless"]
    assert "vm-e2e: cannot fetch containerd" in err
    failed = [line for line in out.splitlines() if line.startswith("FAIL")]
    assert failed == [f"FAIL {s} containerd: guest: not booted: cannot fetch containerd" for s in CONTAINERD_SCENARIOS]
    asked = []
    runner.main(["--shape", "4node", "--out-dir", str(tmp_path)], run_in_guest=guest_answering(all_pass),
                venv_check=lambda: None, containerd_check=lambda: asked.append(1))
    assert asked == []


def test_a_guest_that_hangs_before_reporting_anything_is_booted_once_more(tmp_path, capsys):
    answers = iter([("", True), (all_pass("cpuless"), False)])

    def run_in_guest(shape, argv, timeout, *, cwd, out_dir, stream):
        text, timed_out = next(answers)
        return GuestResult(shape, tuple(argv), None if timed_out else 0, timed_out, text.encode(), b"",
                           5.0, 60.0, 65.0, 1)
    code, lines, err = run(["--shape", "cpuless"], run_in_guest, tmp_path, capsys)
    assert code == 0 and "reported no scenario within 900 s (a hung guest); booting it once more" in err
    # One that timed out after reporting something is not booted again: its result stands.
    fake = guest_answering("PASS 1-pin-core 2node\n", timed_out=True)
    code, _, _ = run(["--shape", "2node"], fake, tmp_path, capsys)
    assert code == 1 and len(fake.calls) == 1


def test_scenario_boots_only_the_shapes_that_plan_it_and_asks_the_guest_for_it_alone(tmp_path, capsys):
    fake = guest_answering("PASS 19-release-sticks 2node\n")
    code, lines, _ = run(["--shape", "2node,4node", "--scenario", "19-release-sticks"], fake, tmp_path, capsys)
    assert code == 0 and [c[0] for c in fake.calls] == ["2node"]  # 4node does not plan it: not booted
    assert fake.calls[0][1][-2:] == ["--only", "19-release-sticks"]
    assert "SKIP 1-pin-core 2node: not selected (--scenario)" in lines
    assert lines[-1] == f"1 passed, 0 failed, {ALL - 1} skipped"


def test_an_unselected_scenario_is_not_failed_when_the_guest_dies(tmp_path, capsys):
    fake = guest_answering(raises=GuestBootError("2node: the guest never started the command in 2 boot(s)"))
    code, lines, _ = run(["--shape", "2node", "--scenario", "7-restart"], fake, tmp_path, capsys)
    assert code == 1 and [line for line in lines if line.startswith("FAIL")] == [
        "FAIL 7-restart 2node: guest: 2node: the guest never started the command in 2 boot(s)"]


def test_an_unknown_or_unplanned_scenario_stops_before_any_boot(tmp_path, capsys):
    fake = guest_answering(all_pass)
    with pytest.raises(SystemExit):
        runner.main(["--shape", "2node", "--scenario", "99-nope"], run_in_guest=fake, venv_check=lambda: None)
    assert "unknown scenario(s) 99-nope for shape(s) 2node" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        runner.main(["--shape", "4node", "--scenario", "7-restart"], run_in_guest=fake, venv_check=lambda: None)
    assert "no shape given plans 7-restart" in capsys.readouterr().err
    assert fake.calls == []


def test_a_guest_with_many_scenarios_gets_time_for_each_unless_told(tmp_path, capsys):
    fake = guest_answering(all_pass)
    run(["--shape", "2node,cpuless"], fake, tmp_path, capsys)
    timeouts = [(shape, timeout) for shape, _, timeout, _ in fake.calls]
    assert timeouts == [("2node", runner.PER_SCENARIO * N2),
                        ("cpuless", runner.DEFAULT_TIMEOUT)]  # two scenarios: the floor
    assert runner.PER_SCENARIO * N2 > runner.DEFAULT_TIMEOUT
    fake.calls.clear()
    run(["--shape", "2node", "--timeout", "42"], fake, tmp_path, capsys)
    assert [timeout for _, _, timeout, _ in fake.calls] == [42]
    fake.calls.clear()
    run(["--shape", "2node", "--scenario", "1-pin-core"], fake, tmp_path, capsys)
    assert [timeout for _, _, timeout, _ in fake.calls] == [runner.DEFAULT_TIMEOUT]


def test_a_long_scenario_prints_where_it_is_and_the_agent_log_tail(capfd):
    from tests.vm_e2e.watch import ScenarioWatch

    def stuck_in_a_wait():
        time.sleep(0.35)

    with ScenarioWatch("13-restart-inflight", "4node", lambda: "first\nlast agent line\n", every=0.1):
        stuck_in_a_wait()
    out = capfd.readouterr().out
    assert "vm-e2e watch: 13-restart-inflight 4node still running after 0 s" in out
    assert "stuck_in_a_wait" in out  # the scenario's own stack, not only the watcher's
    assert "  last agent line" in out


def test_a_quick_scenario_prints_nothing_and_a_broken_log_does_not_end_it(capfd):
    from tests.vm_e2e.watch import ScenarioWatch

    def broken() -> str:
        raise OSError("gone")

    with ScenarioWatch("1-pin-core", "2node", broken, every=5):
        pass
    assert capfd.readouterr().out == ""
    with ScenarioWatch("1-pin-core", "2node", broken, every=0.05):
        time.sleep(0.12)
    assert "(unreadable: gone)" in capfd.readouterr().out


@pytest.mark.parametrize("shape", sorted(GUEST_MODULES))
def test_each_engines_guest_module_runs_the_scenarios_its_shape_reports_in_order(shape):
    import importlib

    from vmharness import get_shape

    module = importlib.import_module(guest_module(shape))
    assert tuple(module.RUNNERS) == scenarios_of(shape) == PLAN[shape]
    assert get_shape(shape).name == shape
    assert shape in DEFAULT_SHAPES  # CI runs every engine's guest
