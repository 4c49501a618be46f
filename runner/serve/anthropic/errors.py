"""How the Anthropic API says an error: {"type": "error", "error": {"type", "message"}}, the type named
by the status (its clients pick the exception class by the status alone), and in a stream already
begun the same object as an `error` event. /v1/messages and the paths under it are Anthropic's."""

from __future__ import annotations

from typing import Any

from runner.serve.shared.answers import sse
from runner.serve.shared.http import ApiError, ErrorShape

KINDS = {
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    529: "overloaded_error",
}


def body(err: ApiError) -> dict[str, Any]:
    kind = KINDS.get(err.status, "api_error" if err.status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": err.message}}


def in_stream(err: ApiError) -> str:
    return sse(body(err), "error")


SHAPE = ErrorShape("anthropic", ("/v1/messages",), body, in_stream)
