"""`numa-agent check-config [--config FILE]`: validate a configuration file as
`serve` would read it, without starting anything (as `nginx -t`)."""

from __future__ import annotations

import argparse

from numa_agent.cli.serve_cmd import EX_CONFIG


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "check-config", help="validate a config file without starting the agent",
        description="Read the configuration file as `numa-agent serve` does (its keys, values, and the "
                    "users and groups it names) and start nothing: print \"ok\" and exit 0, or print the "
                    "one-line error and exit 78 (EX_CONFIG). What only a start can judge (the machine, "
                    "the directories and sockets) is not checked.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n"
               "  numa-agent check-config\n"
               "  numa-agent check-config --config /etc/numa-agent/config.toml.new && \\\n"
               "      mv /etc/numa-agent/config.toml.new /etc/numa-agent/config.toml && systemctl reload numa-agent\n")
    p.add_argument("--config", metavar="FILE",
                   help="the TOML config file to check (default /etc/numa-agent/config.toml; it must exist)")
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    from numa_agent.cli.serve_cmd import effective_config, refused
    from numa_agent.daemon.config import DEFAULT_CONFIG, ConfigError

    try:
        effective_config(argparse.Namespace(config=args.config or DEFAULT_CONFIG))
    except ConfigError as exc:
        return refused(exc, EX_CONFIG)
    print("ok")
    return 0
