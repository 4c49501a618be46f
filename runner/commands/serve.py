"""`runner serve`: load the models, then answer the OpenAI and Ollama APIs until Ctrl-C or SIGTERM.

Each model loads through the same loader and plan as `run` (the plan counts --parallel sequences'
KV cache, as fit --parallel does, and lowers N or refuses with the same reasons); the port is checked
before any load, so a port in use costs no minute of loading. uvicorn serves; its signal handling is
replaced by ours: the first Ctrl-C or SIGTERM stops accepting and ends every answer in flight at the
engine's next step (finish_reason "interrupted"), then the process exits 0; a second Ctrl-C exits at once.
"""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import os
import socket
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from runner import loader, ui
from runner.commands.output import describe_load, describe_model, open_prompt_cache, sampling_for
from runner.commands.serve_limits import cache_ram_limit, image_limits, max_body, memory_budget, within_memory
from runner.errors import UsageError
from runner.hub.catalog import load_catalog
from runner.hub.refs import HubRef, LocalRef, resolve
from runner.limits import check_range, parse_duration, parse_size
from runner.loader import DEFAULT_BATCH_CTX, SERVE_PARALLEL, LoadedModel, open_model, plan_for, serve_planning
from runner.projector import pulled_with
from runner.serve.outbox import STREAM_INTERVAL_MS
from runner.settings import DEFAULTS, LoadSettings

if TYPE_CHECKING:
    from runner.commands.agent import Servers
    from runner.engine.text.sampling import SamplingConfig
    from runner.gguf import GGUFHeader
    from runner.memory.plan import Plan
    from runner.serve.backend import ModelInfo
    from runner.serve.engine_backend import Served
    from runner.serve.pool import EngineBackend, Offer
    from runner.serve.webui.tools import PageTools
    from runner.tools.loop import ToolSettings

DEFAULT_PORT = 8080  # llama-server's; Ollama's 11434 is for OLLAMA_HOST=127.0.0.1:PORT users to pick
DEFAULT_QUEUE = 64
DEFAULT_KEEP_ALIVE = "5m"  # Ollama's
API_KEY_ENV = "RUNNER_API_KEY"


@dataclass(frozen=True)
class ServeRequest:
    models: list[str]
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    api_key: str | None = None
    queue: int = DEFAULT_QUEUE
    stream_interval: int = STREAM_INTERVAL_MS  # --stream-interval: how long a streamed piece may wait
    cors: str | None = None
    parallel: int | None = None  # None: SERVE_PARALLEL, or fewer if the plan says so
    settings: LoadSettings = DEFAULTS  # --ctx (a sequence's), --spec, --draft, --mmproj ...
    sampling: dict[str, Any] = field(default_factory=dict)  # the flags: each request's defaults
    memory: str | None = None  # --memory: what the served models may use of host memory together
    keep_alive: str = DEFAULT_KEEP_ALIVE  # an idle model loaded on demand is unloaded after this
    cache_ram: str | None = None  # --cache-ram: each model's kept prompt states (None: cache_ram_limit)
    models_dir: str | None = None  # --models DIR: every .gguf there, served on demand
    max_image_bytes: str | None = None  # --max-image-bytes as typed (None: runner.images.MAX_IMAGE_BYTES)
    max_images: int | None = None  # --max-images: a request's images at most (None: runner.images.MAX_IMAGES)
    rpc: str | None = None  # --rpc: the models' layers across these workers (docs/rpc.md)
    metrics: bool = True  # GET /metrics (Prometheus), and everything counted for it; --no-metrics: neither
    webui: bool = True  # the chat page on GET / and its conversation API (/runner/v1); --no-webui: neither
    tools: ToolSettings | None = None  # --mcp and its flags: tools for the chat page's turns (None: none)


