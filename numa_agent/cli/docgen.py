"""The man pages and shell completions, generated from the argparse parsers.

The parsers are the one source of what each command accepts; a page's prose (NAME,
DESCRIPTION, FILES, ENVIRONMENT, EXIT STATUS, EXAMPLES, SEE ALSO) is written by hand
in docs/man/<page>.in and merged around the generated SYNOPSIS, COMMANDS and OPTIONS.
The results are checked in (docs/man/, completions/) so a checkout, the sdist and the
wheel carry them without this module's build-time dependency (shtab, for the
completions); `scripts/gen-docs` writes them again and tests/packaging checks they are
current.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable, Iterable
from pathlib import Path

from numa_agent import __version__

# page file name -> (the parser's module, the page's manual title)
MAN_PAGES = {
    "numa-agent.8": ("numa_agent.cli.numa_agent", "System Administration"),
    "numa-run.1": ("numa_agent.cli.numa_run", "User Commands"),
}
COMPLETION_SHELLS = ("bash", "zsh")
# Sections in the order man-pages(7) gives (the global options before the commands, as git(1)
# has them); prose may use any of them except the generated.
SECTION_ORDER = ("NAME", "SYNOPSIS", "DESCRIPTION", "OPTIONS", "COMMANDS", "ENVIRONMENT", "FILES",
                 "EXIT STATUS", "EXAMPLES", "SEE ALSO")
GENERATED_SECTIONS = ("SYNOPSIS", "COMMANDS", "OPTIONS")


# ------------------------------------------------------------------ roff, pure
def roff_escape(text: str) -> str:
    """Plain text as roff: backslashes and minus signs escaped, a line that would
    start with a control character guarded."""
    text = text.replace("\\", "\\e").replace("-", "\\-").replace("'", "\\(aq")
    return "\n".join("\\&" + line if line.startswith((".", "\\(aq")) else line
                     for line in text.splitlines())


def _bold(text: str) -> str:
    return f"\\fB{roff_escape(text)}\\fR"


def _italic(text: str) -> str:
    return f"\\fI{roff_escape(text)}\\fR"


def _metavar(action: argparse.Action) -> str:
    if action.metavar is not None:
        return str(action.metavar)
    if action.choices is not None:
        return "{" + ",".join(str(c) for c in action.choices) + "}"
    return action.dest.upper() if action.option_strings else action.dest


def _argument(action: argparse.Action) -> str:
    """The value part of an option or a positional, as argparse's usage shows it."""
    if action.nargs == 0:
        return ""
    name = _italic(_metavar(action))
    if action.nargs == "?":
        return f"[{name}]"
    if action.nargs == "*":
        return f"[{name} ...]"
    if action.nargs == "+":
        return f"{name} [{name} ...]"
    return name


def _expanded_help(action: argparse.Action, prog: str) -> str:
    # argparse's own %-expansion of help strings (%(default)s, %(prog)s, %(choices)s).
    help_text = action.help or ""
    if "%" not in help_text:
        return help_text
    params = {k: v for k, v in vars(action).items() if v is not argparse.SUPPRESS}
    params["prog"] = prog
    if params.get("choices") is not None:
        params["choices"] = ", ".join(str(c) for c in params["choices"])
    return help_text % params


def _visible(actions: Iterable[argparse.Action]) -> list[argparse.Action]:
    return [a for a in actions if a.help is not argparse.SUPPRESS
            and not isinstance(a, argparse._SubParsersAction)]


def _option_items(parser: argparse.ArgumentParser, with_help: bool = True) -> list[str]:
    """`.TP` items for every visible option and positional, under the parser's group titles."""
    lines: list[str] = []
    for group in parser._action_groups:
        actions = [a for a in _visible(group._group_actions)
                   if with_help or not isinstance(a, argparse._HelpAction)]
        if not actions:
            continue
        title = group.title or ""
        if title not in ("options", "optional arguments", "positional arguments"):
            lines.append(f'.SS "{roff_escape(title[:1].upper() + title[1:])}"')
        for action in actions:
            arg = _argument(action)
            if action.option_strings:
                head = ", ".join(_bold(o) + (f" {arg}" if arg else "") for o in action.option_strings)
            else:
                head = arg
            lines += [".TP", head, roff_escape(_expanded_help(action, parser.prog))]
    return lines


def _usage_line(parser: argparse.ArgumentParser, options: bool = True) -> str:
    """One synopsis line: the parser's own usage if it wrote one, else every visible
    option in brackets (or [OPTIONS] when not `options`) and the positionals. Each
    bracket is one unbreakable, unhyphenated word."""
    if parser.usage:
        usage = parser.usage.replace("%(prog)s", parser.prog)
        prog, _, rest = usage.partition(" ")
        return f"{_bold(prog)} {roff_escape(rest)}"
    words = [_bold(parser.prog).replace(" ", "\\ ")]
    if not options:
        words.append(f"[{_italic('OPTIONS')}]")
    for action in _visible(parser._actions):
        if isinstance(action, (argparse._HelpAction, argparse._VersionAction)):
            continue
        if not action.option_strings:
            words.append("\\%" + _argument(action))
        elif options:
            arg = _argument(action)
            words.append("\\%[" + _bold(action.option_strings[-1]) + (f"\\ {arg}" if arg else "") + "]")
    return " ".join(words)


