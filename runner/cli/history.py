"""runner history: the conversations chat keeps and the responses serve keeps, as a Typer group of its
own (listed by default; show, rm, export).
"""

from __future__ import annotations

import sys

import typer

from runner.cli import options as o
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
    """Kept chats and served responses: list, show, rm, export.

    Listed, most recent first: ID, where it came from (chat: runner chat and run -c; serve: the last
    response of a chain runner serve kept for /v1/responses, by its resp_… id), model, turns, last
    update, first words (piped: tab-separated).

    \b
    Examples:
      runner history                               # id, from, model, turns, updated, first words
      runner history show 12 --json
      runner history rm resp_0a1b2c                # a served response and its chain
      runner chat --resume 12
    """
    if ctx.invoked_subcommand is None:
        from runner.commands.history import list_conversations

        list_conversations(out=sys.stdout, as_json=json, limit=limit)


@history_app.command("show")
@edge
def history_show(conversation: o.ConversationId, json: o.JsonObject = False) -> None:
    """One conversation: its turns as text, or as JSON (a conversation's is what /load and --load read;
    a response's is the response object, its input and the conversation it ends)."""
    from runner.commands.history import parse_id, show_conversation

    show_conversation(parse_id(conversation), out=sys.stdout, as_json=json)


@history_app.command("rm")
@edge
def history_rm(conversation: o.ConversationId) -> None:
    """Remove one conversation, or a kept response with the earlier ones of its chain that nothing else
    continues."""
    from runner.commands.history import parse_id, remove_conversation

    remove_conversation(parse_id(conversation))


@history_app.command("export")
@edge
def history_export(json: o.JsonList = False) -> None:
    """Every conversation, then every kept response's: as text, or a JSON list."""
    from runner.commands.history import export_conversations

    export_conversations(out=sys.stdout, as_json=json)
