"""What the APIs share: the request body read within bounds, the fields they have in common, errors
in each API's own shape, and the two ways an answer leaves (whole, or streamed until the client leaves).

Every request is untrusted: its body is bounded before it is parsed, its JSON bounded in depth, and a
model name is only ever compared against the served names.
"""

from __future__ import annotations

import contextlib
import json
import math
import re
import time
from collections.abc import AsyncGenerator, Iterable
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Optional

import anyio
from pydantic import BaseModel, ConfigDict, Field, StrictFloat, StrictInt, StrictStr, ValidationError
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from runner.errors import RunnerError, UsageError
from runner.serve.backend import Ask, Backend, BadField, Generation, Outcome, QueueFull, TooLong

MAX_DEPTH = 64  # JSON nesting a request may use: deeper is a 400, so nothing below recurses past it
SEED_MAX = 2**32 - 2  # llama.cpp's seeds are uint32; 0xFFFFFFFF means "random"
TRAFFIC = "runner.traffic"  # the scope key of a request's Traffic (app.AccessLog puts it there)

# Sampling fields, the ranges SamplingConfig takes (a value outside is a 400 naming the field).
Temperature = Annotated[Optional[StrictFloat], Field(ge=0, le=2)]
TopP = Annotated[Optional[StrictFloat], Field(gt=0, le=1)]
TopK = Annotated[Optional[StrictInt], Field(ge=0, le=2**31 - 1)]
MinP = Annotated[Optional[StrictFloat], Field(ge=0, le=1)]
RepeatPenalty = Annotated[Optional[StrictFloat], Field(gt=0, le=10)]
Penalty = Annotated[Optional[StrictFloat], Field(ge=-2, le=2)]
Seed = Annotated[Optional[StrictInt], Field(ge=-(2**63), le=2**64 - 1)]
MaxTokens = Annotated[Optional[StrictInt], Field(ge=1, le=2**31 - 1)]


CANCEL_WAIT_S = 5.0  # a cancelled answer ends at the engine's next step: this is a bound, not a wait


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


@dataclass
class Traffic:
    """What a request's access line says, filled in as the request goes."""

    start: float
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    ttft_s: float | None = None
    finish: str | None = None
    error: str | None = None


def traffic(request: Request) -> Traffic:
    found = request.scope.get(TRAFFIC)
    if isinstance(found, Traffic):
        return found
    request.scope[TRAFFIC] = fresh = Traffic(time.perf_counter())  # no AccessLog above (a bare router)
    return fresh


def quoted(value: str, limit: int = 100) -> str:
    """A string from a request, safe to put in a message or a log line: JSON-quoted, cut at limit."""
    return json.dumps(value[:limit] + ("…" if len(value) > limit else ""))


# -- the body ---------------------------------------------------------------------------------


async def read_json(request: Request, max_body: int) -> dict[str, Any]:
    """The body as a JSON object: 413 past max_body (by Content-Length, then while reading), 400 when
    it is not JSON, not an object, nested deeper than MAX_DEPTH or holds text that is not Unicode."""
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.isdigit():
            raise ApiError(400, "Content-Length is not a number")
        if int(declared) > max_body:
            raise ApiError(413, f"the body is over {max_body} bytes", code="body_too_large")
    chunks: list[bytes] = []
    size = 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > max_body:
                raise ApiError(413, f"the body is over {max_body} bytes", code="body_too_large")
            chunks.append(chunk)
    except ClientDisconnect:
        raise ApiError(400, "the client left before its body arrived") from None
    try:
        body = json.loads(b"".join(chunks), parse_constant=_no_constant, parse_float=_finite)
    except (ValueError, RecursionError) as exc:
        raise ApiError(400, f"the body is not valid JSON ({_short(exc)})") from None
    if not isinstance(body, dict):
        raise ApiError(400, "the body must be a JSON object")
    _check_tree(body)
    return body


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text} is out of range")
    return value


