"""runner history: the conversations chat keeps, as a Typer group of its own (listed by default;
show, rm, export).
"""

from __future__ import annotations

import sys

import typer

from runner import options as o
from runner.cli.app import app, edge

history_app = typer.Typer(
    no_args_is_help=False,
    invoke_without_command=True,
    add_completion=False,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)
app.add_typer(history_app, name="history")


@history_app.callback(invoke_without_command=True)
@edge
def history(ctx: typer.Context, json: o.JsonList = False, limit: o.HistoryLimit = None) -> None:
    """Conversations kept by chat: list, show, rm, export.

    Listed, most recent first: ID, model, turns, last update, first words (piped: tab-separated).

    \b
    Examples:
      runner history                               # id, model, turns, updated, first words
      runner history show 12 --json
      runner chat --resume 12
    """
    if ctx.invoked_subcommand is None:
        from runner.commands.history import list_conversations

        list_conversations(out=sys.stdout, as_json=json, limit=limit)


@history_app.command("show")
@edge
def history_show(conversation: o.ConversationId, json: o.JsonObject = False) -> None:
    """One conversation: its turns as text, or as JSON (what /load and --load read)."""
    from runner.commands.history import show_conversation

    show_conversation(conversation, out=sys.stdout, as_json=json)


@history_app.command("rm")
@edge
def history_rm(conversation: o.ConversationId) -> None:
    """Remove one conversation."""
    from runner.commands.history import remove_conversation

    remove_conversation(conversation)


@history_app.command("export")
@edge
def history_export(json: o.JsonList = False) -> None:
    """Every conversation: as text, or a JSON list."""
    from runner.commands.history import export_conversations

    export_conversations(out=sys.stdout, as_json=json)
