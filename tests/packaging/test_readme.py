"""The README and docs/ point only inside the repository, and the fixtures that came from
elsewhere say where from and under which licence."""

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
_LINK = re.compile(r"\]\(([^)\s]+)\)")
# A path of the repository as the README and docs/ write it (`scripts/test`), not a glob (`bench-*`).
_REPO_PATH = re.compile(r"(?<![\w./-])((?:scripts|docs|systemd|benchmarks|tests|numa_agent|completions|monitoring|contrib)/[\w./-]*)(?![\w./*<-])")
# A diff block shows files one would add (architecture.md's "A new resource"), not ones there are.
_DIFF_BLOCK = re.compile(r"^```diff\n.*?^```", re.S | re.M)


def broken_references(doc: Path) -> list[str]:
    text = doc.read_text()
    broken = []
    for target in _LINK.findall(text):
        if target.startswith("#"):
            continue
        path = (doc.parent / target.split("#", 1)[0]).resolve()
        if "://" in target or not path.is_relative_to(REPO) or not path.exists():
            broken.append(target)
    paths = _REPO_PATH.findall(_DIFF_BLOCK.sub("", text))
    broken += [p for p in paths if not (REPO / p.rstrip(".")).exists()]
    return sorted(set(broken + [name for name in ("DESIGN.md", "../") if name in text]))


def test_readme_and_docs_refer_only_to_what_the_repository_holds():
    assert {doc.name: broken_references(doc) for doc in DOCS} == {doc.name: [] for doc in DOCS}


def test_the_check_finds_a_missing_file_a_link_outside_and_design_md(tmp_path):
    doc = tmp_path / "README.md"
    doc.write_text("See [design](../DESIGN.md), [x](docs/nowhere.md) and `scripts/no-such-script`.\n")
    assert broken_references(doc) == ["../", "../DESIGN.md", "DESIGN.md", "docs/nowhere.md",
                                      "scripts/no-such-script"]


def test_the_check_reads_docs_pages_too_but_not_a_diff_of_files_to_add(tmp_path):
    doc = tmp_path / "docs" / "page.md"
    doc.parent.mkdir()
    doc.write_text("Run `scripts/no-such-script`.\n\n```diff\n+ numa_agent/new_module.py\n```\n")
    assert broken_references(doc) == ["scripts/no-such-script"]


def test_the_readme_is_a_guide_that_links_every_reference_page():
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= 300
    pages = [f"docs/{doc.name}" for doc in DOCS[1:]] + ["docs/man/numa-agent.8", "docs/man/numa-run.1", "CONTRIBUTING.md"]
    assert [page for page in pages if page not in _LINK.findall(readme)] == []


def test_fixtures_from_elsewhere_keep_their_origin_and_licence():
    sysfs = REPO / "tests/fixtures/sysfs"
    assert "SPDX-License-Identifier: BSD-3-Clause" in (sysfs / "LICENSE-hwloc-COPYING.txt").read_text()
    assert "LICENSE-hwloc-COPYING.txt" in (sysfs / "README.md").read_text()
    conformance = (REPO / "tests/fixtures/conformance/README.md").read_text()
    assert "Kubernetes Authors" in conformance and "Apache License 2.0" in conformance
    assert (REPO / "LICENSE").read_text().split()[:3] == ["Apache", "License", "Version"]
