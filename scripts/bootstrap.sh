#!/usr/bin/env bash
# Make .venv with the project and its test extra installed (reinstalling only
# when pyproject.toml changed) and put .venv/bin on PATH. Sourced by
# scripts/agent and scripts/test, and by people: `source scripts/bootstrap.sh`
# in an interactive shell. So it changes no shell option of its caller (no
# `set -e` that would close the terminal on the next failing command) and
# returns non-zero instead of exiting when the set-up fails.
# This file's path: bash's BASH_SOURCE; zsh has none, but its $0 names the sourced file
# (here, outside any function, where zsh's $0 would name the function).
_numa_agent_source="${BASH_SOURCE[0]:-$0}"
_numa_agent_bootstrap() {
    local want
    ROOT="$(cd "$(dirname "$_numa_agent_source")/.." && pwd)" || return 1
    VENV="$ROOT/.venv"
    local stamp="$VENV/.installed-from"
    want="$(sha256sum "$ROOT/pyproject.toml" | cut -d' ' -f1)" || return 1
    if [ ! -x "$VENV/bin/python" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
        echo "numa-agent: setting up $VENV (first run or pyproject.toml changed), 3 steps" >&2
        echo "numa-agent: 1/3 making the venv (python3 -m venv)" >&2
        python3 -m venv "$VENV" || return 1
        echo "numa-agent: 2/3 upgrading pip" >&2
        "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade pip >&2 || return 1
        echo "numa-agent: 3/3 installing numa-agent (editable) and its test tools; pip's progress follows" >&2
        # setuptools warns on every editable install of a package at the top of the
        # repository (a numa_agent/ folder in the working directory is imported first):
        # here that folder is the package itself, so the warning says nothing.
        PYTHONWARNINGS="ignore:Editable installation" \
            "$VENV/bin/python" -m pip install --disable-pip-version-check -e "$ROOT[test]" >&2 || return 1
        echo "$want" > "$stamp"
        echo "numa-agent: $VENV is ready" >&2
    fi
    case ":$PATH:" in
        *":$VENV/bin:"*) ;;
        *) export PATH="$VENV/bin:$PATH" ;;
    esac
}
_numa_agent_bootstrap
_numa_agent_status=$?
unset -f _numa_agent_bootstrap
unset _numa_agent_source
# shellcheck disable=SC2317  # `return` when sourced, `exit` when run
return "$_numa_agent_status" 2>/dev/null || exit "$_numa_agent_status"
