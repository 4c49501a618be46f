"""A request's body, read within bounds, and the model it names.

Every request is untrusted: its body is bounded before it is parsed, its JSON bounded in depth and
checked for text that is not Unicode, and a model name is only ever compared against the served names.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Iterable
from typing import Any

from starlette.requests import ClientDisconnect, Request

from runner.serve.backend import Backend
from runner.serve.shared.http import ApiError, quoted, short

MAX_DEPTH = 64  # JSON nesting a request may use: deeper is a 400, so nothing below recurses past it
PARSE_HERE = 256 << 10  # a body larger than this is parsed in a worker thread (the event loop goes on)


async def read_json(request: Request, max_body: int) -> dict[str, Any]:
    """The body as a JSON object: 413 past max_body (by Content-Length, then while reading), 400 when
    it is not JSON, not an object, nested deeper than MAX_DEPTH or holds text that is not Unicode."""
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.isdigit():
            raise ApiError(400, "Content-Length is not a number")
        if int(declared) > max_body:
            raise ApiError(413, too_large(max_body, int(declared)), code="body_too_large")
    chunks: list[bytes] = []
    size = 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > max_body:
                raise ApiError(413, too_large(max_body), code="body_too_large")
            chunks.append(chunk)
    except ClientDisconnect:
        raise ApiError(400, "the client left before its body arrived") from None
    if size > PARSE_HERE:  # images in it, most likely: megabytes of JSON parsed off the event loop
        return await asyncio.to_thread(_parsed, b"".join(chunks))
    return _parsed(b"".join(chunks))


def too_large(max_body: int, declared: int | None = None) -> str:
    """A 413's words: the bound in bytes with its digits grouped (and in MB), the size declared if
    it was."""
    bound = f"{max_body:,} bytes" + (f" ({max_body / 1e6:.1f} MB)" if max_body >= 1_000_000 else "")
    said = f"the body is {declared:,} bytes, over" if declared is not None else "the body is over"
    return f"{said} the {bound} a request may be here"


def _parsed(raw: bytes) -> dict[str, Any]:
    try:
        body = json.loads(raw, parse_constant=_no_constant, parse_float=_finite)
    except (ValueError, RecursionError) as exc:
        raise ApiError(400, f"the body is not valid JSON ({short(exc)})") from None
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
