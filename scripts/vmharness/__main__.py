"""`scripts/vm` command line: setup, shapes, run."""

from __future__ import annotations

import argparse
import sys

from .boot import TIMED_OUT_STATUS, GuestError, run_in_guest
from .build import SetupError, ensure_guest_image
from .shapes import SHAPES, ShapeError

NO_GUEST_STATUS = 3  # the guest gave no result: never booted, died, or could not be prepared


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="scripts/vm", description="Boot a multi-NUMA QEMU guest whose root is this host's root, "
                                       "and run one command in it.")
    sub = parser.add_subparsers(dest="action", required=True)
    setup = sub.add_parser("setup", help="install host packages, fetch the kernel, build the initramfs")
    setup.add_argument("--refresh", action="store_true", help="switch to the newest kernel apt lists")
    sub.add_parser("shapes", help="list the machine shapes")
    run = sub.add_parser("run", help="boot a shape and run COMMAND in it (cwd and environment are ours)",
                         epilog="Exit status: the command's own; 124 if it timed out; 3 if the guest "
                                "never ran it (two boots hung) or died while it ran.")
    run.add_argument("--shape", default="2node", help=f"one of {', '.join(SHAPES)} (default 2node)")
    run.add_argument("--timeout", type=float, default=600, help="seconds the command may run (default 600)")
    run.add_argument("--boot-timeout", type=float, default=180,
                     help="seconds a boot may take to reach the command before it is retried (default 180)")
    run.add_argument("--out-dir", help="host directory mounted read-write in the guest at $NUMA_AGENT_VM_OUT")
    run.add_argument("--keep", action="store_true", help="keep the job folder (console log, job script)")
    run.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    run.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARGS...]")
    args = parser.parse_args(argv)

    try:
        if args.action == "setup":
            image = ensure_guest_image(refresh=args.refresh)
            print(f"kernel {image.kernel_version}\nvmlinux {image.vmlinux}\ninitramfs {image.initrd}")
            return 0
        if args.action == "shapes":
            for shape in SHAPES.values():
                nodes = ", ".join(f"node{n}: {len(c)} CPUs" for n, c in shape.expected_node_cpus().items())
                print(f"{shape.name:8} {shape.description} [{nodes}]")
            return 0
        command = args.command[1:] if args.command[:1] == ["--"] else args.command
        if not command:
            parser.error("run needs a command: scripts/vm run --shape 2node -- COMMAND [ARGS...]")
        result = run_in_guest(args.shape, command, args.timeout, boot_timeout=args.boot_timeout,
                              out_dir=args.out_dir, stream=True, keep_job_dir=args.keep, quiet=args.quiet)
    except (ShapeError, ValueError) as exc:
        print(f"vm: {exc}", file=sys.stderr)
        return 2
    except SetupError as exc:
        print(f"vm: set-up failed: {exc}", file=sys.stderr)
        return NO_GUEST_STATUS
    except GuestError as exc:
        print(f"vm: {exc}", file=sys.stderr)
        return NO_GUEST_STATUS
    if result.job_dir is not None:
        print(f"vm: job folder kept: {result.job_dir}", file=sys.stderr)
    if result.timed_out:
        print(f"vm: the command did not finish within {args.timeout:g} s in the {args.shape} guest and was "
              f"killed (exit {TIMED_OUT_STATUS})", file=sys.stderr)
    return result.returncode


if __name__ == "__main__":
    sys.exit(main())
