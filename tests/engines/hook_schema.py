"""The OCI hooks.d 1.0.0 format (containers' oci-hooks(5)), checked field by field: a broken
file in hooks.d makes every container on the host fail, so none may ship."""

from __future__ import annotations

import re
from typing import Any

# The OCI runtime spec's stages (podman and CRI-O run these from hooks.d).
OCI_STAGES = ("prestart", "createRuntime", "createContainer", "startContainer", "poststart", "poststop")
WHEN_KEYS = ("always", "annotations", "commands", "hasBindMounts")


def _regex(value: Any, where: str) -> list[str]:
    if not isinstance(value, str):
        return [f"{where}: {value!r} is not a string"]
    try:
        re.compile(value)
    except re.error as exc:
        return [f"{where}: regex {value!r} does not compile: {exc}"]
    return []


def _hook(hook: Any) -> list[str]:
    if not isinstance(hook, dict):
        return ["hook: not an object"]
    problems = [f"hook: unknown field {k!r}" for k in hook if k not in ("path", "args", "env", "timeout")]
    path = hook.get("path")
    if not isinstance(path, str) or not path.startswith("/"):
        problems.append(f"hook.path: {path!r} is not an absolute path")
    args = hook.get("args", [])
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        problems.append(f"hook.args: {args!r} is not a list of strings")
    env = hook.get("env", [])
    if not isinstance(env, list) or not all(isinstance(e, str) and "=" in e for e in env):
        problems.append(f"hook.env: {env!r} is not a list of NAME=VALUE strings")
    if "timeout" in hook:
        timeout = hook["timeout"]
        if not isinstance(timeout, int) or isinstance(timeout, bool) or timeout <= 0:
            problems.append(f"hook.timeout: {timeout!r} is not a whole number of seconds above 0")
    return problems


def _when(when: Any) -> list[str]:
    if not isinstance(when, dict):
        return ["when: not an object"]
    problems = [f"when: unknown condition {k!r}" for k in when if k not in WHEN_KEYS]
    if not any(k in when for k in WHEN_KEYS):
        problems.append("when: no condition (always, annotations, commands or hasBindMounts)")
    for key in ("always", "hasBindMounts"):
        if key in when and not isinstance(when[key], bool):
            problems.append(f"when.{key}: {when[key]!r} is not a boolean")
    if "annotations" in when:
        annotations = when["annotations"]
        if not isinstance(annotations, dict) or not annotations:
            problems.append(f"when.annotations: {annotations!r} is not a map of regex to regex")
        else:
            for key, value in annotations.items():
                problems += _regex(key, "when.annotations key") + _regex(value, f"when.annotations[{key!r}]")
    if "commands" in when:
        commands = when["commands"]
        if not isinstance(commands, list) or not commands:
            problems.append(f"when.commands: {commands!r} is not a list of regexes")
        else:
            for i, command in enumerate(commands):
                problems += _regex(command, f"when.commands[{i}]")
    return problems


def problems(doc: Any) -> list[str]:
    """What makes `doc` (a parsed hooks.d file) not a valid hook definition; empty when it is one."""
    if not isinstance(doc, dict):
        return ["not a JSON object"]
    found = [f"unknown field {k!r}" for k in doc if k not in ("version", "hook", "when", "stages")]
    if doc.get("version") != "1.0.0":
        found.append(f"version: {doc.get('version')!r}, expected '1.0.0'")
    found += _hook(doc.get("hook"))
    found += _when(doc.get("when"))
    stages = doc.get("stages")
    if not isinstance(stages, list) or not stages:
        found.append(f"stages: {stages!r} is not a non-empty list")
    else:
        found += [f"stages: {s!r} is not an OCI stage ({', '.join(OCI_STAGES)})" for s in stages
                  if s not in OCI_STAGES]
    return found
