"""How the OpenAI API says an error: {"error": {"message", "type", "param", "code"}}, and in a stream
already begun the same object as an event's data. Every path under /v1/ but those another API claims
is OpenAI's (and so is any path no API claims)."""

from __future__ import annotations

from typing import Any

from runner.serve.shared.answers import sse
from runner.serve.shared.http import ApiError, ErrorShape


def body(err: ApiError) -> dict[str, Any]:
    return {"error": {"message": err.message, "type": err.kind, "param": err.param, "code": err.code}}


def in_stream(err: ApiError) -> str:
    return sse(body(err))


SHAPE = ErrorShape("openai", ("/v1/",), body, in_stream)
