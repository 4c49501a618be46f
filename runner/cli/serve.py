"""The command that keeps models loaded for other programs: serve (the OpenAI and Ollama HTTP APIs)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer

from runner.cli import options as o
from runner.cli.app import app, edge
from runner.cli.generate import SAMPLING_FLAGS
from runner.cli.tool_options import TOOLS, MaxToolSteps, Mcp, ToolTimeout

if TYPE_CHECKING:
    from runner.commands.serve import ServeRequest
    from runner.tools.loop import ToolSettings

SERVER = "Server"
Models = Annotated[
    Optional[list[str]],
    typer.Argument(
        help="Models to load now and serve: aliases from models.toml, .gguf paths or Hub repos [default: "
        "every cached model, loaded on demand; none cached: the catalog's default]",
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
StreamInterval = Annotated[
    int,
    typer.Option(
        "--stream-interval",
        metavar="MS",
        help="Join a streamed answer's next pieces into one chunk while the first waits at most MS "
        "milliseconds (its first piece and its end go at once); 0: a chunk a token.",
        rich_help_panel=SERVER,
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
Memory = Annotated[
    Optional[str],
    typer.Option(
        "--memory",
        help="Host memory the served models may use together, e.g. 8G [default: what the plan sees free "
        "at the start]",
        rich_help_panel=SERVER,
        show_default=False,
    ),
]
CacheRam = Annotated[
    Optional[str],
    typer.Option(
        "--cache-ram",
        help="Host memory each model may keep prompts' KV states in once their sequence is taken, so a "
        "client coming back is not evaluated again, e.g. 2G; 0 = none [default: 1G, at most an eighth "
        "of the memory free at its load]",
        rich_help_panel=SERVER,
        show_default=False,
    ),
]
ModelsDir = Annotated[
    Optional[Path],
    typer.Option(
        "--models",
        help="A folder of .gguf files to serve too, on demand, each by its file name (looked at again as "
        "files come and go)",
        rich_help_panel=SERVER,
        show_default=False,
    ),
]
KeepAlive = Annotated[
    str,
    typer.Option(
        "--keep-alive",
        help="How long a model loaded on demand stays loaded once idle: 30s, 5m, 1h; 0 = unload after "
        "each answer, -1 = for ever",
        rich_help_panel=SERVER,
    ),
]
NoMetrics = Annotated[
    bool,
    typer.Option(
        "--no-metrics",
        help="No GET /metrics (Prometheus), nothing counted for it [default: served, behind --api-key]",
        rich_help_panel=SERVER,
        show_default=False,
    ),
]
NoWebui = Annotated[
    bool,
    typer.Option(
        "--no-webui",
        help="No chat page on GET / (nor its /runner/v1 conversation API) [default: served]",
        rich_help_panel=SERVER,
        show_default=False,
    ),
]

ServeMmproj = Annotated[
    Optional[str],
    typer.Option(
        "--mmproj",
        metavar="FILE|REF",
        help="The vision projector (an mmproj GGUF, or its Hub reference) of the one MODEL named: its "
        "requests may carry images [default: each model's own, pulled with it]",
        rich_help_panel=SERVER,
        show_default=False,
    ),
]
MaxImageBytes = Annotated[
    Optional[str],
    typer.Option(
        "--max-image-bytes",
        help="An image's size at most, as sent (decoded from base64), e.g. 5M [default: 20M]",
        rich_help_panel=SERVER,
        show_default=False,
    ),
]
MaxImages = Annotated[
    Optional[int],
    typer.Option(
        "--max-images",
        help="Images one request may carry [default: 8]",
        rich_help_panel=SERVER,
        show_default=False,
    ),
]
ServeAllowTools = Annotated[
    Optional[list[str]],
    typer.Option(
        "--allow-tools",
        metavar="NAMES",
        help="With --mcp: tools the chat page's turns run without asking: names, or SERVER:* "
        "(comma-separated, repeatable)",
        rich_help_panel=TOOLS,
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
    stream_interval: StreamInterval = 16,  # runner.serve.outbox.STREAM_INTERVAL_MS
    cors: Cors = None,
    parallel: ServeParallel = None,
    memory: Memory = None,
    keep_alive: KeepAlive = "5m",
    cache_ram: CacheRam = None,
    models_dir: ModelsDir = None,
    mmproj: ServeMmproj = None,
    max_image_bytes: MaxImageBytes = None,
    max_images: MaxImages = None,
    no_metrics: NoMetrics = False,
    no_webui: NoWebui = False,
    mcp: Mcp = None,
    allow_tools: ServeAllowTools = None,
    max_tool_steps: MaxToolSteps = 10,
    tool_timeout: ToolTimeout = 60.0,
    ctx: o.Ctx = None,
    threads: o.Threads = None,
    gpu_layers: o.GpuLayers = None,
    kv_type: o.KvType = None,
    flash_attn: o.FlashAttn = None,
    spec: o.Spec = None,
    draft: o.Draft = None,
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
    rpc: o.Rpc = None,
    debug: o.Debug = False,
) -> None:
    """Serve models over HTTP: the OpenAI, Anthropic and Ollama APIs, until Ctrl-C.

    With MODELS, those are loaded now. Without, every model cached here is served, each loaded
    on its first request, within the memory the plan sees (or --memory).
    The sampling flags are each request's defaults; a request's own fields win.
    With --mcp, the chat page's turns may call the servers' tools, each call asked in the page first
    (the APIs' tools stay their clients').

    \b
    Examples:
      runner serve                                  # every cached model on 127.0.0.1:8080
      runner serve smollm2 --parallel 8 --port 11434
      runner serve smollm2 --spec none              # no speculative decoding (ngram by default)
      runner serve MODEL --mmproj mmproj.gguf       # its requests may carry images
      runner serve MODEL --mcp mcp.json             # the chat page's turns may call these tools
      OLLAMA_HOST=127.0.0.1:11434 ollama run smollm2  # Ollama's clients, pointed at runner
    """
    from runner.commands.serve import serve as run_serve

    run_serve(_request(locals()))


# serve's flags that runner.commands.serve's ServeRequest takes as they are, by the same names
AS_GIVEN = (
    "host",
    "port",
    "api_key",
    "queue",
    "stream_interval",
    "cors",
    "parallel",
    "memory",
    "keep_alive",
    "cache_ram",
    "max_image_bytes",
    "max_images",
    "rpc",
)
LOAD_FLAGS = ("ctx", "threads", "gpu_layers", "kv_type", "draft", "mmproj", "force", "offline", "debug")


def _request(given: dict[str, Any]) -> ServeRequest:
    """serve's flags (its parameters) as the request runner.commands.serve takes: AS_GIVEN as they are,
    MODELS as a list, --models DIR as a string, the sampling flags together, --no-metrics turned round."""
    from runner.commands.serve import ServeRequest
    from runner.settings import LoadSettings

    models_dir = given["models_dir"]
    settings = LoadSettings.from_flags(
        given["flash_attn"], given["spec"], **{name: given[name] for name in LOAD_FLAGS}
    )
    return ServeRequest(
        settings=settings,
        models=list(given["models"] or []),
        models_dir=str(models_dir) if models_dir is not None else None,
        sampling={name: given[name] for name in SAMPLING_FLAGS},
        metrics=not given["no_metrics"],
        webui=not given["no_webui"],
        tools=_tools(given),
        **{name: given[name] for name in AS_GIVEN},
    )


def _tools(given: dict[str, Any]) -> ToolSettings | None:
    """--mcp and its flags, for the chat page's turns (None: no --mcp, no MCP server starts)."""
    if not given["mcp"]:
        if given["allow_tools"]:
            from runner.errors import UsageError

            raise UsageError("--allow-tools goes with --mcp FILE (the tools the chat page's turns may call)")
        return None
    from runner.tools.loop import ToolSettings

    allow = tuple(
        name.strip() for item in given["allow_tools"] or () for name in item.split(",") if name.strip()
    )
    return ToolSettings(
        configs=tuple(given["mcp"]),
        allow=allow,
        max_steps=given["max_tool_steps"],
        timeout_s=given["tool_timeout"],
    )


