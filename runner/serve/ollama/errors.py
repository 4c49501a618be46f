"""How the Ollama API says an error: {"error": "..."}, and in a stream already begun the same object as
an NDJSON line. Every path under /api/ is Ollama's."""

from __future__ import annotations

from typing import Any

from runner.serve.shared.http import ApiError, ErrorShape, json_line


def body(err: ApiError) -> dict[str, Any]:
    return {"error": err.message}


def in_stream(err: ApiError) -> str:
    return json_line(body(err)) + "\n"


SHAPE = ErrorShape("ollama", ("/api/",), body, in_stream)
