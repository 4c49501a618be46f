"""The commands that fetch, list, describe and remove models, search the Hub, and show or clear the
prompt cache: pull, list (and its hidden alias ls), show, rm, cache, search. None of them loads a model.
"""

from __future__ import annotations

import sys

from runner.cli import media_options as m
from runner.cli import options as o
from runner.cli.app import app, edge


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
    mmproj: m.Mmproj = None,
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

    show_model(model, out=sys.stdout, template=template, as_json=json, offline=offline, mmproj=mmproj)


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
