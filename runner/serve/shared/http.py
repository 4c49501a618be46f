"""A request as the server handles every one: the figures its access line says, a failure as an
`ApiError` with its status, and the one way a failure becomes a response in its API's shape.

Each API declares its `ErrorShape` (its error body, an error inside a stream it began, the paths it
claims) and wraps its routes with `guarded`, so a route's failure is said by its own API; where no
route is known (the router's 404 and 405, the API key's 401, the access line's last guard),
runner.serve.apis asks the shapes which one claims the path.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from runner.errors import RunnerError, UsageError
from runner.serve.backend import BadField, QueueFull, TooLong

TRAFFIC = "runner.traffic"  # the scope key of a request's Traffic (app.AccessLog puts it there)
PROBE = "x-runner-probe"  # a header the --rpc front's own /health polls carry: no access line for them


@dataclass
class Traffic:
    """What a request's access line says, filled in as the request goes."""

    start: float
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    ttft_s: float | None = None
    finish: str | None = None
    error: str | None = None
    client_left: bool = False  # before its answer was out: logged 499 (as nginx logs a client that left)


def traffic(request: Request) -> Traffic:
    found = request.scope.get(TRAFFIC)
    if isinstance(found, Traffic):
        return found
    request.scope[TRAFFIC] = fresh = Traffic(time.perf_counter())  # no AccessLog above (a bare router)
    return fresh


def quoted(value: str, limit: int = 100) -> str:
    """A string from a request, safe to put in a message or a log line: JSON-quoted, cut at limit."""
    return json.dumps(value[:limit] + ("…" if len(value) > limit else ""))


def json_line(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


class ApiError(Exception):
    """A request's failure, said in its API's shape: OpenAI's {"error": {...}}, Ollama's {"error"} or
    Anthropic's {"type": "error", "error": {"type", "message"}}."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        kind: str = "invalid_request_error",
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.kind = kind
        self.code = code
        self.headers = headers or {}


def loc_param(loc: Iterable[int | str]) -> str:
    """pydantic's loc as a field path: ("messages", 2, "role") -> "messages[2].role"."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def as_api_error(exc: Exception) -> ApiError:
    """Any failure of a request as an ApiError: the status each of runner's errors means over HTTP."""
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, ValidationError):
        first = exc.errors(include_url=False, include_input=False)[0]
        param = loc_param(first["loc"]) or None
        message = first["msg"].removeprefix("Value error, ")
        message = re.sub(r"a valid dictionary or instance of \w+", "an object", message)
        return ApiError(400, f"{param}: {message}" if param else message, param=param)
    if isinstance(exc, TooLong):
        return ApiError(400, str(exc), param=exc.param, code="context_length_exceeded")
    if isinstance(exc, BadField):
        return ApiError(400, str(exc), param=exc.param)
    if isinstance(exc, QueueFull):
        return ApiError(
            429,
            str(exc),
            kind="rate_limit_error",
            code="rate_limit_exceeded",
            headers={"Retry-After": str(max(1, exc.retry_after))},
        )
    if isinstance(exc, UsageError):
        return ApiError(400, str(exc))
    if isinstance(exc, RunnerError):  # the engine failed: the server's fault, said in runner's words
        return ApiError(500, str(exc) or type(exc).__name__, kind="server_error")
    return ApiError(500, "internal error (the server's log has its line)", kind="server_error")


def brief(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {short(exc)}"


def short(exc: BaseException) -> str:
    return str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__


@dataclass(frozen=True)
class ErrorShape:
    """How one API says an error: `body` the error object of a response, `in_stream` the error that
    ends a stream already begun (as that API's clients read one), `claims` the paths it answers ("/api/":
    every path under it; "/v1/messages": that path and those under it)."""

    name: str
    claims: tuple[str, ...]
    body: Callable[[ApiError], dict[str, Any]]
    in_stream: Callable[[ApiError], str]

    def claim(self, path: str) -> bool:
        return any(
            path.startswith(p) if p.endswith("/") else path == p or path.startswith(p + "/")
            for p in self.claims
        )

    def response(self, request: Request, exc: Exception) -> Response:
        """The one way a failure becomes a response: this API's shape, noted for the access line."""
        err = as_api_error(exc)
        expected = isinstance(exc, (ApiError, ValidationError, RunnerError))
        traffic(request).error = err.message if expected else brief(exc)
        return JSONResponse(self.body(err), status_code=err.status, headers=err.headers)


Endpoint = Callable[[Request], Awaitable[Response]]


def guarded(endpoint: Endpoint, shape: ErrorShape) -> Endpoint:
    """A route's endpoint whose every failure is a response in its API's shape, never a bare 500."""

    async def answer(request: Request) -> Response:
        try:
            return await endpoint(request)
        except Exception as exc:
            return shape.response(request, exc)

    return answer
