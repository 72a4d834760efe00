#!/usr/bin/env bash
# Sourced by scripts/agent and scripts/test: make .venv with the project and
# its test extra installed, reinstalling only when pyproject.toml changed.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
STAMP="$VENV/.installed-from"
want="$(sha256sum "$ROOT/pyproject.toml" | cut -d' ' -f1)"
if [ ! -x "$VENV/bin/python" ] || [ "$(cat "$STAMP" 2>/dev/null)" != "$want" ]; then
    echo "numa-agent: setting up $VENV (first run or pyproject.toml changed)..." >&2
    python3 -m venv "$VENV"
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade pip >&2
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -e "$ROOT[test]" >&2
    echo "$want" > "$STAMP"
fi
export PATH="$VENV/bin:$PATH"
