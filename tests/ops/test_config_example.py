"""The shipped sample config must load, and what it shows must be the defaults."""

import re
from pathlib import Path

from numa_agent.service.config import AgentConfig, load_config

EXAMPLE = Path(__file__).resolve().parents[2] / "systemd" / "config.example.toml"


def test_example_loads_and_shows_the_defaults():
    assert load_config(EXAMPLE, required=True) == AgentConfig()


def test_commented_examples_are_valid_when_enabled(tmp_path):
    # Uncomment every "# key = value" / "# [table]" line: the hints must be real syntax.
    lines = []
    for line in EXAMPLE.read_text().splitlines():
        m = re.match(r"^# ((\[\[?[a-z_.]+\]\]?)|([\"A-Za-z_0-9-]+ = .+))$", line)
        lines.append(m.group(1) if m else line)
    enabled = tmp_path / "config.toml"
    enabled.write_text("\n".join(lines) + "\n")
    cfg = load_config(enabled, required=True)
    assert cfg.socket_group == "numa"
    assert cfg.policy.reserved_cpus == "0,32"
    assert cfg.policy.reserved_memory == {0: {"memory": 1 << 30, "hugepages-2048kB": 0}}
    assert cfg.policy.cpu_options == {"full-pcpus-only": "true"}
    assert set(cfg.policy.devices) == {"gpu", "nic"}
    assert cfg.policy.devices["nic"] == {"driver": "mlx5_core"}
