"""`numa-agent check-config`: a file checked as `serve` reads it, nothing started:
"ok" and exit 0, or the one-line error and exit 78."""

import subprocess
import sys

import pytest

EX_CONFIG = 78


def check(*args):
    return subprocess.run([sys.executable, "-m", "numa_agent.cli.numa_agent", "check-config", *args],
                          capture_output=True, text=True, timeout=60)


def test_a_good_file_is_ok_and_nothing_is_started(tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[agent]\nsocket = "{tmp_path}/run/agent.sock"\nstate_dir = "{tmp_path}/state"\n'
                   '[quotas]\ndefault = { cpus = 4 }\n')
    r = check("--config", str(cfg))
    assert (r.returncode, r.stdout, r.stderr) == (0, "ok\n", "")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.toml"]  # no socket, no state directory


@pytest.mark.parametrize("text,needle", [
    ('[agent]\nreserved_cpus = "0"\n', "unknown key agent.reserved_cpus: did you mean cpu_manager.reserved_cpus?"),
    ('[topology_manager]\npolicy = "strict"\n', "topology_manager.policy: 'strict' is not one of"),
    ('[quotas]\nusers.no-such-user-q36 = { cpus = 1 }\n', "quotas.users.no-such-user-q36: no "),
    ('[isolation]\ngroup = "no-such-group-q36"\n', "isolation.group: no group named 'no-such-group-q36'"),
    ("[agent\n", "not valid TOML"),
])
def test_a_bad_file_is_one_line_and_exit_78(tmp_path, text, needle):
    cfg = tmp_path / "c.toml"
    cfg.write_text(text)
    r = check("--config", str(cfg))
    assert r.returncode == EX_CONFIG and r.stdout == ""
    assert r.stderr.count("\n") == 1 and r.stderr.startswith(f"numa-agent: {cfg}: ") and needle in r.stderr, r.stderr


def test_a_missing_or_endless_file_is_refused(tmp_path):
    r = check("--config", str(tmp_path / "none.toml"))
    assert (r.returncode, r.stderr) == (EX_CONFIG, f"numa-agent: config file {tmp_path / 'none.toml'} does not exist\n")
    r = check("--config", "/dev/zero")
    assert (r.returncode, r.stderr) == (EX_CONFIG, "numa-agent: config file /dev/zero is a character device, "
                                                   "not a regular file\n")


def test_dev_null_is_the_empty_file_it_always_was():
    """`--config /dev/null`: no file, every default (as `ssh -F /dev/null`); any other
    device is still refused above."""
    r = check("--config", "/dev/null")
    assert (r.returncode, r.stdout, r.stderr) == (0, "ok\n", "")
