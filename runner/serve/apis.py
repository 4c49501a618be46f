"""The APIs the server speaks, in one place: each one's routes, and which one a path belongs to.

A route's failure is said by its own API (each package wraps its endpoints with its ErrorShape). Where
no route is known (the router's 404 and 405, the API key's 401, the access line's last guard, the
--rpc front's answers while no server is behind it) the path alone says the API: the first shape here
that claims it (Anthropic's /v1/messages, the Responses API's /v1/responses, Ollama's /api/), else
OpenAI's, the shape of /v1/ and of anything else.
"""

from __future__ import annotations

from starlette.routing import Route

from runner.serve import infill, tokens
from runner.serve.anthropic import routes as anthropic_routes
from runner.serve.anthropic.errors import SHAPE as ANTHROPIC
from runner.serve.backend import Backend
from runner.serve.ollama import routes as ollama_routes
from runner.serve.ollama.errors import SHAPE as OLLAMA
from runner.serve.openai import routes as openai_routes
from runner.serve.openai.errors import SHAPE as OPENAI
from runner.serve.responses import routes as responses_routes
from runner.serve.responses.errors import SHAPE as RESPONSES
from runner.serve.responses.store import ResponseStore
from runner.serve.shared.http import ErrorShape

SHAPES = (ANTHROPIC, RESPONSES, OLLAMA, OPENAI)  # the first that claims a path; OpenAI's for the rest


def shape_of(path: str) -> ErrorShape:
    """The error shape of the API a path belongs to, by its path alone."""
    return next((shape for shape in SHAPES if shape.claim(path)), OPENAI)


def routes(backend: Backend, max_body: int, store: ResponseStore | None) -> list[Route]:
    """Every API's routes over one backend (store: where /v1/responses keeps responses)."""
    vocabularies = tokens.Vocabularies(backend)  # each model's vocabulary alone, for the token utilities
    return [
        *openai_routes.routes(backend, max_body),
        *infill.routes(backend, max_body, vocabularies),
        *tokens.routes(backend, max_body, vocabularies),
        *ollama_routes.routes(backend, max_body),
        *anthropic_routes.routes(backend, max_body),
        *responses_routes.routes(backend, max_body, store),
    ]
