"""The [nri] section: its defaults, its checks (one line naming the key, exit 78 from
check-config), "did you mean" for its keys, and that a change waits for a restart."""

from __future__ import annotations

from dataclasses import replace

import pytest

from numa_agent.cli import numa_agent as cli
from numa_agent.daemon.config import AgentConfig, ConfigError, changed_keys, config_from_mapping, load_config
from numa_agent.daemon.startup import RELOADABLE
from numa_agent.nri import plugin


def test_nri_is_off_by_default_with_containerds_socket_and_index_10():
    cfg = AgentConfig()
    assert (cfg.nri_enabled, cfg.nri_socket, cfg.nri_plugin_name, cfg.nri_plugin_index) == \
        (False, plugin.DEFAULT_SOCKET, "numa-agent", "10")
    plugin.check_index(cfg.nri_plugin_index)


def test_the_nri_section_is_read():
    cfg = config_from_mapping({"nri": {"enabled": True, "socket": "/run/crio/nri.sock", "plugin_name": "numa.agent_2",
                                       "plugin_index": "05"}})
    assert (cfg.nri_enabled, cfg.nri_socket, cfg.nri_plugin_name, cfg.nri_plugin_index) == \
        (True, "/run/crio/nri.sock", "numa.agent_2", "05")


@pytest.mark.parametrize(("section", "message"), [
    ({"plugin_index": 5}, 'nri.plugin_index: 5 is a number; write the index as two digits in quotes, e.g. "05"'),
    ({"plugin_index": "5"}, "nri.plugin_index: '5' is not two digits"),
    ({"plugin_index": "100"}, "nri.plugin_index: '100' is not two digits"),
    ({"plugin_index": "١٢"}, "nri.plugin_index: '١٢' is not two digits"),
    ({"plugin_name": "numa agent"}, "nri.plugin_name: 'numa agent' is not a plugin name"),
    ({"plugin_name": "../x"}, "nri.plugin_name: '../x' is not a plugin name"),
    ({"plugin_name": ""}, "nri.plugin_name: '' is not a plugin name"),
    ({"socket": "nri.sock"}, "nri.socket: 'nri.sock' is not an absolute path"),
    ({"enabled": "yes"}, "nri.enabled: expected `bool`, got `str`"),
    ({"enable": True}, "unknown key nri.enable: did you mean nri.enabled?"),
])
def test_a_bad_nri_value_is_one_line_naming_the_key(section, message):
    with pytest.raises(ConfigError) as e:
        config_from_mapping({"nri": section})
    assert str(e.value).startswith(message) and "\n" not in str(e.value)


def test_an_nri_key_in_the_wrong_section_names_the_one_meant():
    with pytest.raises(ConfigError, match=r"^unknown key agent.plugin_index: did you mean nri.plugin_index\?"):
        config_from_mapping({"agent": {"plugin_index": "10"}})


def test_check_config_refuses_a_bad_nri_key_with_exit_78(tmp_path, capsys):
    path = tmp_path / "config.toml"
    path.write_text('[nri]\nenabled = true\nplugin_index = "1"\n')
    assert cli.main(["check-config", "--config", str(path)]) == 78
    err = capsys.readouterr().err.strip()
    assert "nri.plugin_index: '1' is not two digits" in err and "\n" not in err
    path.write_text('[nri]\nenabled = true\nplugin_index = "01"\n')
    assert cli.main(["check-config", "--config", str(path)]) == 0
    assert load_config(path, required=True).nri_plugin_index == "01"


def test_a_changed_nri_key_is_named_as_needing_a_restart():
    old = AgentConfig()
    new = replace(old, nri_enabled=True, nri_socket="/run/other.sock", nri_plugin_name="x", nri_plugin_index="11")
    changed = changed_keys(old, new)
    assert [key for _, key in changed] == ["nri.enabled", "nri.socket", "nri.plugin_name", "nri.plugin_index"]
    assert not {field for field, _ in changed} & RELOADABLE
