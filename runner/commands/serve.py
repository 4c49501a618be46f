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
import signal
import socket
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from runner import ui
from runner.commands.output import describe_load, sampling_for
from runner.errors import UsageError
from runner.limits import check_range, flash_attn_setting
from runner.loader import LoadedModel, open_model

DEFAULT_PORT = 8080  # llama-server's; Ollama's 11434 is for OLLAMA_HOST=127.0.0.1:PORT users to pick
DEFAULT_PARALLEL = 4  # llama-server's default slot count; fewer when the plan says they do not fit
DEFAULT_QUEUE = 64
API_KEY_ENV = "RUNNER_API_KEY"


@dataclass(frozen=True)
class ServeRequest:
    models: list[str]
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    api_key: str | None = None
    queue: int = DEFAULT_QUEUE
    cors: str | None = None
    parallel: int | None = None  # None: DEFAULT_PARALLEL, or fewer if the plan says so
    ctx: int | None = None
    threads: int | None = None
    gpu_layers: int | None = None
    kv_type: str | None = None
    flash_attn: str | None = None
    sampling: dict[str, Any] = field(default_factory=dict)  # the flags: each request's defaults
    force: bool = False
    offline: bool = False
    debug: bool = False


def serve(request: ServeRequest) -> None:
    check_range(request.port, "--port", 1, 65535)
    check_range(request.queue, "--queue", 0, 100_000)
    if request.parallel is not None:
        check_range(request.parallel, "--parallel", 1, 256)
    key = request.api_key or os.environ.get(API_KEY_ENV) or None
    if not _loopback(request.host) and not key:
        raise UsageError(
            f"--host {request.host} lets other machines in: give --api-key KEY (or set {API_KEY_ENV})"
        )
    flash_attn = flash_attn_setting(request.flash_attn)
    with _port(request.host, request.port):
        pass  # free now: checked before minutes of loading (uvicorn binds it again below)
    loaded: list[LoadedModel] = []
    try:
        for name in request.models:
            loaded.append(
                open_model(
                    name,
                    ctx=request.ctx,
                    threads=request.threads,
                    gpu_layers=request.gpu_layers,
                    kv_type=request.kv_type,
                    flash_attn=flash_attn,
                    parallel=request.parallel or DEFAULT_PARALLEL,
                    most_parallel=request.parallel is None,
                    force=request.force,
                    offline=request.offline,
                    debug=request.debug,
                )
            )
        _run(request, loaded, key)
    finally:
        for model in loaded:
            model.close()


def _run(request: ServeRequest, loaded: list[LoadedModel], key: str | None) -> None:
    import uvicorn

    from runner.serve.app import create_app
    from runner.serve.engine_backend import EngineBackend, Served

    served = [Served(_info(m), m, _sampling(m, request.sampling)) for m in loaded]
    names = [s.info.name for s in served]
    if len(set(names)) != len(names):
        raise UsageError(f"a model is named twice: {', '.join(names)}")
    backend = EngineBackend(served, queue=request.queue)
    try:
        app = create_app(backend, api_key=key, cors=request.cors, log=ui.info)
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
        server = _Server(config, backend)
        host = f"[{request.host}]" if ":" in request.host else request.host
        for model in loaded:
            ui.info(f"{describe_load(model)} · {model.engine.n_seq} sequences at once")
        apis = "OpenAI /v1, Anthropic /v1/messages, Ollama /api"
        ui.info(f"serving {', '.join(names)} on http://{host}:{request.port} ({apis})")
        server.run()
        if not server.started:  # uvicorn could not bind: it said why on stderr
            raise UsageError(f"could not serve on {host}:{request.port}")
    finally:
        backend.close()


class _Server:
    """uvicorn's Server, with our signals: the first ends every answer in flight and stops accepting,
    a second Ctrl-C exits at once (uvicorn's force_exit)."""

    def __new__(cls, config: Any, backend: Any) -> Any:
        import uvicorn

        class Server(uvicorn.Server):
            @contextlib.contextmanager
            def capture_signals(self) -> Iterator[None]:
                # uvicorn's own re-raises the signal once it has stopped: exit 130/143, not 0
                previous = {s: signal.signal(s, self._stop) for s in (signal.SIGINT, signal.SIGTERM)}
                try:
                    yield
                finally:
                    for s, handler in previous.items():
                        signal.signal(s, handler)

            def _stop(self, signum: int, frame: Any) -> None:
                if not self.should_exit:
                    ui.info("stopping: the answers in progress end now")
                backend.stop()
                self.handle_exit(signum, frame)

        return Server(config)


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


def _sampling(loaded: LoadedModel, flags: dict[str, Any]) -> Any:
    given = {k: v for k, v in flags.items() if v is not None}

    def make(fields: dict[str, Any]) -> Any:
        return sampling_for(loaded, {**given, **{k: v for k, v in fields.items() if v is not None}})[0]

    make({})  # the flags themselves checked now, not at the first request
    return make


def _info(loaded: LoadedModel) -> Any:
    from runner.hub.quants import quant_of
    from runner.serve.backend import ModelInfo

    header, stat = loaded.header, loaded.path.stat()
    metadata = {
        k: v
        for k, v in header.metadata.items()
        if isinstance(v, (str, int, float, bool)) and len(str(v)) <= 1024 and not k.startswith("tokenizer.")
    }
    template = header.get("tokenizer.chat_template")
    return ModelInfo(
        name=loaded.name,
        path=str(loaded.path),
        size=stat.st_size,
        modified=stat.st_mtime,
        sha256=getattr(loaded.entry, "sha256", None),
        architecture=header.architecture or "",
        quantization=quant_of(loaded.path.name) or "",
        parameters=str(header.get("general.size_label") or ""),
        context=int(loaded.engine.n_ctx // max(1, loaded.engine.n_seq)),
        parallel=loaded.engine.n_seq,
        template=template if isinstance(template, str) else None,
        metadata=metadata,
    )
