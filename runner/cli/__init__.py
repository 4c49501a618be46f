"""The command line: a thin Typer layer. Parse, call one function, report errors at the edge.

app.py holds the Typer app, the edge and the building of the Click command. The commands live by
group in the modules imported below, each registering its commands on the app as it is imported; Typer
lists commands in the order they were registered, so this order is `runner --help`'s (a group such as
history comes after the commands whatever its place).
"""

from __future__ import annotations

from runner.cli import generate, pooling, audio, models, measure, serve, launch, tokens, history  # noqa: F401  # isort: skip  (--help's order)
from runner.cli.app import main

__all__ = ["main"]
