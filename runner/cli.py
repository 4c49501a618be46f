"""The command line: a thin Typer layer. Parse, call one function, report errors at the edge."""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import typer

from runner import options as o

F = TypeVar("F", bound=Callable[..., Any])

app = typer.Typer(
    name="runner",
    help="Run GGUF models locally on llama.cpp: one-shot prompts, shell pipes and chat.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)

EXIT_INTERRUPTED = 130
EXIT_BROKEN_PIPE = 141  # what a shell reports for a process ended by SIGPIPE, as `yes | head` does


@app.callback()
def _root() -> None:
    """Run GGUF models locally on llama.cpp: one-shot prompts, shell pipes and chat."""


def edge(command: F) -> F:
    """The one place where exceptions become a message and an exit code (tracebacks only with --debug)."""

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from runner.errors import RunnerError, exit_code_for

        debug = bool(kwargs.get("debug")) or bool(os.environ.get("RUNNER_DEBUG"))
        if not debug:
            os.environ.setdefault("HF_HUB_VERBOSITY", "error")
        try:
            result = command(*args, **kwargs)
            sys.stdout.flush()
            return result
        except RunnerError as exc:
            if debug:
                raise
            from runner import ui

            ui.error(str(exc))
            raise typer.Exit(exit_code_for(exc)) from None
        except KeyboardInterrupt:
            _flush_or_silence()
            raise typer.Exit(EXIT_INTERRUPTED) from None
        except BrokenPipeError:
            _silence_stdout()
            raise typer.Exit(EXIT_BROKEN_PIPE) from None

    return wrapper  # type: ignore[return-value]


def _flush_or_silence() -> None:
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        _silence_stdout()


def _silence_stdout() -> None:
    """The reader of our stdout went away: point stdout at /dev/null so the exit's flush stays quiet."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


@app.command(no_args_is_help=True)
@edge
def run(
    model: o.ModelArg,
    prompt: o.PromptArg = None,
    system: o.System = None,
    raw: o.Raw = False,
    temperature: o.Temperature = None,
    top_k: o.TopK = None,
    top_p: o.TopP = None,
    min_p: o.MinP = None,
    repeat_penalty: o.RepeatPenalty = None,
    presence_penalty: o.PresencePenalty = None,
    frequency_penalty: o.FrequencyPenalty = None,
    seed: o.Seed = None,
    max_tokens: o.MaxTokens = None,
    stop: o.Stop = None,
    ctx: o.Ctx = None,
    threads: o.Threads = None,
    offline: o.Offline = False,
    json: o.Json = False,
    verbose: o.Verbose = False,
    debug: o.Debug = False,
) -> None:
    """Answer one prompt; the answer alone goes to stdout.

    \b
    Examples:
      runner run smollm2 "Why is the sky blue?"
      cat notes.txt | runner run smollm2 "Summarize this"
      runner run ./model.gguf "Hi" --temperature 0 --max-tokens 50 --json
    """
    from runner.oneshot import RunRequest, run_once

    request = RunRequest(
        model=model,
        prompt=prompt,
        system=system,
        raw=raw,
        sampling={
            "temperature": temperature,
            "top_k": top_k,
            "top_p": top_p,
            "min_p": min_p,
            "repeat_penalty": repeat_penalty,
            "presence_penalty": presence_penalty,
            "frequency_penalty": frequency_penalty,
            "seed": seed,
        },
        max_tokens=max_tokens,
        stop=tuple(stop or ()),
        ctx=ctx,
        threads=threads,
        offline=offline,
        as_json=json,
        verbose=verbose,
        debug=debug,
    )
    stdin = None if sys.stdin is None or sys.stdin.isatty() else sys.stdin.buffer
    run_once(request, stdin=stdin, out=sys.stdout)


@app.command(no_args_is_help=True)
@edge
def pull(
    model: o.ModelArg,
    list_: o.ListQuants = False,
    quiet: o.Quiet = False,
    offline: o.Offline = False,
    debug: o.Debug = False,
) -> None:
    """Download a model (every shard, verified) and print each file's size and path.

    \b
    Examples:
      runner pull smollm2
      runner pull bartowski/Llama-3.2-1B-Instruct-GGUF:Q4_K_M
      runner pull bartowski/Llama-3.2-1B-Instruct-GGUF --list    # quants and sizes, nothing downloaded
    """
    from runner.pull import list_quants, pull_model

    if list_:
        list_quants(model, out=sys.stdout)
    else:
        pull_model(model, out=sys.stdout, quiet=quiet, offline=offline)


def main() -> None:
    """Entry point of the console script and `python -m runner`."""
    app(prog_name="runner")
