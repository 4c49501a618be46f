"""The command that starts a coding agent on a local model: launch."""

from __future__ import annotations

import sys
from typing import Annotated, Optional

import typer

from runner.cli import options as o
from runner.cli.app import app, edge

AgentArg = Annotated[
    str,
    typer.Argument(help="The agent: claude (Claude Code), codex (Codex CLI) or opencode", show_default=False),
]
LaunchModel = Annotated[
    Optional[str],
    typer.Argument(
        help="The model it runs on: an alias from models.toml, a .gguf path or a Hub repo [default: the "
        "catalog's default]",
        show_default=False,
    ),
]
AgentArgs = Annotated[
    Optional[list[str]],
    typer.Argument(help="The agent's own arguments, after --", show_default=False),
]
LaunchCtx = Annotated[
    Optional[int],
    typer.Option(
        "--ctx",
        help="Each sequence's context window in tokens [default: the model's trained context, at most "
        "65536, at least what the agent needs]",
        show_default=False,
    ),
]
LaunchParallel = Annotated[
    int,
    typer.Option("--parallel", help="Requests answered at once (2 at least: the agent's side requests)."),
]
PrintOnly = Annotated[
    bool,
    typer.Option(
        "--print", help="Print the server's and the agent's commands (with the environment) instead."
    ),
]


@app.command()
@edge
def launch(
    agent: AgentArg,
    model: LaunchModel = None,
    agent_args: AgentArgs = None,
    ctx: LaunchCtx = None,
    parallel: LaunchParallel = 2,
    print_only: PrintOnly = False,
    offline: o.Offline = False,
    debug: o.Debug = False,
) -> None:
    """Start a coding agent on a local model: runner serve behind it, stopped when it exits.

    The context is checked first against what the agent sends (docs/agents.md); the server gets a
    free loopback port and a fresh key, and the agent is told them, the model, its context and its
    output limit through its own settings (no file of yours is written).

    \b
    Examples:
      runner launch claude qwen3:8b
      runner launch codex qwen3:8b --ctx 32768 -- exec "Add a test"
      runner launch opencode qwen3:8b -- run "Explain main.py"
      runner launch claude qwen3:8b --print   # the commands, to start them yourself
    """
    from runner.commands.launch import LaunchRequest
    from runner.commands.launch import launch as run_launch

    model, args = _split(model, list(agent_args or []), sys.argv[1:])
    request = LaunchRequest(agent, model, args, ctx, parallel, print_only, offline)
    code = run_launch(request, sys.stdout)
    if code:
        raise typer.Exit(code)


def _split(model: str | None, args: list[str], argv: list[str]) -> tuple[str | None, list[str]]:
    """MODEL, and the agent's arguments: Click gives the first word after `--` to MODEL when none came
    before it (`runner launch claude -- -p hi`), so the command line as typed decides."""
    if model is None or argv[:1] != ["launch"] or "--" not in argv:
        return model, args
    if model in argv[: argv.index("--")]:
        return model, args
    return None, [model, *args]
