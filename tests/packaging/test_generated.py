"""The man pages and completions are generated from the parsers (numa_agent/cli/docgen.py)
and checked in: they must be what `scripts/gen-docs` writes today, and must work."""

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from numa_agent.cli.docgen import generated_files, render_man_page, roff_escape, split_sections

REPO = Path(__file__).resolve().parents[2]
ZSH = shutil.which("zsh")


def test_checked_in_files_are_what_the_parsers_generate():
    stale = [rel for rel, text in generated_files(REPO).items()
             if not (REPO / rel).exists() or (REPO / rel).read_text() != text]
    assert stale == [], f"out of date, run scripts/gen-docs: {stale}"


def test_gen_docs_check_finds_a_stale_page_and_writing_makes_it_current(tmp_path):
    # What scripts/gen-docs runs (in the repository's venv), here on a copy of the sources.
    for name in ("numa_agent", "docs", "completions"):
        shutil.copytree(REPO / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__"))
    prose = tmp_path / "docs/man/numa-run.1.in"
    prose.write_text(prose.read_text().replace(".SH ENVIRONMENT", ".SH ENVIRONMENT\nA new sentence."))
    gen = [sys.executable, "-m", "numa_agent.cli.docgen"]

    def run(*args):
        return subprocess.run([*gen, *args], cwd=tmp_path, capture_output=True, text=True, timeout=120)

    check = run("--check")
    assert check.returncode == 1 and check.stdout == "out of date: docs/man/numa-run.1\n", check.stderr
    write = run()
    assert write.returncode == 0 and write.stdout == "wrote: docs/man/numa-run.1\n", write.stderr
    assert "A new sentence." in (tmp_path / "docs/man/numa-run.1").read_text()
    assert run("--check").returncode == 0


def test_gen_docs_script_checks_the_repository():
    out = subprocess.run([str(REPO / "scripts/gen-docs"), "--check"], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0 and out.stdout == "", out.stdout + out.stderr


def test_roff_escape_guards_control_lines_and_minus_signs():
    assert roff_escape(".hidden\n'also\n--cpus a\\b") == "\\&.hidden\n\\&\\(aqalso\n\\-\\-cpus a\\eb"


def test_prose_may_not_replace_a_generated_section():
    with pytest.raises(ValueError, match="OPTIONS"):
        split_sections(".SH NAME\nx \\- y\n.SH OPTIONS\nhand-written\n")


def test_page_merges_prose_and_options_in_man_pages_order():
    parser = argparse.ArgumentParser(prog="demo")
    parser.add_argument("--level", metavar="N", help="how much (default %(default)s)", default=3)
    page = render_man_page(parser, "1", "User Commands",
                           '.SH "SEE ALSO"\nother(1)\n.SH NAME\ndemo \\- a demo\n.SH DESCRIPTION\nWords.\n')
    heads = [line for line in page.splitlines() if line.startswith(".SH")]
    assert heads == [".SH NAME", ".SH SYNOPSIS", ".SH DESCRIPTION", ".SH OPTIONS", '.SH "SEE ALSO"']
    assert "\\fB\\-\\-level\\fR \\fIN\\fR\nhow much (default 3)" in page


def test_numa_agent_page_names_every_command_and_its_options():
    from numa_agent.cli.numa_agent import build_parser

    page = (REPO / "docs/man/numa-agent.8").read_text().replace("\\-", "-")
    subs = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    assert sorted(subs.choices) == ["check-config", "explain", "export", "oci-hook", "pod-resources", "release",
                                   "resize", "serve", "slurm-node", "status", "topology"]
    for name, sub in subs.choices.items():
        section = page.split(f".SS {name}\n", 1)[1].split(".SS ", 1)[0]
        # each option by the name its synopsis shows (an alias such as numactl's older
        # --cpubind is listed with it under OPTIONS)
        shown = {a.option_strings[-1] for a in sub._actions if a.option_strings} - {"--help"}
        missing = sorted(o for o in shown if o not in section)
        assert missing == [], f"{name}: {missing}"


def _bash_complete(prog: str, words: list[str]) -> list[str]:
    script = (f'source completions/bash/{prog}; fn=$(complete -p {prog} | sed -E "s/.* -F ([^ ]+) .*/\\1/"); '
              f'COMP_WORDS=({" ".join(words)}); COMP_CWORD={len(words) - 1}; '
              f'COMP_LINE="${{COMP_WORDS[*]}}"; COMP_POINT=${{#COMP_LINE}}; '
              f'$fn {prog} "${{COMP_WORDS[-1]}}" "${{COMP_WORDS[-2]}}"; printf "%s\\n" "${{COMPREPLY[@]}}"')
    out = subprocess.run(["bash", "-c", script], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return sorted(out.stdout.split())


def test_bash_completes_options_subcommands_and_choices():
    assert _bash_complete("numa-run", ["numa-run", "--iso"]) == ["--isolate", "--isolate-strict"]
    assert _bash_complete("numa-run", ["numa-run", "--policy", "s"]) == ["single-numa-node"]
    assert _bash_complete("numa-agent", ["numa-agent", "st"]) == ["status"]
    assert _bash_complete("numa-agent", ["numa-agent", "serve", "--state"]) == ["--state-dir"]
    # Paths where an option takes one: a directory for --state-dir, any file for --config.
    assert _bash_complete("numa-agent", ["numa-agent", "serve", "--state-dir", "sys"]) == ["systemd"]
    assert _bash_complete("numa-agent", ["numa-agent", "serve", "--config", "systemd/config"]) == \
        ["systemd/config.example.toml"]


@pytest.mark.skipif(ZSH is None, reason="zsh not installed (Debian package: zsh)")
@pytest.mark.parametrize("prog", ["numa-agent", "numa-run"])
def test_zsh_completion_parses(prog):
    out = subprocess.run([ZSH, "-n", str(REPO / f"completions/zsh/_{prog}")], capture_output=True, text=True)
    assert out.returncode == 0 and out.stderr == "", out.stderr
