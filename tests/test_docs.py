"""Docs that cannot drift: the README's commands are the ones CI and the CLI really run, and every
`runner` command and flag in README.md and docs/*.md is one that command's `--help` lists."""

from __future__ import annotations

import re
import shlex
from functools import cache
from pathlib import Path

import click
import pytest

from tests.conftest import run_cli

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _block_after(marker: str) -> str:
    return README.split(marker, 1)[1].split("```", 2)[1].split("\n", 1)[1]


@pytest.mark.fast
def test_ci_runs_exactly_the_readme_test_command() -> None:
    command = _block_after("<!-- test-command").strip()
    assert command.endswith("python -m pytest")
    assert (ROOT / ".ci" / "run").read_text().strip().splitlines()[-1] == command


def test_readme_shows_the_real_help() -> None:
    assert _block_after("<!-- runner --help -->") == run_cli("--help", env={"COLUMNS": "80"}).stdout.decode()


# --- every command and flag in every page, against --help ---------------------------------------------


def shell_lines(markdown: str) -> list[str]:
    """What a page gives people to type: each line of its ```sh blocks, and each inline code span
    (a span may wrap onto the next line, so prose is read with its line breaks as spaces)."""
    commands, prose, fence = [], [], None
    for line in markdown.splitlines():
        if line.startswith("```"):
            fence = None if fence is not None else line[3:].strip()
        elif fence == "sh":
            commands.append(line)
        elif fence is None:
            prose.append(line)
    spans = re.findall(r"`([^`]+)`", " ".join(prose))
    return commands + [span for span in spans if re.search(r"(?:^|[|&;]\s*)runner\s", span)]


def runner_commands(line: str) -> list[list[str]]:
    """The `runner …` commands on one shell line, as words: pipes, `&&` and `;` separate commands,
    redirections and `#` comments are dropped."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    commands: list[list[str]] = [[]]
    tokens = iter(lexer)
    for token in tokens:
        if token in {"|", "||", "&&", ";", "&"}:
            commands.append([])
        elif token in {"<", ">", ">>"}:
            next(tokens, None)  # the file
        else:
            commands[-1].append(token)
    return [words for words in commands if words[:1] == ["runner"] and len(words) > 1]


@cache
def help_of(*path: str) -> str:
    """`runner PATH --help` as a user reads it at 200 columns, from the same click objects main() runs."""
    from runner.cli.app import command

    group = command()
    wide = {**group.context_settings, "terminal_width": 200, "max_content_width": 200}
    ctx = click.Context(group, info_name="runner", **wide)
    for name in path:
        assert isinstance(ctx.command, click.Group)
        sub = ctx.command.commands[name]
        ctx = click.Context(sub, parent=ctx, info_name=name, **sub.context_settings)
    return ctx.command.get_help(ctx)


def section(help_text: str, title: str) -> list[str]:
    """The entries of one section of a help text (`Options:`, `Commands:`): the lines under its title."""
    entries = help_text.split(f"\n{title}:\n", 1)[1:]
    return [line for line in "".join(entries).split("\n\n", 1)[0].splitlines() if line.startswith("  ")]


def subcommands(path: tuple[str, ...]) -> set[str]:
    return {line.split()[0] for line in section(help_of(*path), "Commands")}


def flags(path: tuple[str, ...]) -> set[str]:
    """Every flag spelling the Options section lists (`-s, --system TEXT`, `--think / --no-think`)."""
    specs = [re.split(r"\s{2,}", line.strip(), maxsplit=1)[0] for line in section(help_of(*path), "Options")]
    return {flag for spec in specs for flag in re.findall(r"(?<![\w-])--?\w[\w-]*", spec)}


def flags_in(args: list[str]) -> list[str]:
    """The flags among a command's words (`--flag`, `--flag=value`, `-x`, `[--json]`; not `-1`, nor
    anything after `--`)."""
    found = []
    for arg in args:
        if arg == "--":
            break
        arg = arg.strip("[]")
        if re.match(r"-{1,2}[A-Za-z]", arg):
            found.append(arg.split("=", 1)[0])
    return found


def problems(words: list[str]) -> list[str]:
    """What in one `runner …` command its --help does not know: the command, or a flag."""
    path: tuple[str, ...] = ()
    args = words[1:]
    while args and not args[0].startswith("-") and subcommands(path):
        name = args.pop(0)
        if re.fullmatch(r"[A-Z][A-Z_]*", name):  # `runner COMMAND --help`: flags that every command has
            every = [(*path, each) for each in sorted(subcommands(path))]
            return [
                f"{flag} is not in every command's --help"
                for flag in flags_in(args)
                if not all(flag in flags(each) for each in every)
            ]
        if name not in subcommands(path):
            return [f"{name}: no such command in `{' '.join(('runner', *path, '--help'))}`"]
        path = (*path, name)
    help_command = " ".join(("runner", *path, "--help"))
    return [f"{flag} is not in `{help_command}`" for flag in flags_in(args) if flag not in flags(path)]


@pytest.mark.fast
@pytest.mark.parametrize("page", PAGES, ids=[str(page.relative_to(ROOT)) for page in PAGES])
def test_every_command_and_flag_in_the_page_is_in_help(page: Path) -> None:
    found = [(line.strip(), cmd) for line in shell_lines(page.read_text()) for cmd in runner_commands(line)]
    if page.name == "README.md":
        assert len(found) > 20, "the README's commands are no longer found: is the page still read right?"
    wrong = [f"{line}\n    {problem}" for line, cmd in found for problem in problems(cmd)]
    assert not wrong, f"{page.relative_to(ROOT)}:\n  " + "\n  ".join(wrong)


@pytest.mark.fast
def test_the_docs_check_catches_a_made_up_command_or_flag() -> None:
    markdown = (
        "Try `runner run smollm2 hi\n--temprature 0`, a span over a line break.\n\n"
        "```sh\necho x | runner hsitory show -j  # -j: not checked, the command is wrong\n```\n"
    )
    found = [problems(cmd) for line in shell_lines(markdown) for cmd in runner_commands(line)]
    assert found == [
        ["hsitory: no such command in `runner --help`"],
        ["--temprature is not in `runner run --help`"],
    ]
    assert problems(["runner", "history", "show", "12", "--json"]) == []
    assert problems(["runner", "history", "show", "1", "-j"]) == ["-j is not in `runner history show --help`"]
    assert problems(["runner", "run", "m", "--think", "--no-think", "-s", "x", "--gpu-layers=-1", "-h"]) == []
    assert problems(["runner", "COMMAND", "--help"]) == []
    assert problems(["runner", "COMMAND", "--json"]) == ["--json is not in every command's --help"]
