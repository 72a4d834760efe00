"""Every relative link in the project's Markdown resolves to a file in the checkout."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _markdown_files() -> list[Path]:
    out = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-co", "--exclude-standard", "*.md"],
                         check=True, capture_output=True, text=True).stdout
    return [ROOT / line for line in out.splitlines() if (ROOT / line).is_file()]


def relative_targets(text: str) -> list[str]:
    """The relative link targets of a Markdown text, without their #fragment, outside code."""
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    text = re.sub(r"`[^`\n]*`", "", text)
    found = []
    for target in LINK.findall(text):
        if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue  # a URL (http:, mailto:) or a place in the same page
        found.append(target.split("#", 1)[0])
    return found


def test_relative_targets_are_found_outside_code_only():
    text = "see [a](docs/a.md#x) and [b](https://e.org) `[c](no.md)`\n```\n[d](no.md)\n```\n[e](#top)"
    assert relative_targets(text) == ["docs/a.md"]


@pytest.mark.parametrize("page", _markdown_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page):
    missing = [t for t in relative_targets(page.read_text()) if not (page.parent / t).exists()]
    assert missing == [], f"{page.relative_to(ROOT)} links to missing {missing}"
