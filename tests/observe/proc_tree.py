"""Written /proc trees: tasks with the stat, status, cgroup and environ files
the intruder scan reads (only the fields it uses are meaningful)."""

from __future__ import annotations

from pathlib import Path

KTHREAD = 0x00200000


def stat_line(pid: int, tid: int, comm: str, cpu: int, *, flags: int = 0x400000,
              start_time: int = 1000, ppid: int = 1) -> str:
    # Fields 3..52 of stat(5); field 9 flags, 22 starttime, 39 processor.
    rest = ["S", str(ppid)] + ["0"] * 4 + [str(flags)] + ["0"] * 12 + [str(start_time)]
    rest += ["0"] * (36 - len(rest)) + [str(cpu)] + ["0"] * 13
    return f"{tid} ({comm}) " + " ".join(rest) + "\n"


def add_task(proc: Path, pid: int, tid: int, comm: str, cpu: int, allowed: str, *,
             cgroup: str = "/", kernel: bool = False, start_time: int = 1000,
             env: dict[str, str] | None = None, uid: int = 1000) -> None:
    task = proc / str(pid) / "task" / str(tid)
    task.mkdir(parents=True, exist_ok=True)
    task.joinpath("stat").write_text(stat_line(pid, tid, comm, cpu, start_time=start_time,
                                               flags=KTHREAD if kernel else 0x400000))
    status = (f"Name:\t{comm}\nPid:\t{tid}\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\nCpus_allowed:\tff\n"
              f"Cpus_allowed_list:\t{allowed}\nMems_allowed_list:\t0-1\n")
    task.joinpath("status").write_text(status)
    if tid == pid:
        (proc / str(pid) / "status").write_text(status)
    (proc / str(pid) / "cgroup").write_text(f"0::{cgroup}\n")
    (proc / str(pid) / "environ").write_bytes(
        b"".join(f"{k}={v}\0".encode() for k, v in (env or {"PATH": "/bin"}).items()))
