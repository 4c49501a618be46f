"""The HTTP application `runner serve` runs: the APIs' routes over one backend, and what wraps them.

From the outside in: the access line (and the last guard against a bare 500), CORS when asked for,
the API key when one is set, then the routes (runner.serve.apis: one package per API). Every error
leaves in the shape of the API it was asked through: a route's by its own API, the rest by the API
that claims the path (Anthropic's /v1/messages*, Ollama's /api/*, OpenAI's the rest).
"""

from __future__ import annotations

import hmac
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from runner.serve import apis
from runner.serve.backend import Backend
from runner.serve.metrics import Metrics, RequestCounter
from runner.serve.responses.store import ResponseStore
from runner.serve.shared.http import PROBE, TRAFFIC, ApiError, Traffic, as_api_error, brief, quoted
from runner.serve.webui.conversations import Conversations
from runner.serve.webui.site import WebUI, open_path

if TYPE_CHECKING:
    from runner.serve.webui.tools import PageTools

MAX_BODY = 4 << 20  # a request's body: room for a long conversation, not for a flood


def create_app(
    backend: Backend,
    *,
    api_key: str | None = None,
    cors: str | None = None,
    max_body: int = MAX_BODY,
    log: Callable[[str], None] | None = None,
    store: ResponseStore | None = None,
    metrics: Metrics | None = None,
    webui: Conversations | None = None,
    page_tools: PageTools | None = None,
) -> Starlette:
    """The server's ASGI app. api_key: required on every request but GET / and GET /health. cors: the
    one origin browsers may call from ("*": any); None, the default, sends no CORS headers at all.
    log: where the access lines go (stderr by default). store: where /v1/responses keeps responses
    (None: it keeps none). metrics: the registry GET /metrics shows, every request counted in it
    (None: no /metrics, nothing counted). webui: the store the chat page keeps conversations in (None:
    no page; GET / answers as Ollama's clients expect either way, the page to a browser). page_tools:
    the MCP servers' tools the page's turns may call (runner serve --mcp), each call asked in the page."""
    page = WebUI(backend, webui, max_body, page_tools) if webui is not None else None

    async def root(request: Request) -> Response:
        if page is not None and page.wanted(request):
            return page.index(request)
        return PlainTextResponse("runner is running")  # Ollama's clients probe / before anything else

    async def health(request: Request) -> Response:
        if backend.ready():
            return JSONResponse({"status": "ok"})
        return JSONResponse({"status": "loading"}, status_code=503)

    routes = [
        Route("/", root, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        *apis.routes(backend, max_body, store),
        *(page.routes() if page is not None else []),
    ]
    count = None
    if metrics is not None:

        async def scrape(request: Request) -> Response:
            body, content_type = metrics.exposition(request.headers.get("accept"))
            return Response(body, headers={"Content-Type": content_type})

        routes.insert(2, Route("/metrics", scrape, methods=["GET"]))
        count = metrics.counter_for(routes, api_of=_api_of)
    middleware = [Middleware(AccessLog, log=log or _to_stderr, count=count)]
    if cors:
        origins = ["*"] if cors == "*" else [cors]
        # any header a preflight asks for: the official JavaScript SDKs send a family that grows with
        # each release (x-stainless-lang, -os, -arch, -runtime, -retry-count, -timeout, ...,
        # openai-organization, anthropic-version, ...), and a header grants nothing the origin
        # check and the API key do not (as llama-server answers Access-Control-Allow-Headers: *)
        headers = ["*"]
        methods = ["GET", "POST", "DELETE"]
        middleware.append(
            Middleware(CORSMiddleware, allow_origins=origins, allow_methods=methods, allow_headers=headers)
        )
    if api_key:
        middleware.append(Middleware(ApiKey, key=api_key))
    return Starlette(routes=routes, middleware=middleware, exception_handlers={HTTPException: _no_route})


def _no_route(request: Request, exc: Exception) -> Response:
    """The router's 404 and 405, in the API's shape (405 keeps its Allow header)."""
    status = exc.status_code if isinstance(exc, HTTPException) else 500
    where = f"{request.method} {quoted(request.url.path)}"
    if status == 405:
        allow = dict(exc.headers or {}) if isinstance(exc, HTTPException) else {}
        err = ApiError(405, f"{where}: method not allowed", headers=allow)
    elif status == 404:
        err = ApiError(404, f"{where}: no such endpoint", kind="not_found_error")
    else:
        err = ApiError(status, f"{where}: {getattr(exc, 'detail', '')}")
    return apis.shape_of(request.url.path).response(request, err)


def _api_of(path: str) -> str:
    """The API a request is counted under: the server's own paths (/, /health, /metrics) are runner's."""
    return "runner" if path in OWN_PATHS else apis.shape_of(path).name


def _to_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


# -- middleware -----------------------------------------------------------------------------


class AccessLog:
    """One line per request (method, path, status, tokens and TTFT for answers, total), written when
    the response is done, streams included; and the last guard: an exception no handler took becomes
    a 500 in the API's shape, said in the line, never a traceback. count: where each request is
    counted too, as its line is written (runner.serve.metrics)."""

    def __init__(self, app: ASGIApp, log: Callable[[str], None], count: RequestCounter | None = None) -> None:
        self.app = app
        self.log = log
        self.count = count

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        note = Traffic(time.perf_counter())
        scope[TRAFFIC] = note
        status = 0

        async def sending(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, sending)
        except Exception as exc:
            note.error = brief(exc)
            if status == 0:
                err = as_api_error(exc)
                body = apis.shape_of(scope.get("path", "")).body(err)
                await JSONResponse(body, status_code=err.status)(scope, receive, sending)
        finally:
            if not _probe(scope):
                self.log(access_line(scope, status, note))
                if self.count is not None:
                    self.count(scope, 499 if note.client_left else status, time.perf_counter() - note.start)


def _probe(scope: Scope) -> bool:
    """The --rpc front asking whether this server is up: no client sent it, so no line says it."""
    return scope.get("path") == "/health" and any(k == PROBE.encode() for k, _ in scope.get("headers", []))


def access_line(scope: Scope, status: int, note: Traffic) -> str:
    path = "".join(c if c.isprintable() and c != " " else f"%{ord(c):02X}" for c in scope.get("path", ""))
    status = 499 if note.client_left else status  # the client left before its answer was out
    line = f"{scope.get('method', '?')} {path[:200]} {status or '-'}"
    if note.prompt_tokens is not None:
        line += f" prompt={note.prompt_tokens} completion={note.completion_tokens} ttft={note.ttft_s:.3f}s"
    line += f" total={time.perf_counter() - note.start:.3f}s"
    if note.finish is not None:
        line += f" finish={note.finish}"
    if note.error:
        line += f" error={quoted(note.error, 200)}"
    return line


OPEN_PATHS = {"/", "/health"}  # what answers without the key: a liveness probe says nothing private
OWN_PATHS = {*OPEN_PATHS, "/metrics"}  # the server's own, no API's (/metrics: behind the key)


class ApiKey:
    """With a key set, every request but GET / and GET /health carries it, as `Authorization: Bearer
    KEY` or `x-api-key: KEY`, compared in constant time; else a 401 in the API's shape."""

    def __init__(self, app: ASGIApp, key: str) -> None:
        self.app = app
        self.key = key.encode("utf-8")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self._open(scope) or self._allowed(scope):
            await self.app(scope, receive, send)
            return
        err = ApiError(
            401, "a valid API key is required", kind="authentication_error", code="invalid_api_key"
        )
        request = Request(scope, receive)
        response = apis.shape_of(request.url.path).response(request, err)
        response.headers["WWW-Authenticate"] = "Bearer"
        await response(scope, receive, send)

    def _open(self, scope: Scope) -> bool:
        method, path = scope.get("method", ""), scope.get("path", "")
        return method in ("GET", "HEAD") and path in OPEN_PATHS or open_path(method, path)

    def _allowed(self, scope: Scope) -> bool:
        ok = False
        for name, value in scope.get("headers", []):
            given = b""
            if name == b"authorization":
                scheme, _, token = value.partition(b" ")
                given = token.strip() if scheme.lower() == b"bearer" else b""
            elif name == b"x-api-key":
                given = value.strip()
            if given:
                ok |= hmac.compare_digest(given, self.key)  # every header compared: no early exit
        return ok
