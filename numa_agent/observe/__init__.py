"""Watching what the agent handed out: tasks on exclusive CPUs that belong to
no workload (intruders), and where each workload's memory lies per NUMA node.
`model.py` is pure; `procfs.py` reads /proc and the cgroup tree; `watcher.py`
runs the intruder scan on its own timer."""
