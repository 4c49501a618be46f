"""How the Responses API says an error: OpenAI's {"error": {"message", "type", "param", "code"}}, and in
a stream already begun an `error` event {"type": "error", "code", "message", "param"} (the route's
stream adds its sequence_number). /v1/responses and the paths under it are this API's."""

from __future__ import annotations

from typing import Any

from runner.serve.shared.answers import sse
from runner.serve.shared.http import ApiError, ErrorShape


def body(err: ApiError) -> dict[str, Any]:
    return {"error": {"message": err.message, "type": err.kind, "param": err.param, "code": err.code}}


def error_event(err: ApiError) -> dict[str, Any]:
    return {"type": "error", "code": err.code or err.kind, "message": err.message, "param": err.param}


def in_stream(err: ApiError) -> str:
    return sse(error_event(err), "error")


SHAPE = ErrorShape("responses", ("/v1/responses",), body, in_stream)
