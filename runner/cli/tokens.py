"""`runner tokens`: count a text's tokens (or a chat's) with a model's vocabulary, no weights loaded."""

from __future__ import annotations

import sys
from typing import Annotated, Optional

import typer

from runner.cli import options as o
from runner.cli.app import app, edge

TokensText = Annotated[
    Optional[str],
    typer.Argument(help="The text to count; without it, stdin (every byte of it).", show_default=False),
]
Ids = Annotated[bool, typer.Option("--ids", help="The token ids on a second line, space-separated.")]
Pieces = Annotated[
    bool,
    typer.Option("--pieces", help="After the count, a line per token: its id, a tab, its piece as JSON."),
]
Template = Annotated[
    bool,
    typer.Option(
        "--template",
        help='The text is a chat, as JSON messages ([{"role": "user", "content": "Hi"}]): counted as the '
        "model's chat template renders it, as run, chat and serve evaluate it.",
    ),
]


@app.command(no_args_is_help=True)
@edge
def tokens(
    model: o.ModelArg,
    text: TokensText = None,
    ids: Ids = False,
    pieces: Pieces = False,
    template: Template = False,
    offline: o.Offline = False,
    debug: o.Debug = False,
) -> None:
    """Count a text's or a chat's tokens (no weights loaded).

    Only the model's vocabulary is read. The count comes first on stdout, with the BOS token where
    the model adds one (what `run --raw` evaluates).

    \b
    Examples:
      runner tokens smollm2 "Why is the sky blue?"
      cat notes.txt | runner tokens smollm2
      runner tokens smollm2 "Hello world" --pieces
      echo '[{"role": "user", "content": "Hi"}]' | runner tokens smollm2 --template
    """
    from runner.commands.tokens import TokensRequest, count_tokens

    tty = sys.stdin is None or sys.stdin.isatty()
    request = TokensRequest(model, text, ids=ids, pieces=pieces, template=template, offline=offline)
    count_tokens(request, stdin=None if tty else sys.stdin.buffer, out=sys.stdout)
