"""The command line: a thin Typer layer. Parse, call one function, report errors at the edge."""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import click
import typer
import typer.main

from runner import options as o

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

EXIT_INTERRUPTED = 130
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


SAMPLING_FLAGS = (
    "temperature",
    "top_k",
    "top_p",
    "min_p",
    "repeat_penalty",
    "presence_penalty",
    "frequency_penalty",
    "seed",
)


def _sampling(given: dict[str, Any]) -> dict[str, Any]:
    """The sampling flags of a command's parameters, by SamplingConfig's names (None: not given)."""
    return {name: given[name] for name in SAMPLING_FLAGS}


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
    flash_attn: o.FlashAttn = None,
    spec: o.Spec = None,
    draft: o.Draft = None,
    no_prompt_cache: o.NoPromptCache = False,
    prompt_cache_size: o.PromptCacheSize = None,
    force: o.Force = False,
    offline: o.Offline = False,
    json: o.Json = False,
    verbose: o.Verbose = False,
    think: o.Think = None,
    hide_reasoning: o.HideReasoning = False,
    schema: o.Schema = None,
    format: o.Format = None,
    grammar: o.Grammar = None,
    each_line: o.EachLine = False,
    input: o.InputFile = None,
    parallel: o.RunParallel = None,
    jsonl: o.Jsonl = False,
    continue_: o.Continue = False,
    no_save: o.NoSave = False,
    debug: o.Debug = False,
) -> None:
    """Answer one prompt; the answer alone goes to stdout.

    With no prompt and no pipe, a chat opens (as runner chat MODEL).

    \b
    Examples:
      runner run smollm2 "Why is the sky blue?"
      cat notes.txt | runner run smollm2 "Summarize this"
      runner run ./model.gguf "Hi" --temperature 0 --max-tokens 50 --json
      runner run -c "And in one word?"             # one more turn of the last chat
      runner run smollm2 "Translate to French: {}" --each-line < lines.txt
      runner run smollm2 --input prompts.jsonl --jsonl --parallel 8
      runner run smollm2 "Name a city" --schema '{"type":"object","properties":{"city":{"type":"string"}}}'
    """
    sampling = _sampling(locals())
    tty = sys.stdin is None or sys.stdin.isatty()
    if each_line or input is not None:
        from runner.commands.batch import BatchRequest, run_batch_command

        code = run_batch_command(
            BatchRequest(
                model=model,
                template=prompt,
                each_line=each_line,
                input_path=str(input) if input is not None else None,
                parallel=parallel,
                jsonl=jsonl,
                system=system,
                sampling=sampling,
                max_tokens=max_tokens,
                stop=tuple(stop or ()),
                schema=schema,
                format=format,
                grammar=str(grammar) if grammar is not None else None,
                ctx=ctx,
                threads=threads,
                gpu_layers=gpu_layers,
                kv_type=kv_type,
                flash_attn=flash_attn,
                force=force,
                offline=offline,
                verbose=verbose,
                debug=debug,
            ),
            stdin=None if tty else sys.stdin.buffer,
            out=sys.stdout,
        )
        raise typer.Exit(code)
    if continue_ or (prompt is None and tty and not json and not raw):
        from runner.commands.chat import ChatRequest, chat, continue_last

        # runner run -c PROMPT: the one argument is the prompt, and the model the chat's
        text, name = (model, None) if continue_ and prompt is None else (prompt, model)
        request = ChatRequest(
            model=name,
            system=system,
            sampling=sampling,
            max_tokens=max_tokens,
            stop=tuple(stop or ()),
            ctx=ctx,
            threads=threads,
            gpu_layers=gpu_layers,
            kv_type=kv_type,
            flash_attn=flash_attn,
            spec=spec,
            draft=draft,
            prompt_cache=not no_prompt_cache,
            prompt_cache_size=prompt_cache_size,
            force=force,
            offline=offline,
            save=not no_save,
            think=think,
            hide_reasoning=hide_reasoning,
            verbose=verbose,
            debug=debug,
        )
        if continue_:
            from runner.engine.prompt import read_prompt

            prompt_text = read_prompt(text, None if tty else sys.stdin.buffer)
            continue_last(request, prompt_text, out=sys.stdout, as_json=json)
        else:
            chat(request, stdin=sys.stdin, out=sys.stdout, interactive=True)
        return
    from runner.commands.run import RunRequest, run_once

    run_once(
        RunRequest(
            model=model,
            prompt=prompt,
            system=system,
            raw=raw,
            sampling=sampling,
            max_tokens=max_tokens,
            stop=tuple(stop or ()),
            ctx=ctx,
            threads=threads,
            gpu_layers=gpu_layers,
            kv_type=kv_type,
            flash_attn=flash_attn,
            spec=spec,
            draft=draft,
            prompt_cache=not no_prompt_cache,
            prompt_cache_size=prompt_cache_size,
            force=force,
            offline=offline,
            as_json=json,
            verbose=verbose,
            debug=debug,
            think=think,
            hide_reasoning=hide_reasoning,
            schema=schema,
            format=format,
            grammar=str(grammar) if grammar is not None else None,
        ),
        stdin=None if tty else sys.stdin.buffer,
        out=sys.stdout,
    )


