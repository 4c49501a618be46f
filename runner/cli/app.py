"""The command line's root: the Typer app, `edge` (an exception becomes one line and an exit code) and
`command()`, which builds the Click command that main() runs.

The commands live by group in the sibling modules (generate, models, measure, history); each registers
its commands on `app` as runner.cli imports it. This module imports none of them.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import click
import typer
import typer.main

from runner import interrupt

F = TypeVar("F", bound=Callable[..., Any])

app = typer.Typer(
    name="runner",
    help="Run GGUF models locally on llama.cpp: chat, one-shot prompts and shell pipes.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    suggest_commands=False,  # Click 8.2+ suggests the closest itself: with Typer's too, it said it twice
    context_settings={"help_option_names": ["-h", "--help"]},
)

EXIT_BROKEN_PIPE = 141  # what a shell reports for a process ended by SIGPIPE, as `yes | head` does


@app.callback()
def _root() -> None:
    """Run GGUF models locally on llama.cpp: chat, one-shot prompts and shell pipes."""


def edge(command: F) -> F:
    """The one place where exceptions become a message and an exit code (tracebacks only with --debug)."""

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from runner.errors import RunnerError, exit_code_for

        debug = bool(kwargs.get("debug")) or bool(os.environ.get("RUNNER_DEBUG"))
        if not debug:
            os.environ.setdefault("HF_HUB_VERBOSITY", "error")
        try:
            rpc = kwargs.get("rpc")
            if rpc:  # in a child process that a worker going away cannot take runner down with
                from runner import supervise

                if supervise.is_child():
                    from runner.loader import connect_workers

                    connect_workers(rpc)
                elif command.__name__ != "serve":  # serve keeps its port in a front process of its own
                    raise typer.Exit(supervise.run_child(rpc, command.__name__))
            result = command(*args, **kwargs)
            sys.stdout.flush()
            return result
        except RunnerError as exc:
            if debug:
                raise
            from runner import ui

            ui.error(str(exc))
            raise typer.Exit(exit_code_for(exc)) from None
        except (KeyboardInterrupt, interrupt.Stopped, RuntimeError) as exc:  # Ctrl-C 130, SIGTERM 143...
            if isinstance(exc, RuntimeError) and not interrupt.wrapped(exc):  # ...or a Ctrl-C in an import
                raise
            _flush_or_silence()
            raise typer.Exit(interrupt.exit_code()) from None
        except BrokenPipeError:
            _silence_stdout()
            raise typer.Exit(EXIT_BROKEN_PIPE) from None
        finally:
            if "runner.engine.preload" in sys.modules:  # weights loaded ahead that nobody took
                sys.modules["runner.engine.preload"].finish()

    return wrapper  # type: ignore[return-value]


def _flush_or_silence() -> None:
    try:
        sys.stdout.flush()
    except OSError:  # a pipe nobody reads (EPIPE), a terminal gone (EIO)
        _silence_stdout()


def _silence_stdout() -> None:
    """The reader of our stdout went away: point stdout at /dev/null so the exit's flush stays quiet."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


# --resume alone means the last conversation; --quality alone, the text shipped with runner
# --think alone, the template's thinking on
OPTIONAL_VALUES = {
    ("chat", "resume"): "last",
    ("bench", "quality"): "",
    ("run", "think"): "on",
    ("chat", "think"): "on",
}


def command(only: str | None = None) -> click.Command:
    """The Click command Typer builds, with what Typer cannot say itself: an option whose value may be
    left out (`--resume` or `--resume ID`; Typer dropped flag_value), as Click's own flag_value does.

    `only`: the subcommand the command line names, built alone where it is one of the app's own
    commands (Typer builds every command's options from its signature: ~24 ms of each start, of which
    `runner run` needs its own). Anything else (no command, `--help`, a typo Click suggests a name
    for, a group such as `history`) gets the whole app."""
    registered = app.registered_commands
    mine = [info for info in registered if _name_of(info) == only]
    app.registered_commands = mine or registered
    try:
        built = typer.main.get_command(app)
    finally:
        app.registered_commands = registered
    assert isinstance(built, click.Group)
    for (name, param), default in OPTIONAL_VALUES.items():
        if name not in built.commands:
            continue
        sub = built.commands[name]
        option = next(p for p in sub.params if p.name == param)
        assert isinstance(option, click.Option)
        option.flag_value, option._flag_needs_value = default, True
    return built


def _name_of(info: typer.models.CommandInfo) -> str | None:
    """A registered command's name as Typer gives it (its own, or the function's, with - for _)."""
    if info.name:
        return info.name
    callback = info.callback
    return typer.main.get_command_name(callback.__name__) if callback is not None else None


def main() -> None:
    """Entry point of the console script and `python -m runner`."""
    command(sys.argv[1] if len(sys.argv) > 1 else None)(prog_name="runner")
