"""`runner serve --rpc`: a front process that keeps the port, and the server's engines in a child behind it.

ggml's RPC client aborts its whole process when a worker goes away (runner.supervise says why), so the
server that loads across workers runs as a child process on a private loopback port, and this front
process holds the port the clients know and forwards every request to it, streams included. When the
child ends because a worker went away:
  - each request in flight ends with an error in its API's shape: an `error` event in an SSE stream
    (OpenAI, Anthropic, Responses), an {"error"} line in Ollama's NDJSON, a 503 before any answer;
  - the front stays up: /health says 503 with the worker that is gone, other requests 503 likewise;
  - it loads again: on this machine's own devices at once if the plan says the model fits here (the
    same command without --rpc, whose plan refuses what does not fit), else across the workers as soon
    as every one of them answers a handshake again.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from typing import Any

from runner import remote, ui
from runner.serve.apis import shape_of
from runner.serve.shared.http import PROBE, ApiError, quoted

INNER_ENV = "RUNNER_SERVE_INNER_PORT"  # the child serves on 127.0.0.1:this
READY_POLL_S = 0.2
WORKER_POLL_S = 1.0
HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "host", "content-length"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _without_rpc(argv: list[str]) -> list[str]:
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--rpc":
            skip = True
        elif not arg.startswith("--rpc="):
            out.append(arg)
    return out


class Front:
    """The child serving the models, and what the front says while there is none."""

    def __init__(self, argv: list[str], endpoints: list[str], url: str = "") -> None:
        self.url = url
        self.argv = argv
        self.endpoints = endpoints
        self.state = "loading"  # "ready" | "loading" | "worker gone"
        self.why = ""
        self.port = 0
        self.child: subprocess.Popen[bytes] | None = None
        self.stopping = False

    def _spawn(self, rpc: bool) -> None:
        from runner.engine.rpc import CHILD_ENV, REPORT_ENV

        self.port = _free_port()
        env = {**os.environ, INNER_ENV: str(self.port), "GGML_NO_BACKTRACE": "1"}
        quiet = os.open(os.devnull, os.O_WRONLY)  # ggml's abort message: the front says it in its words
        if rpc:
            env[CHILD_ENV] = "1"
            env[REPORT_ENV] = str(quiet)
        argv = self.argv if rpc else _without_rpc(self.argv)
        try:
            self.child = subprocess.Popen(
                [sys.executable, "-m", "runner", *argv],
                env=env,
                pass_fds=(quiet,),
                start_new_session=True,  # a Ctrl-C on the terminal reaches the front, which stops the child
            )
        finally:
            os.close(quiet)

    async def _ready(self) -> bool:
        """Wait until the child answers /health (True), or ends first (False)."""
        import httpx

        async with httpx.AsyncClient() as client:
            while self.child is not None and self.child.poll() is None:
                with contextlib.suppress(httpx.HTTPError):
                    url = f"http://127.0.0.1:{self.port}/health"
                    answer = await client.get(url, timeout=2, headers={PROBE: "1"})
                    if answer.status_code == 200:
                        return True
                await asyncio.sleep(READY_POLL_S)
        return False

    async def run(self, fail: Any) -> None:
        """The child's life, again and again, until the server stops. `fail(code)` stops the server
        when the first load across the workers fails for another reason than a worker."""
        loop = asyncio.get_running_loop()
        rpc, served = True, False
        while not self.stopping:
            self._spawn(rpc)
            ready = await self._ready()
            child = self.child
            assert child is not None
            if ready:
                self.state, self.why, served = "ready", "", True
                where = (
                    f"across {', '.join(self.endpoints)}" if rpc else "on this machine alone (it fits here)"
                )
                ui.info(f"serving on {self.url} {where}")
                while child.poll() is None:
                    await asyncio.sleep(READY_POLL_S)
            if self.stopping:
                return
            gone: list[str] = await loop.run_in_executor(None, self._gone)
            if rpc and not gone and not served:  # not a worker's doing: the child said why
                fail(child.returncode or 1)
                return
            if rpc:
                if gone or self.state != "worker gone":  # else lost() named it, before it came back
                    self.state, self.why = "worker gone", f"worker {', '.join(gone) or '?'} went away"
                ui.warn(f"{self.why}: the answers in flight ended with an error; loading the model again")
                rpc = False  # first this machine alone: its own plan refuses what does not fit here
                continue
            while not self.stopping:
                missing: list[str] = await loop.run_in_executor(None, self._gone)
                if not missing:
                    break
                await asyncio.sleep(WORKER_POLL_S)
            rpc = True

    async def lost(self) -> None:
        """The child's connection broke under a request: which worker is gone, said at once."""
        gone: list[str] = await asyncio.get_running_loop().run_in_executor(None, self._gone)
        if gone and self.state == "ready":
            self.state, self.why = "worker gone", f"worker {', '.join(gone)} went away"

    def _gone(self) -> list[str]:
        return [e for e in self.endpoints if not remote.reachable(e, timeout=1.0)]

    def stop(self) -> None:
        self.stopping = True
        if self.child is not None and self.child.poll() is None:
            self.child.send_signal(signal.SIGTERM)  # it ends the answers in flight within seconds

    def wait(self, timeout: float = 15) -> None:
        if self.child is None:
            return
        try:
            self.child.wait(timeout)
        except subprocess.TimeoutExpired:
            self.child.kill()
            self.child.wait()


