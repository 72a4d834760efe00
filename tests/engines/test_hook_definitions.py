"""The shipped hooks.d files: valid hooks 1.0.0 definitions (a broken one fails every container
on the host), matching exactly the numa-agent.io/ annotations, calling a stage the hook takes."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest

from numa_agent.cli.numa_agent import build_parser
from numa_agent.engines.annotations import KNOWN
from numa_agent.engines.oci_hook import CREATE_STAGES, RELEASE_STAGES

from .hook_schema import problems

ROOT = Path(__file__).resolve().parents[2]
HOOKS = sorted((ROOT / "oci" / "hooks.d").glob("*.json"))
INSTALLED_COMMAND = "/usr/local/bin/numa-agent"  # the link scripts/install makes


def load(path: Path) -> dict:
    return json.loads(path.read_text())


def test_both_stages_are_shipped():
    stages = {stage for path in HOOKS for stage in load(path)["stages"]}
    assert stages == {"createRuntime", "poststop"}, [p.name for p in HOOKS]


@pytest.mark.parametrize("path", HOOKS, ids=lambda p: p.name)
def test_a_shipped_hook_is_a_valid_definition(path):
    assert problems(load(path)) == []


@pytest.mark.parametrize("path", HOOKS, ids=lambda p: p.name)
def test_a_shipped_hook_runs_the_installed_command_at_its_own_stage(path):
    doc = load(path)
    assert doc["hook"]["path"] == INSTALLED_COMMAND
    argv0, *args = doc["hook"]["args"]
    assert argv0 == "numa-agent"
    parsed = build_parser().parse_args(args)
    assert parsed.command == "oci-hook"
    assert doc["stages"] == [parsed.stage]
    assert parsed.stage in CREATE_STAGES + RELEASE_STAGES
    # The client waits for a restarting agent; the engine must not kill the hook first.
    assert doc["hook"]["timeout"] >= 60


@pytest.mark.parametrize("path", HOOKS, ids=lambda p: p.name)
def test_a_shipped_hook_matches_our_annotations_and_no_other(path):
    (key, value), = load(path)["when"]["annotations"].items()
    matches = [a for a in [*KNOWN, "numa-agent.io/hugepages-2Mi", "numa-agent.io/typo"] if re.search(key, a)]
    assert len(matches) == len(KNOWN) + 2 and re.search(value, "")
    for other in ("io.podman.annotations.init", "numa-agentXio/cpus", "example.com/numa-agent.io/cpus"):
        assert not re.search(key, other), other


# The checker itself: each of these breaks a definition the way a hand edit could.
BROKEN = [
    (lambda d: d.update(version="1.0"), "version"),
    (lambda d: d["hook"].update(path="numa-agent"), "hook.path"),
    (lambda d: d["hook"].update(args="oci-hook"), "hook.args"),
    (lambda d: d["hook"].update(env=["NO_EQUALS"]), "hook.env"),
    (lambda d: d["hook"].update(timeout=0), "hook.timeout"),
    (lambda d: d["hook"].update(timeout="10"), "hook.timeout"),
    (lambda d: d.update(when={}), "no condition"),
    (lambda d: d.update(when={"annotations": {"^numa-agent\\.io/(": ".*"}}), "does not compile"),
    (lambda d: d.update(when={"annotations": {"^x": "[a-"}}), "does not compile"),
    (lambda d: d.update(when={"commands": ["("]}), "does not compile"),
    (lambda d: d.update(when={"always": "yes"}), "when.always"),
    (lambda d: d.update(when={"hasBindMounts": 1}), "when.hasBindMounts"),
    (lambda d: d.update(when={"annotation": {"a": "b"}}), "unknown condition"),
    (lambda d: d.update(stages=["createruntime"]), "not an OCI stage"),
    (lambda d: d.update(stages=[]), "stages"),
    (lambda d: d.update(stage=["poststop"]), "unknown field"),
    (lambda d: d.pop("hook"), "hook: not an object"),
]


@pytest.mark.parametrize("breaking,says", BROKEN)
def test_the_checker_catches_a_broken_definition(breaking, says):
    doc = copy.deepcopy(load(HOOKS[0]))
    breaking(doc)
    found = problems(doc)
    assert any(says in p for p in found), found
