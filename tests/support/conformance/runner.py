"""Runs kubelet conformance vector files (the schema of
tests/fixtures/conformance/kubelet-vectors.json) through the real code.

Every list-valued top-level key is a section of cases; each known section
maps to a function ``(case, document) -> None | failure line`` in
``merge_sections.SECTIONS`` or ``cpu_sections.SECTIONS``. Sections nobody
knows are reported as failures, never skipped silently.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Callable, Iterable

from tests.support.conformance import merge_sections

# Top-level keys that describe the file rather than hold cases.
METADATA_KEYS = ("schema_version", "provenance", "conventions", "topologies", "numa_distances")
# The CPU manager's sections, reported as failed if their module is missing.
CPU_SECTION_NAMES = ("cpu_take_by_topology_packed", "cpu_take_by_topology_numa_distributed",
                     "cpu_static_policy_topology_hints")


class ConformanceFileError(Exception):
    """A vector file that cannot be read or is not in the vectors' schema."""


def load(path: str | Path) -> dict:
    path = Path(path)
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConformanceFileError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConformanceFileError(f"{path}: not valid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise ConformanceFileError(f"{path}: top level must be a JSON object of sections")
    for key, value in doc.items():
        if isinstance(value, list) and not all(isinstance(c, dict) for c in value):
            raise ConformanceFileError(f"{path}: section {key!r} must be a list of case objects")
    return doc


def _sections() -> tuple[dict[str, Callable], str | None]:
    sections = dict(merge_sections.SECTIONS)
    try:
        cpu = importlib.import_module("tests.support.conformance.cpu_sections")
    except ImportError as exc:
        return sections, f"CPU sections unavailable ({exc})"
    sections.update(cpu.SECTIONS)
    return sections, None


def run(paths: Iterable[str | Path]) -> tuple[int, int, list[str]]:
    """Run every case of every file; returns (passed, failed, report lines).
    The last line is always ``N passed, M failed``. Raises
    ConformanceFileError for a file that cannot be loaded."""
    docs = [(str(p), load(p)) for p in paths]
    sections, cpu_problem = _sections()
    passed = failed = 0
    lines: list[str] = []
    for path, doc in docs:
        for key, cases in doc.items():
            if not isinstance(cases, list) or key in METADATA_KEYS:
                continue
            handler = sections.get(key)
            if handler is None:
                why = cpu_problem if key in CPU_SECTION_NAMES and cpu_problem else "unknown section"
                failed += len(cases)
                lines.append(f"FAIL {path}: {key}: {why}; {len(cases)} case(s) not run")
                continue
            for index, case in enumerate(cases):
                case_id = case.get("id", f"{key}[{index}]")
                try:
                    problem = handler(case, doc)
                except Exception as exc:  # a crash in one case must not hide the others
                    problem = f"raised {type(exc).__name__}: {exc}"
                if problem is None:
                    passed += 1
                else:
                    failed += 1
                    lines.append(f"FAIL {case_id} ({key}): {problem}")
    lines.append(f"{passed} passed, {failed} failed")
    return passed, failed, lines
