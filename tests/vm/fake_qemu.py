"""Stands in for qemu-system-x86_64 in the harness's own tests: plays one guest per call.

FAKE_QEMU_MODES is a comma-separated list, one mode per boot of the same job:
  ok     mark started, run job.sh on the host with the job's timeout, record the result
  hang   print a few console lines and never start the command
  exit   fail like QEMU refusing its arguments
  die    mark started, then stop without an exit status (a guest that panicked)
  stuck  mark started, then never power off (the host must stop it)
FAKE_QEMU_PEER_MODES, when set, gives the second guest of a two-guest shape its own modes.
"""

import os
import subprocess
import sys
import time
from pathlib import Path


def option(args, flag, prefix):
    for i, arg in enumerate(args[:-1]):
        if arg == flag and args[i + 1].startswith(prefix):
            return args[i + 1]
    raise SystemExit(f"fake qemu: no {flag} {prefix}...")


def main(args):
    job = Path(dict(kv.split("=", 1) for kv in option(args, "-fsdev", "local,id=job,").split(",")[1:])["path"])
    console = Path(option(args, "-serial", "file:")[len("file:"):])
    boots = int((job / "fake_boots").read_text()) if (job / "fake_boots").exists() else 0
    (job / "fake_boots").write_text(str(boots + 1))
    modes = os.environ["FAKE_QEMU_MODES"]
    if job.name.endswith("-guest1"):
        modes = os.environ.get("FAKE_QEMU_PEER_MODES", modes)
    mode = modes.split(",")[boots]
    init = (job / "init").read_text().strip() if (job / "init").exists() else "none"
    console.write_text(f"fake kernel boot {boots + 1}\nfake: mode {mode}\nfake: init {init}\n")
    if mode == "exit":
        print("qemu-system-x86_64: -device nvme: fake refusal", file=sys.stderr)
        return 1
    if mode == "hang":
        time.sleep(3600)
    (job / "started").write_text("1.0\n")
    if mode == "die":
        return 0
    if mode == "stuck":
        time.sleep(3600)
    timeout = int((job / "timeout").read_text())
    with open(job / "stdout", "wb") as out, open(job / "stderr", "wb") as err:
        proc = subprocess.Popen(["/bin/sh", str(job / "job.sh")], stdout=out, stderr=err,
                                stdin=subprocess.DEVNULL)
        try:
            rc = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            (job / "timed_out").write_text("timeout\n")
            proc.kill()
            rc = 128 + 9
    (job / "exit_code").write_text(f"{rc}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