WORKER = "Worker"


@app.command()
@edge
def worker(
    host: Annotated[
        str,
        typer.Option(
            "--host", help="Address to listen on; another than loopback is open to anyone (warning)."
        ),
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="Port to listen on.")] = 50052,
    threads: o.Threads = None,
    cache: Annotated[
        Optional[Path],
        typer.Option(
            "--cache",
            help="Folder of the tensor cache (weights sent before, by hash) [default: runner's cache/rpc]",
            show_default=False,
        ),
    ] = None,
    no_cache: Annotated[
        bool, typer.Option("--no-cache", help="No tensor cache: every load sends the weights again.")
    ] = False,
) -> None:
    """Offer this machine's CPU (or GPU) to runner on other machines, until Ctrl-C.

    It is llama.cpp's RPC server: another machine's `runner run/chat/serve/fit/bench --rpc HOST:PORT`
    puts layers of its model here. It checks no key and encrypts nothing: keep it on 127.0.0.1 and
    reach it through an SSH tunnel (docs/rpc.md).

    \b
    Examples:
      runner worker                                 # 127.0.0.1:50052
      runner worker --port 50053 --threads 4
      ssh -N -L 50052:127.0.0.1:50052 gpu-box       # then, here: runner run MODEL --rpc 127.0.0.1:50052
    """
    from runner.commands.worker import WorkerRequest
    from runner.commands.worker import worker as run_worker

    run_worker(
        WorkerRequest(
            host=host,
            port=port,
            threads=threads,
            cache=str(cache) if cache is not None else None,
            no_cache=no_cache,
        )
    )