@app.command()
@edge
def chat(
    model: o.OptionalModelArg = None,
    system: o.System = None,
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
    flash_attn: o.FlashAttn = None,
    spec: o.Spec = None,
    draft: o.Draft = None,
    no_prompt_cache: o.NoPromptCache = False,
    prompt_cache_size: o.PromptCacheSize = None,
    force: o.Force = False,
    offline: o.Offline = False,
    resume: o.Resume = None,
    load: o.Load = None,
    no_save: o.NoSave = False,
    markdown: o.Markdown = False,
    think: o.Think = None,
    hide_reasoning: o.HideReasoning = False,
    verbose: o.Verbose = False,
    debug: o.Debug = False,
) -> None:
    """Chat in the terminal; every turn is kept (runner history).

    Piped, each line of stdin is one turn and each answer goes to stdout. In the chat, /help lists
    the commands; Ctrl-C stops an answer, Ctrl-D or /bye quits.

    \b
    Examples:
      runner chat                                  # the default model
      runner chat qwen2.5:7b -s "Answer briefly."
      runner chat --resume                         # the last conversation (or --resume ID)
      printf 'Hi\\nAnd you?\\n' | runner chat smollm2
    """
    from runner.commands.chat import ChatRequest
    from runner.commands.chat import chat as run_chat

    request = ChatRequest(
        model=model,
        system=system,
        sampling=_sampling(locals()),
        max_tokens=max_tokens,
        stop=tuple(stop or ()),
        ctx=ctx,
        threads=threads,
        gpu_layers=gpu_layers,
        kv_type=kv_type,
        flash_attn=flash_attn,
        spec=spec,
        draft=draft,
        prompt_cache=not no_prompt_cache,
        prompt_cache_size=prompt_cache_size,
        force=force,
        offline=offline,
        debug=debug,
        verbose=verbose,
        save=not no_save,
        resume=resume,
        load=load,
        markdown=markdown,
        think=think,
        hide_reasoning=hide_reasoning,
    )
    interactive = sys.stdin is not None and sys.stdin.isatty()
    run_chat(request, stdin=sys.stdin, out=sys.stdout, interactive=interactive)


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


@app.command()
@edge
def cache(clear: o.ClearCache = False, json: o.JsonObject = False, debug: o.Debug = False) -> None:
    """Show the prompt cache on disk (evaluated prompt heads), or clear it.

    \b
    Examples:
      runner cache
      runner cache --clear
    """
    from runner.commands.cache import show_cache

    show_cache(clear=clear, as_json=json, out=sys.stdout)


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
def bench(
    model: o.ModelArg,
    repetitions: o.Repetitions = 3,
    threads: o.Threads = None,
    json: o.JsonObject = False,
    debug: o.Debug = False,
) -> None:
    """Measure a model here: pp512, tg128, TTFT, end to end, batched.

    \b
    Examples:
      runner bench smollm2
      runner bench ./model.gguf --json
    """
    from runner.commands.bench import bench as run_bench

    run_bench(model, out=sys.stdout, as_json=json, repetitions=repetitions, threads=threads)


@app.command(no_args_is_help=True)
@edge
def fit(
    model: o.ModelArg,
    ctx: o.Ctx = None,
    kv_type: o.KvType = None,
    flash_attn: o.FlashAttn = None,
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
            flash_attn=flash_attn,
            gpu_layers=gpu_layers,
            parallel=parallel,
            offline=offline,
            as_json=json,
        ),
        out=sys.stdout,
    )


OPTIONAL_VALUES = {("chat", "resume"): "last"}  # --resume alone means the last conversation


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