def serve(request: ServeRequest) -> None:
    check_range(request.port, "--port", 1, 65535)
    check_range(request.queue, "--queue", 0, 100_000)
    check_range(request.stream_interval, "--stream-interval", 0, 1000)
    if request.parallel is not None:
        check_range(request.parallel, "--parallel", 1, 256)
    key = request.api_key or os.environ.get(API_KEY_ENV) or None
    if not _loopback(request.host) and not key:
        raise UsageError(
            f"--host {request.host} lets other machines in: give --api-key KEY (or set {API_KEY_ENV})"
        )
    keep_alive = parse_duration(request.keep_alive, "--keep-alive")
    memory = parse_size(request.memory, "--memory") if request.memory is not None else None
    if memory is not None and memory <= 0:
        raise UsageError("--memory must be more than 0")
    if request.cache_ram is not None:
        parse_size(request.cache_ram, "--cache-ram")  # a bad size refused now, before any load
    _planning(request)  # a bad --flash-attn refused now, not at a model's first request
    image_limits(request)  # --mmproj and its limits checked before any load
    ui.stamp_messages()  # a server's log: each line says when
    from runner.serve.front import INNER_ENV

    inner = os.environ.get(INNER_ENV)
    if inner:  # the server behind `serve --rpc`'s front (runner.serve.front): loopback, its own port
        request = replace(request, host="127.0.0.1", port=int(inner))
    with _port(request.host, request.port):
        pass  # free now: checked before minutes of loading (uvicorn binds it again below)
    if request.rpc and not inner:  # the port held by a front, the engines in a child it restarts
        from runner.serve.front import serve_front

        return serve_front(request.host, request.port, sys.argv[1:], request.rpc)
    from runner.serve.metrics import Metrics
    from runner.serve.pool import EngineBackend, Pool

    if request.models_dir is not None and not Path(request.models_dir).expanduser().is_dir():
        raise UsageError(f"--models: {Path(request.models_dir).expanduser()} is not a folder")
    budget = memory_budget(memory)
    metrics = Metrics() if request.metrics else None
    servers = _servers(request)  # their start goes on beside the models' load
    pool = Pool([], queue=request.queue, budget=budget, keep_alive=keep_alive, metrics=metrics)
    try:
        for name in request.models:  # named: loaded now, served while the server runs
            stem = _stem_if_path(name, taken=pool.offers)
            loaded = _load(request, name, offline=request.settings.offline, mmproj=request.settings.mmproj)
            loaded.name = stem or loaded.name
            pool.offers[loaded.name] = _offer(request, loaded.name, loaded, reference=name)
            needs = _needs(loaded.plan, loaded.header)
            within_memory(request, memory, loaded.name, needs, pool)
            pool.preload(_served(loaded, request, name), needs)
        if request.models_dir is not None or not request.models:
            pool.scan = _scanner(request, dict(pool.offers))
        if not pool.names():  # nothing here yet: the catalog's default, fetched now (never by a request)
            loaded = _load(request, load_catalog().default, offline=request.settings.offline)
            pool.offers[loaded.name] = _offer(request, loaded.name, loaded)
            pool.preload(_served(loaded, request), _needs(loaded.plan, loaded.header))
            pool.scan = _scanner(request, dict(pool.offers))
        tools = _page_tools(request, servers)
        _run(request, EngineBackend(pool), key, behind_front=bool(inner), tools=tools)
    finally:
        pool.close()
        if servers is not None:
            servers.close()


def _servers(request: ServeRequest) -> Servers | None:
    """--mcp's servers, started before the models load (a config that cannot be read is refused now)."""
    if request.tools is None:
        return None
    from runner.commands.agent import Servers

    request.tools.check()
    if not request.webui:
        raise UsageError("--mcp gives tools to the chat page's turns: it goes without --no-webui")
    return Servers(request.tools, default=True)


def _page_tools(request: ServeRequest, servers: Servers | None) -> PageTools | None:
    """The started servers' tools, for the page (each server that failed said in one line)."""
    if servers is None or request.tools is None:
        return None
    from runner.serve.webui.tools import PageTools

    host = servers.ready()
    if host is None:
        return None
    names = ", ".join(f"{s.name} ({len(s.tools)} tools)" for s in host.servers() if s.state == "ready")
    ui.info(f"tools for the chat page's turns, each call asked in the page: {names or 'no server ready'}")
    return PageTools(host, request.tools)