def _subcommands(parser: argparse.ArgumentParser) -> list[tuple[str, argparse.ArgumentParser]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return list(action.choices.items())
    return []


def _generated_sections(parser: argparse.ArgumentParser) -> dict[str, list[str]]:
    subs = _subcommands(parser)
    # Left-adjusted: a justified synopsis spreads its brackets across the line.
    synopsis = [".ad l"]
    for _, sub in subs or [("", parser)]:
        if len(synopsis) > 1:
            synopsis.append(".br")
        synopsis.append(_usage_line(sub, options=not subs))
    synopsis.append(".ad")
    sections = {"SYNOPSIS": synopsis, "OPTIONS": _option_items(parser)}
    if subs:
        commands: list[str] = []
        for name, sub in subs:
            commands += [f".SS {name}", ".ad l", _usage_line(sub), ".ad", ".PP",
                         roff_escape(sub.description or ""), *_option_items(sub, with_help=False)]
        sections["COMMANDS"] = commands
    return sections


def split_sections(prose: str) -> dict[str, list[str]]:
    """Hand-written roff split at its `.SH` lines: section name -> its lines."""
    sections: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in prose.splitlines():
        if line.startswith(".SH "):
            name = line[4:].strip().strip('"')
            if name in GENERATED_SECTIONS or name not in SECTION_ORDER:
                raise ValueError(f"prose section {name!r}: not one of {SECTION_ORDER} less the generated "
                                 f"{GENERATED_SECTIONS}")
            current = sections.setdefault(name, [])
        elif current is None:
            if line.strip() and not line.startswith('.\\"'):
                raise ValueError(f"prose text before the first .SH: {line!r}")
        else:
            current.append(line)
    return sections


def render_man_page(parser: argparse.ArgumentParser, section: str, manual: str, prose: str) -> str:
    """The whole page: title, then the prose and generated sections in man-pages(7) order."""
    parts = {**split_sections(prose), **_generated_sections(parser)}
    lines = ['.\\" Generated by scripts/gen-docs from the argparse parser and '
             f'docs/man/{parser.prog}.{section}.in: edit those.',
             f'.TH {parser.prog.upper()} {section} "" "numa-agent {__version__}" "{manual}"']
    for name in SECTION_ORDER:
        if name in parts:
            lines += [f".SH {name}" if " " not in name else f'.SH "{name}"', *parts[name]]
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------ the shipped files
def _parser(module_name: str) -> argparse.ArgumentParser:
    import importlib
    build: Callable[[], argparse.ArgumentParser] = importlib.import_module(module_name).build_parser
    return build()


def completion_path(shell: str, prog: str) -> str:
    # The names bash-completion and zsh's compinit look up: the command's name, `_` + name.
    return f"completions/{shell}/{prog}" if shell == "bash" else f"completions/{shell}/_{prog}"


# What completes an option's value, by its metavar: file and directory names.
_PATH_METAVARS = {"FILE": "FILE", "PATH": "FILE", "DIR|ARCHIVE": "FILE", "DIR": "DIRECTORY",
                  "DIR|auto|none": "DIRECTORY"}


def _completion(parser: argparse.ArgumentParser, shell: str) -> str:
    import shtab  # build-time only (the test extra): the shipped files are checked in

    for each in [parser, *(sub for _, sub in _subcommands(parser))]:
        for action in each._actions:
            kind = _PATH_METAVARS.get(str(action.metavar))
            if kind:
                action.complete = getattr(shtab, kind)  # type: ignore[attr-defined]
    text = shtab.complete(parser, shell=shell)
    return re.sub(r"[ \t]+$", "", text, flags=re.M).rstrip("\n") + "\n"


def generated_files(repo: Path) -> dict[str, str]:
    """Every generated file, relative path -> content, from the parsers and repo's prose."""
    files: dict[str, str] = {}
    for page, (module_name, manual) in MAN_PAGES.items():
        parser = _parser(module_name)
        section = page.rsplit(".", 1)[1]
        prose = (repo / "docs" / "man" / f"{page}.in").read_text()
        files[f"docs/man/{page}"] = render_man_page(parser, section, manual, prose)
        for shell in COMPLETION_SHELLS:
            files[completion_path(shell, parser.prog)] = _completion(parser, shell)
    return files


def main(argv: list[str]) -> int:
    """Write the generated files below the current directory (the repository), or with
    --check only list those out of date (exit 1 if any)."""
    check = argv == ["--check"]
    if argv and not check:
        print("usage: scripts/gen-docs [--check]", file=sys.stderr)
        return 2
    repo = Path.cwd()
    stale = []
    for rel, text in generated_files(repo).items():
        path = repo / rel
        if path.exists() and path.read_text() == text:
            continue
        stale.append(rel)
        if not check:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    for rel in stale:
        print(f"{'out of date' if check else 'wrote'}: {rel}")
    return 1 if check and stale else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
