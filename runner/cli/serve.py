"""The command that keeps models loaded for other programs: serve (the OpenAI and Ollama HTTP APIs)."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from runner import options as o
from runner.cli.app import app, edge
from runner.cli.generate import SAMPLING_FLAGS

SERVER = "Server"
Models = Annotated[
    Optional[list[str]],
    typer.Argument(
        help="Models to serve: aliases from models.toml, .gguf paths or Hub repos [default: the catalog's "
        "default]",
        show_default=False,
    ),
]
Host = Annotated[
    str,
    typer.Option(
        "--host", help="Address to listen on; another than loopback needs --api-key.", rich_help_panel=SERVER
    ),
]
Port = Annotated[int, typer.Option("--port", help="Port to listen on.", rich_help_panel=SERVER)]
ApiKey = Annotated[
    Optional[str],
    typer.Option(
        "--api-key",
        help="Require this key (Authorization: Bearer KEY) on every request [default: $RUNNER_API_KEY]",
        rich_help_panel=SERVER,
        show_default=False,
    ),
]
Queue = Annotated[
    int,
    typer.Option(
        "--queue", help="Requests that may wait for a free sequence; past it, 429.", rich_help_panel=SERVER
    ),
]
Cors = Annotated[
    Optional[str],
    typer.Option(
        "--cors",
        help="Let browser pages from ORIGIN call the server (* for any) [default: no CORS]",
        rich_help_panel=SERVER,
        show_default=False,
    ),
]
ServeParallel = Annotated[
    Optional[int],
    typer.Option(
        "--parallel",
        help="Requests answered at once, each with --ctx tokens [default: what fits, at most 4]",
        rich_help_panel=SERVER,
        show_default=False,
    ),
]


@app.command()
@edge
def serve(
    models: Models = None,
    host: Host = "127.0.0.1",
    port: Port = 8080,
    api_key: ApiKey = None,
    queue: Queue = 64,
    cors: Cors = None,
    parallel: ServeParallel = None,
    ctx: o.Ctx = None,
    threads: o.Threads = None,
    gpu_layers: o.GpuLayers = None,
    kv_type: o.KvType = None,
    flash_attn: o.FlashAttn = None,
    temperature: o.Temperature = None,
    top_k: o.TopK = None,
    top_p: o.TopP = None,
    min_p: o.MinP = None,
    repeat_penalty: o.RepeatPenalty = None,
    presence_penalty: o.PresencePenalty = None,
    frequency_penalty: o.FrequencyPenalty = None,
    seed: o.Seed = None,
    force: o.Force = False,
    offline: o.Offline = False,
    debug: o.Debug = False,
) -> None:
    """Serve models over HTTP: the OpenAI and Ollama APIs, until Ctrl-C.

    The sampling flags are each request's defaults; a request's own fields win.

    \b
    Examples:
      runner serve                                  # the default model on 127.0.0.1:8080
      runner serve smollm2 --parallel 8 --port 11434
      OLLAMA_HOST=127.0.0.1:11434 ollama run smollm2  # Ollama's clients, pointed at runner
    """
    from runner.commands.serve import ServeRequest
    from runner.commands.serve import serve as run_serve
    from runner.hub.catalog import load_catalog

    given = locals()
    run_serve(
        ServeRequest(
            models=list(models or [load_catalog().default]),
            host=host,
            port=port,
            api_key=api_key,
            queue=queue,
            cors=cors,
            parallel=parallel,
            ctx=ctx,
            threads=threads,
            gpu_layers=gpu_layers,
            kv_type=kv_type,
            flash_attn=flash_attn,
            sampling={name: given[name] for name in SAMPLING_FLAGS},
            force=force,
            offline=offline,
            debug=debug,
        )
    )