def _scanner(request: ServeRequest, named: dict[str, Offer]) -> Callable[[], list[Offer]]:
    """The pool's scan: the models loaded at the start, then each found on demand (--models DIR's
    files, and unless models were named every cached one) as it is now."""

    def scan() -> list[Offer]:
        found = list(named.values())
        for name, (path, key) in _local_models(request, cached=not request.models).items():
            if name not in named:
                found.append(_offer(request, name, path=path, key=key))
        return found

    return scan


def _run(
    request: ServeRequest,
    backend: EngineBackend,
    key: str | None,
    behind_front: bool = False,
    tools: PageTools | None = None,
) -> None:
    import uvicorn

    from runner.serve.app import MAX_BODY, create_app
    from runner.serve.responses.store import open_responses
    from runner.serve.webui.conversations import open_conversations

    store = open_responses()  # where /v1/responses keeps its responses (None: it keeps none)
    chats = open_conversations() if request.webui else None  # the chat page's (None: no page)
    images, image_bytes = image_limits(request)
    seeing = any(backend.info(name).max_images for name in backend.names())
    body = max_body(images, image_bytes) if seeing else MAX_BODY  # room for images where a model takes them
    app = create_app(
        backend,
        api_key=key,
        cors=request.cors,
        max_body=body,
        log=ui.info,
        store=store,
        metrics=backend.pool.metrics,
        webui=chats,
        page_tools=tools if chats is not None else None,
    )
    if tools is not None and chats is None:
        ui.warn("--mcp: the chat page is off, so no turn calls the tools")
    config = uvicorn.Config(
        app,
        host=request.host,
        port=request.port,
        log_level="warning",
        access_log=False,
        lifespan="off",
        timeout_graceful_shutdown=5,
        server_header=False,
    )
    server = _Server(config, backend, tools)
    host = f"[{request.host}]" if ":" in request.host else request.host
    for name in backend.loaded():
        ui.info(_started(backend, name))
    waiting = [n for n in backend.names() if n not in backend.loaded()]
    if waiting:
        ui.info(f"on demand: {', '.join(waiting)}")
    apis = "OpenAI /v1, Anthropic /v1/messages, Ollama /api" + (", a chat page on /" if chats else "")
    if not behind_front:  # else the front says where it serves
        ui.info(f"serving {', '.join(backend.names())} on http://{host}:{request.port} ({apis})")
    try:
        server.run()
    finally:
        for kept in (store, chats):
            if kept is not None:
                kept.close()
    if not server.started:  # uvicorn could not bind: it said why on stderr
        raise UsageError(f"could not serve on {host}:{request.port}")


def _started(backend: EngineBackend, name: str) -> str:
    """A loaded model's line at the start: how it was loaded and what it serves. A generating model's
    sequences, kept prompt states and images; a pooling one (a reranker, an encoder) what it takes
    instead, since it has no chat, keeps no KV cache between requests and no prompt states."""
    thread = backend.pool.loaded[name].thread
    served, info = thread.served, backend.info(name)
    if info.cannot_generate is not None:
        n = f"{thread.longest_input:,} tokens at most"
        if info.reranks:
            what = f"reranks (POST /v1/rerank): a query and a document of {n} a pair"
        else:
            what = f"embeds (POST /v1/embeddings, /api/embed): a text of {n}"
        # the generating context's size and KV type do not apply to it: its threads and offload do
        parts = describe_load(served.loaded, model=False).split(" · ")
        how = [part for part in parts if not part.startswith(("ctx ", "KV "))]
        loaded = " · ".join([describe_model(served.loaded), *how])
        return f"{loaded} · {what} · no chat, no KV cache kept between requests, no prompt states"
    kept = f" · prompt states kept up to {served.cache_ram / 1e6:,.0f} MB" if served.cache_ram else ""
    at_once = ui.count(info.parallel, "sequence")
    vision = served.loaded.engine.vision
    takes = f" · images through {vision.projector.name}, {info.max_images} a request" if vision else ""
    return f"{describe_load(served.loaded)} · {at_once} at once{kept}{takes}"