def _check_tree(body: Any) -> None:
    """Walk the parsed body once, without recursion: depth bounded, every string encodable as UTF-8
    (a lone surrogate from a \\ud800 escape would fail later, in the tokenizer or the reply)."""
    stack: list[tuple[Any, int]] = [(body, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise ApiError(400, f"the body is nested deeper than {MAX_DEPTH} levels")
        items: Iterable[Any]
        if isinstance(node, dict):
            items = [*node.keys(), *node.values()]
        elif isinstance(node, list):
            items = node
        else:
            items = (node,) if isinstance(node, str) else ()
        for item in items:
            if isinstance(item, str):
                try:
                    item.encode("utf-8")
                except UnicodeEncodeError:
                    raise ApiError(400, "the body holds a lone surrogate (\\ud800-\\udfff)") from None
            elif isinstance(item, (dict, list)):
                stack.append((item, depth + 1))


def _short(exc: BaseException) -> str:
    return str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__


# -- fields shared by both APIs ------------------------------------------------------------------


def sampling(**values: Any) -> dict[str, Any]:
    """Ask.sampling from the fields a request set: unset ones left to the model's defaults.

    A negative seed asks for a random one (llama-server's -1); a seed past uint32 is folded into it,
    so any int64 a client sends gives a repeatable answer.
    """
    out = {name: value for name, value in values.items() if value is not None}
    seed = out.pop("seed", None)
    if seed is not None and seed >= 0:
        out["seed"] = seed % (SEED_MAX + 1)
    return out


def stops(value: Any, limit: int) -> tuple[str, ...]:
    """`stop` as a string or a list of at most `limit` strings (empty ones dropped); ValueError else."""
    if value is None:
        return ()
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(s, str) for s in items):
        raise ValueError("must be a string or a list of strings")
    if len(items) > limit:
        raise ValueError(f"at most {limit} stop strings are served (got {len(items)})")
    if any(len(s) > 1000 for s in items):
        raise ValueError("a stop string is over 1000 characters")
    return tuple(s for s in items if s)


class Loose(BaseModel):
    """A request object: unknown fields ignored (clients send many), known ones checked for type."""

    model_config = ConfigDict(extra="ignore")


class FunctionDef(Loose):
    name: StrictStr = Field(min_length=1, max_length=256)
    description: Optional[StrictStr] = None
    parameters: Optional[dict[str, Any]] = None


class ToolDef(Loose):
    """A tool the model may call, in the shape both APIs share (OpenAI's, which Ollama copied)."""

    type: Literal["function"] = "function"
    function: FunctionDef


def tool_list(tools: list[ToolDef] | None) -> list[dict[str, Any]] | None:
    return [tool.model_dump(exclude_none=True) for tool in tools] if tools else None


def tool_choice_of(value: Any, tools: list[ToolDef] | None) -> str | dict[str, Any] | None:
    """tool_choice checked: "auto" | "none" | "required" | {"function": {"name"}} naming a given tool."""
    names = {tool.function.name for tool in tools or ()}
    if value is None or value in ("auto", "none"):
        return value
    if value == "required" and names:
        return "required"
    if isinstance(value, dict) and isinstance(value.get("function"), dict):
        name = value["function"].get("name")
        if isinstance(name, str) and name in names:
            return {"type": "function", "function": {"name": name}}
    message = 'tool_choice must be "auto", "none", "required" or {"type": "function", "function": {"name"}}'
    raise ApiError(400, f"{message} naming one of the tools given", param="tool_choice")


def call_arguments(value: Any) -> Any:
    """A tool call's arguments as the templates read them: a JSON object's text parsed to a dict."""
    if value is None or value == "":
        return {}
    if isinstance(value, str):
        try:
            parsed = json.loads(value)
        except ValueError:
            return value
        return parsed if isinstance(parsed, dict) else value
    if isinstance(value, dict):
        return value
    raise ValueError("arguments must be a JSON object or its text")


def schema_of(value: Any, param: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ApiError(400, f"{param} must be a JSON Schema object", param=param)
    return value


def resolve_model(backend: Backend, name: Any) -> str:
    """The served model a request names: exact, or with Ollama's ":latest" tag; none named: the first.
    Anything else is a 404 listing the served names: a name never reads a file or fetches one."""
    names = backend.names()
    if name is None or name == "":
        if names:
            return names[0]
        raise ApiError(503, "no model is served yet", kind="server_error")
    if not isinstance(name, str):
        raise ApiError(400, "model must be a string", param="model")
    if name in names:
        return name
    if name.endswith(":latest") and name[: -len(":latest")] in names:
        return name[: -len(":latest")]
    served = ", ".join(names) or "none"
    raise ApiError(
        404,
        f"model {quoted(name)} is not served here; served: {served}",
        param="model",
        kind="not_found_error",
        code="model_not_found",
    )


# -- errors ---------------------------------------------------------------------------------


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


def is_ollama(path: str) -> bool:
    return path.startswith("/api/")


def is_anthropic(path: str) -> bool:
    return path == "/v1/messages" or path.startswith("/v1/messages/")


# Anthropic names an error by its status (its clients pick the exception class by the status alone).
ANTHROPIC_KINDS = {
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    529: "overloaded_error",
}


def error_body(path: str, err: ApiError) -> dict[str, Any]:
    """The error in the shape of the API its path belongs to."""
    if is_ollama(path):
        return {"error": err.message}
    if is_anthropic(path):
        kind = ANTHROPIC_KINDS.get(err.status, "api_error" if err.status >= 500 else "invalid_request_error")
        return {"type": "error", "error": {"type": kind, "message": err.message}}
    return {"error": {"message": err.message, "type": err.kind, "param": err.param, "code": err.code}}


def error_response(request: Request, exc: Exception) -> Response:
    """The one way any failure becomes a response: the API's shape (by path), noted for the access line."""
    err = as_api_error(exc)
    expected = isinstance(exc, (ApiError, ValidationError, RunnerError))
    traffic(request).error = err.message if expected else brief(exc)
    return JSONResponse(error_body(request.url.path, err), status_code=err.status, headers=err.headers)


def brief(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {_short(exc)}"


# -- answers --------------------------------------------------------------------------------


async def submit(backend: Backend, ask: Ask, param: str) -> Generation:
    """backend.submit, before any response starts: a prompt too long is a 400 naming `param`."""
    try:
        return await backend.submit(ask)
    except TooLong as exc:
        raise ApiError(400, str(exc), param=param, code="context_length_exceeded") from None


async def finish(note: Traffic, generation: Generation, finished: bool, *, also: int = 0) -> None:
    """An answer's end, whichever way: cancelled if it did not run out (and waited for, a few seconds at
    most, so the log says what it had made), its figures noted for the log (`also`: this is one more of
    a request's n answers, its completion added to the others')."""
    if not finished:
        generation.cancel()
        with anyio.CancelScope(shield=True), anyio.move_on_after(CANCEL_WAIT_S):
            await generation.wait()
    note.prompt_tokens = generation.prompt_tokens
    outcome = generation.outcome
    before = (note.completion_tokens or 0) if also else 0
    note.completion_tokens = outcome.completion_tokens + before
    note.ttft_s = outcome.ttft_s if not also else min(note.ttft_s or outcome.ttft_s, outcome.ttft_s)
    note.finish = outcome.finish_reason if finished else "cancelled"


async def collect(request: Request, generations: list[Generation]) -> list[Outcome]:
    """Whole answers: drain the generations, cancelling them if the client leaves before they are done."""
    note = traffic(request)
    finished = [False] * len(generations)
    errors: list[Exception] = []

    async def watch() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass
        for generation in generations:
            generation.cancel()

    async def drain(i: int, generation: Generation) -> None:
        try:
            async for _ in generation:
                pass
            finished[i] = True
        except Exception as exc:  # raised below, outside the task group (no ExceptionGroup)
            errors.append(exc)

    try:
        async with anyio.create_task_group() as group:
            group.start_soon(watch)
            async with anyio.create_task_group() as answers:
                for i, generation in enumerate(generations):
                    answers.start_soon(drain, i, generation)
            group.cancel_scope.cancel()
    finally:
        for i, generation in enumerate(generations):
            await finish(note, generation, finished[i], also=i)
    if errors:
        raise errors[0]
    return [generation.outcome for generation in generations]


class EventStream(StreamingResponse):
    """A stream that always notices the client leaving, whatever the server's ASGI version, and always
    closes its generator, so the generator's `finally` cancels the answer and frees its sequence."""

    def __init__(self, chunks: AsyncGenerator[str, None], media_type: str) -> None:
        super().__init__(chunks, media_type=media_type, headers={"Cache-Control": "no-cache"})
        self.chunks = chunks

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            async with anyio.create_task_group() as group:

                async def stream() -> None:
                    with contextlib.suppress(OSError):  # the client left (ASGI 2.4 servers say so on send)
                        await self.stream_response(send)
                    group.cancel_scope.cancel()

                group.start_soon(stream)
                await self.listen_for_disconnect(receive)
                group.cancel_scope.cancel()
        finally:
            with anyio.CancelScope(shield=True):
                await self.chunks.aclose()


def json_line(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
