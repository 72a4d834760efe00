"""The cluster scenarios' own reading of srun's output and the files both nodes get, and
the runner's line on the second guest, without booting a guest."""

import pytest
from vmharness import GuestResult

from tests.vm_e2e import runner
from tests.vm_e2e.scenarios import ScenarioFailed
from tests.vm_e2e.slurm_cluster_scenarios import cluster_node_line, parse_tasks, slurm_files

LINE = "NodeName={} CPUs=8 Boards=1 SocketsPerBoard=2 CoresPerSocket=2 ThreadsPerCore=2 RealMemory={} CpuSpecList=0"


def test_one_node_line_for_both_nodes_keeps_the_smaller_memory():
    merged = cluster_node_line({"numa1": LINE.format("numa1", 960), "numa2": LINE.format("numa2", 958)})
    assert merged == LINE.format("numa[1-2]", 958)


def test_nodes_whose_lines_differ_get_no_shared_line():
    other = LINE.format("numa2", 960).replace("CpuSpecList=0", "CpuSpecList=0-1")
    with pytest.raises(ScenarioFailed, match=r"the nodes' lines differ in \['CpuSpecList'\]"):
        cluster_node_line({"numa1": LINE.format("numa1", 960), "numa2": other})


def test_srun_label_output_is_read_per_task():
    text = ("0: job 7 node numa1 pid 301\n1: job 7 node numa2 pid 402\n"
            "0: Cpus_allowed_list:\t2-3\n0: Mems_allowed_list:\t0\n"
            "1: numa-run: Slurm step 7.0 task 1: Slurm did not confine the step\n"
            "0: 0::/system.slice/numa1_slurmstepd.scope/job_7/step_0/user/task_0\n0: ready\n"
            "srun: error: not a task's line\n 1: Cpus_allowed_list:\t4-5\n")
    tasks = parse_tasks(text)
    assert tasks[0] == {"job": "7", "node": "numa1", "pid": 301, "ready": True,
                        "status": "Cpus_allowed_list:\t2-3\nMems_allowed_list:\t0\n",
                        "cgroup": "/system.slice/numa1_slurmstepd.scope/job_7/step_0/user/task_0"}
    assert tasks[1] == {"job": "7", "node": "numa2", "pid": 402, "ready": False,
                        "status": "Cpus_allowed_list:\t4-5\n"}


def test_every_per_node_path_of_slurm_conf_names_the_node():
    conf = slurm_files("NodeName=numa[1-2] CPUs=8")["slurm.conf"]
    settings = dict(line.split("=", 1) for line in conf.splitlines() if "=" in line and " " not in line)
    for key in ("SlurmdSpoolDir", "SlurmdPidFile", "SlurmdLogFile"):
        assert "%n" in settings[key], key
    assert settings["SlurmctldHost"] == "numa1" and "NodeName=numa[1-2] CPUs=8" in conf.splitlines()


def test_the_runner_says_how_the_second_guest_ended(tmp_path, capsys):
    def run_in_guest(shape, argv, timeout, *, cwd, out_dir, stream):
        return GuestResult(shape, tuple(argv), 0, False, b"PASS cluster-srun slurm2\n", b"", 5.0, 60.0, 65.0, 1,
                           peers=("guest 1: its command exited 0",))
    runner.main(["--shape", "slurm2", "--scenario", "cluster-srun", "--out-dir", str(tmp_path)],
                run_in_guest=run_in_guest, venv_check=lambda: None)
    assert "vm-e2e: slurm2 guest 1: its command exited 0" in capsys.readouterr().err