def _planning(request: ServeRequest) -> LoadSettings:
    """What the plan is asked, the same for a load and for its price before one: the flags, --parallel,
    and the rows of logits a scored prompt needs."""
    return replace(request.settings, **serve_planning(request.parallel))


def _load(request: ServeRequest, name: str, *, offline: bool, mmproj: str | None = None) -> LoadedModel:
    # without --mmproj, the projector pulled with the model (none: text only); a reranker is served
    # too: a request to generate with it is refused (400)
    settings = replace(_planning(request), offline=offline, mmproj=mmproj, vision=True, generates=False)
    return open_model(name, settings)


def _stem_if_path(name: str, taken: dict[str, Offer]) -> str | None:
    """The name a model given as a file is served under: the file's name without .gguf, as for the files
    of --models DIR (a client sends `model: "x"` for ./x.gguf, not the path). None for an alias or a
    Hub reference, whose name is as given. A second file with the same stem is refused before it loads."""
    ref = resolve(name, load_catalog())
    if not isinstance(ref, LocalRef):
        return None
    stem = ref.path.stem
    if stem in taken:
        raise UsageError(f"{name}: another model is already served as {stem!r}; give each file its own name")
    return stem


def _local_models(request: ServeRequest, *, cached: bool) -> dict[str, tuple[Path | None, object]]:
    """Each .gguf in --models DIR by its file name without .gguf (that file, its size and time), and if
    `cached` every model cached here by the names `runner list` shows (None: resolved as `runner run`
    resolves the name)."""
    from runner.hub.cache import cached_models

    found: dict[str, tuple[Path | None, object]] = {}
    if cached:
        for m in cached_models(load_catalog()):
            if not m.missing_shards:
                found.setdefault(m.reference, (None, m.paths))
    if request.models_dir is not None:  # checked at the start; removed since: nothing there
        for file in sorted(Path(request.models_dir).expanduser().glob("*.gguf")):
            with contextlib.suppress(OSError):  # gone since the glob: not offered
                stat = file.stat()
                found.setdefault(file.stem, (file.absolute(), (stat.st_size, stat.st_mtime_ns)))
    return found


def _offer(
    request: ServeRequest,
    name: str,
    loaded: LoadedModel | None = None,
    *,
    path: Path | None = None,
    key: object = None,
    reference: str | None = None,
) -> Offer:
    """How the pool describes, prices and loads `name`: from its header, nothing downloaded.
    `reference`: what `runner serve` was given for it (a path, an alias), for the hints that name it;
    by default a file's path, else the name."""
    from runner.serve.pool import Offer

    given = reference or (str(path) if path is not None else name)

    def header_and_path() -> tuple[GGUFHeader, Path]:
        from runner.gguf import read_header
        from runner.hub.fetch import locate

        if path is not None:
            return read_header(path), path
        ref = resolve(name, load_catalog())
        file = locate(ref) if isinstance(ref, HubRef) else ref.path
        return read_header(file), file

    def paired() -> str | None:  # the projector pulled with a cached model (a file of --models: none)
        return pulled_with(name) if path is None else None

    def describe() -> ModelInfo:
        if loaded is not None:
            return _info(loaded, request, given)
        from runner.serve.backend import model_info

        header, path = header_and_path()
        info = model_info(
            name,
            header,
            path,
            request.settings.ctx or DEFAULT_BATCH_CTX,
            request.parallel or SERVE_PARALLEL,
            reference=given,
        )
        projector = paired()
        if projector is None:
            return info
        images, image_bytes = image_limits(request)
        from runner.gguf import read_header
        from runner.gguf.audio_projector import is_audio_projector, is_omni_projector

        head = read_header(projector)
        sees = not is_audio_projector(head)
        hears = not sees or is_omni_projector(head)
        return replace(info, max_images=images, max_image_bytes=image_bytes, sees=sees, hears=hears)

    def needs() -> dict[str, int]:
        from runner.projector import memory

        header, path = header_and_path()
        projector = memory(found, header) if (found := paired()) is not None else None
        return _needs(plan_for(header, name, _planning(request), path=path, projector=projector), header)

    def load() -> Served:
        loaded = _load(request, str(path) if path is not None else name, offline=True)
        loaded.name = name  # the name requests use, not the file's path
        return _served(loaded, request, given)

    return Offer(name, describe, needs, load, key)