def _unavailable(path: str, front: Front) -> Any:
    from starlette.responses import JSONResponse

    if path == "/health":
        body = {"status": front.state, "error": front.why or None, "workers": front.endpoints}
        return JSONResponse(body, status_code=503)
    message = f"{front.why}; the server is loading the model again" if front.why else "the model is loading"
    err = ApiError(503, message, kind="server_error", code="worker_unavailable")
    return JSONResponse(shape_of(path).body(err), status_code=503, headers={"Retry-After": "5"})


def _said(method: str, path: str, status: int, start: float, error: str) -> None:
    """The access line of a request the server behind could not finish (it died under it): the
    front's, as that server writes one."""
    shown = "".join(c if c.isprintable() and c != " " else f"%{ord(c):02X}" for c in path)[:200]
    total = time.perf_counter() - start
    ui.info(f"{method} {shown} {status} total={total:.3f}s finish=error error={quoted(error, 200)}")


def _stream_error(path: str, message: str) -> bytes:
    """The error that ends a cut stream, as the API's clients read one mid-stream."""
    err = ApiError(502, message, kind="server_error", code="worker_unavailable")
    return shape_of(path).in_stream(err).encode()


def create_front(front: Front) -> Any:
    """The front's ASGI app: everything forwarded to the child, or answered 503 while there is none."""
    import httpx
    from starlette.applications import Starlette
    from starlette.background import BackgroundTask
    from starlette.requests import Request
    from starlette.responses import StreamingResponse
    from starlette.routing import Route

    client = httpx.AsyncClient(timeout=httpx.Timeout(None, connect=5))

    async def forward(request: Request) -> Any:
        start = time.perf_counter()
        path = request.url.path
        if front.state != "ready":
            return _unavailable(path, front)
        url = f"http://127.0.0.1:{front.port}{path}" + (f"?{request.url.query}" if request.url.query else "")
        headers = [(k, v) for k, v in request.headers.items() if k.lower() not in HOP]
        try:  # the body streams through: the server behind bounds its size, as without a front
            answer = await client.send(
                client.build_request(request.method, url, headers=headers, content=request.stream()),
                stream=True,
            )
        except httpx.HTTPError:  # the child just ended: the front's loop will say why in a moment
            await front.lost()
            refused = _unavailable(path, front)
            _said(
                request.method, path, refused.status_code, start, front.why or "the server behind went away"
            )
            return refused
        content_type = answer.headers.get("content-type", "")
        streaming = "event-stream" in content_type or "ndjson" in content_type

        async def relay() -> Any:
            try:
                async for chunk in answer.aiter_raw():
                    yield chunk
            except httpx.HTTPError:  # the server behind died with it: its access line is the front's
                await front.lost()
                why = f"{front.why or 'a worker went away'} during the answer"
                _said(request.method, path, answer.status_code, start, why)
                if streaming:
                    yield _stream_error(path, why)

        out_headers = {k: v for k, v in answer.headers.items() if k.lower() not in HOP}
        return StreamingResponse(
            relay(),
            status_code=answer.status_code,
            headers=out_headers,
            background=BackgroundTask(answer.aclose),
        )

    methods = ["GET", "POST", "DELETE", "PUT", "PATCH", "OPTIONS", "HEAD"]
    return Starlette(routes=[Route("/{path:path}", forward, methods=methods)])


def serve_front(host: str, port: int, argv: list[str], rpc: str) -> None:
    """The front on host:port until Ctrl-C or SIGTERM, the child behind it."""
    import uvicorn

    from runner.serve.uvserver import make_server

    endpoints = remote.parse_endpoints(rpc)
    remote.probe_all(endpoints)  # one line within 3 s for a bad endpoint, before anything loads
    shown = f"[{host}]" if ":" in host else host
    front = Front(argv, endpoints, f"http://{shown}:{port}")
    config = uvicorn.Config(
        create_front(front),
        host=host,
        port=port,
        log_level="warning",
        access_log=False,
        lifespan="off",
        timeout_graceful_shutdown=10,
        server_header=False,
    )

    def fail(server: Any, code: int) -> None:
        failed.append(code)
        server.should_exit = True

    async def beside(server: Any) -> None:
        await front.run(lambda code: fail(server, code))

    failed: list[int] = []
    server = make_server(config, lambda _server: front.stop(), beside)
    try:
        server.run()
    finally:
        front.stop()
        front.wait()
    if failed:
        raise SystemExit(failed[0])
