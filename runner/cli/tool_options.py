"""The tool flags of run and chat (runner.commands.agent: MCP servers' tools, each call asked first)."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

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