def _needs(plan: Plan, header: GGUFHeader) -> dict[str, int]:
    """What a served model holds, by device (runner.loader.serve_needs: `runner fit --serve`'s)."""
    return loader.serve_needs(plan, header)


def _served(loaded: LoadedModel, request: ServeRequest, reference: str | None = None) -> Served:
    from runner.serve.engine_backend import Served

    info = _info(loaded, request, reference)
    interval = request.stream_interval / 1000
    if info.cannot_generate is not None:  # a reranker, an encoder: no chat, so no template, no prompt states
        return Served(info, loaded, _sampling(loaded, request.sampling), stream_interval=interval)
    template = loaded.header.get("tokenizer.chat_template")
    if not isinstance(template, str) or not template.strip():  # as `runner run` and `chat` warn
        ui.warn(
            f"{loaded.name} has no chat template: a chat request's messages go as plain text "
            "('User: …' and 'Assistant:' lines)"
        )

    limit = cache_ram_limit(request.cache_ram)
    disk = open_prompt_cache(True, None)  # heads `runner run` and `chat` stored: read, never written
    return Served(info, loaded, _sampling(loaded, request.sampling), limit, disk, interval)


def _Server(config: Any, backend: EngineBackend, tools: PageTools | None = None) -> Any:
    """uvicorn's Server with runner's signals (runner.serve.uvserver): the first ends every answer in
    flight (and every tool call the page's turns wait for or run) and stops accepting, a second
    Ctrl-C exits at once."""
    from runner.serve.uvserver import make_server

    def stop(server: Any) -> None:
        if not server.should_exit:
            ui.info("stopping: the answers in progress end now")
        backend.stop()
        if tools is not None:
            tools.stop()

    return make_server(config, stop)


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@contextlib.contextmanager
def _port(host: str, port: int) -> Iterator[None]:
    """The port, bound for a moment: in use is one line naming it (exit 2)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise UsageError(f"port {port} on {host} is in use: choose another with --port") from None
        raise UsageError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    finally:
        sock.close()
    yield


def _sampling(loaded: LoadedModel, flags: dict[str, Any]) -> Callable[[dict[str, Any]], SamplingConfig]:
    given = {k: v for k, v in flags.items() if v is not None}

    def make(fields: dict[str, Any]) -> SamplingConfig:
        return sampling_for(loaded, {**given, **{k: v for k, v in fields.items() if v is not None}})[0]

    make({})  # the flags themselves checked now, not at the first request
    return make


def _info(loaded: LoadedModel, request: ServeRequest, reference: str | None = None) -> ModelInfo:
    """What the API's model lists say of a loaded model: its header's, and the images it takes (with a
    projector attached: --max-images and --max-image-bytes)."""
    from runner.serve.backend import model_info

    n_seq = loaded.engine.context.n_seq
    context = loaded.engine.context.n_ctx // max(1, n_seq)
    info = model_info(loaded.name, loaded.header, loaded.path, context, n_seq, reference=reference)
    vision = loaded.engine.vision
    if vision is None:
        return info
    images, image_bytes = image_limits(request)
    return replace(info, max_images=images, max_image_bytes=image_bytes, sees=vision.sees, hears=vision.hears)
