"""The flags of run and chat for long work: tools (runner.commands.agent: MCP servers' tools, each call
asked first), how long a model thinks (runner.engine.text.reasoning: levels and budgets) and chats
that outgrow their context (runner.commands.compact)."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from runner.cli.options import OUTPUT

TOOLS = "Tools (MCP)"
Mcp = Annotated[
    Optional[list[str]],
    typer.Option(
        "--mcp",
        metavar="FILE",
        help="An mcpServers JSON file (as Claude Desktop, Cursor and LM Studio read): its servers' tools "
        "for the model, each call asked first (repeatable; the config folder's mcp.json joins them)",
        rich_help_panel=TOOLS,
        show_default=False,
    ),
]
AllowTools = Annotated[
    Optional[list[str]],
    typer.Option(
        "--allow-tools",
        metavar="NAMES",
        help="Tools that run without asking: names, or SERVER:* (comma-separated, repeatable). Without a "
        "terminal, a call not allowed here ends the answer (exit 1)",
        rich_help_panel=TOOLS,
        show_default=False,
    ),
]
MaxToolSteps = Annotated[
    int, typer.Option("--max-tool-steps", help="Tool calls a turn may make", rich_help_panel=TOOLS)
]
ToolTimeout = Annotated[
    float, typer.Option("--tool-timeout", help="Seconds one tool call may take", rich_help_panel=TOOLS)
]
ToolChoice = Annotated[
    str,
    typer.Option(
        "--tool-choice",
        metavar="auto|required|none|NAME",
        help="The first step's tool choice, as the API's tool_choice (required or a name force a call)",
        rich_help_panel=TOOLS,
    ),
]

Think = Annotated[
    Optional[str],
    typer.Option(
        "--think",
        is_flag=False,
        flag_value="on",
        metavar="[LEVEL]",
        help="How much a reasoning model thinks: off, low, medium, high (alone: on); the template's own "
        "switch where it has one (enable_thinking, reasoning_effort), else a budget "
        "[default: the template's]",
        rich_help_panel=OUTPUT,
        show_default=False,
    ),
]
NoThink = Annotated[
    bool,
    typer.Option("--no-think", help="Ask a reasoning model not to think", rich_help_panel=OUTPUT),
]
ReasoningBudget = Annotated[
    Optional[int],
    typer.Option(
        "--reasoning-budget",
        metavar="N",
        help="Thinking tokens at most; then its end is forced, a short note first, and the answer follows "
        "(0: no thinking at all)",
        rich_help_panel=OUTPUT,
        show_default=False,
    ),
]

LONG_CHATS = "Long chats"
Compact = Annotated[
    Optional[str],
    typer.Option(
        "--compact",
        metavar="auto|ask|off",
        help="A chat past its context: auto summarises its older turns by the model itself; ask drops "
        "them and offers /compact; off drops them [default: ask on a terminal, else auto]",
        rich_help_panel=LONG_CHATS,
        show_default=False,
    ),
]
CompactKeep = Annotated[
    Optional[int],
    typer.Option(
        "--compact-keep",
        metavar="TOKENS",
        help="Recent tokens a compaction keeps as they were (whole exchanges) [default: a quarter of "
        "the context]",
        rich_help_panel=LONG_CHATS,
        show_default=False,
    ),
]
CompactPrompt = Annotated[
    Optional[str],
    typer.Option(
        "--compact-prompt",
        metavar="TEXT",
        help="The instruction the model summarises older turns by (docs/chat.md has the default)",
        rich_help_panel=LONG_CHATS,
        show_default=False,
    ),
]
