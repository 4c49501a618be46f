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
    help="Run GGUF models locally on llama.cpp: one-shot prompts and shell pipes.",
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
    """Run GGUF models locally on llama.cpp: one-shot prompts and shell pipes."""


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
    gpu_layers: o.GpuLayers = None,
    kv_type: o.KvType = None,
    force: o.Force = False,
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
    from runner.commands.run import RunRequest, run_once

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
        gpu_layers=gpu_layers,
        kv_type=kv_type,
        force=force,
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
    ctx: o.Ctx = None,
    force: o.Force = False,
    offline: o.Offline = False,
    debug: o.Debug = False,
) -> None:
    """Download a model, every shard verified; print sizes and paths.

    \b
    Examples:
      runner pull smollm2
      runner pull bartowski/Llama-3.2-1B-Instruct-GGUF:Q4_K_M
      runner pull bartowski/Llama-3.2-1B-Instruct-GGUF --list    # quants and sizes, nothing downloaded
    """
    from runner.commands.pull import list_quants, pull_model

    if list_:
        list_quants(model, out=sys.stdout)
    else:
        pull_model(model, out=sys.stdout, quiet=quiet, offline=offline, ctx=ctx, force=force)


@app.command("list")
@edge
def list_(json: o.JsonList = False, debug: o.Debug = False) -> None:
    """List cached models: reference, quant, size, last used.

    Piped, the rows are tab-separated with no header (cut -f1 gives the references).

    \b
    Examples:
      runner list
      runner list | cut -f1
      runner list --json
    """
    from runner.commands.list import list_models

    list_models(out=sys.stdout, as_json=json)


app.command("ls", hidden=True)(list_)


@app.command(no_args_is_help=True)
@edge
def show(
    model: o.ModelArg,
    template: o.Template = False,
    offline: o.Offline = False,
    json: o.JsonObject = False,
    debug: o.Debug = False,
) -> None:
    """Describe a model from its GGUF header, cached or read on the Hub.

    A model not cached is read on the Hub with range requests: nothing is downloaded.

    \b
    Examples:
      runner show smollm2
      runner show bartowski/Llama-3.2-1B-Instruct-GGUF:Q4_K_M
      runner show smollm2 --template > template.jinja
    """
    from runner.commands.show import show_model

    show_model(model, out=sys.stdout, template=template, as_json=json, offline=offline)


@app.command(no_args_is_help=True)
@edge
def rm(model: o.ModelArg, yes: o.Yes = False, debug: o.Debug = False) -> None:
    """Remove a cached model (asks first; shared data stays).

    \b
    Examples:
      runner rm smollm2
      runner rm bartowski/Llama-3.2-1B-Instruct-GGUF:Q4_K_M -y
    """
    from runner.commands.rm import remove_model

    remove_model(model, yes=yes, interactive=sys.stdin is not None and sys.stdin.isatty())


@app.command(no_args_is_help=True)
@edge
def search(
    text: o.SearchText, limit: o.Limit = o.SEARCH_LIMIT, json: o.JsonList = False, debug: o.Debug = False
) -> None:
    """Find GGUF model repos on the Hub, most downloaded first.

    \b
    Examples:
      runner search smollm2
      runner search llama-3.2-1b --limit 5
      runner search qwen --json
    """
    from runner.commands.search import search_hub

    search_hub(text, out=sys.stdout, limit=limit, as_json=json)


@app.command(no_args_is_help=True)
@edge
def fit(
    model: o.ModelArg,
    ctx: o.Ctx = None,
    kv_type: o.KvType = None,
    gpu_layers: o.GpuLayers = None,
    parallel: o.Parallel = 1,
    offline: o.Offline = False,
    json: o.JsonObject = False,
    debug: o.Debug = False,
) -> None:
    """Will it fit? Memory per device, the offload plan and a verdict.

    Weights, KV cache, compute and output buffers per device, as the pinned llama.cpp allocates them,
    from the GGUF header alone: a model not cached is read on the Hub, nothing downloaded.

    For a repo without a quant, one row per quant: size, verdict, the largest context that fits.

    \b
    Examples:
      runner fit smollm2
      runner fit bartowski/Llama-3.2-3B-Instruct-GGUF:Q4_K_M --ctx 32768 --kv-type q8_0
      runner fit bartowski/Llama-3.2-3B-Instruct-GGUF            # every quant
      runner fit ./model.gguf --json
    """
    from runner.commands.fit import Request, fit_model

    fit_model(
        Request(
            model,
            ctx=ctx,
            kv_type=kv_type,
            gpu_layers=gpu_layers,
            parallel=parallel,
            offline=offline,
            as_json=json,
        ),
        out=sys.stdout,
    )


def main() -> None:
    """Entry point of the console script and `python -m runner`."""
    app(prog_name="runner")
