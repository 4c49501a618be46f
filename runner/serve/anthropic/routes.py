"""The Anthropic Messages API's routes over one backend, each failure said in Anthropic's shape
(errors.SHAPE)."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from runner.serve.anthropic import serving
from runner.serve.anthropic.errors import SHAPE
from runner.serve.anthropic.protocol import CountRequest, MessagesRequest
from runner.serve.backend import Backend
from runner.serve.shared.answers import EventStream, collect, submit
from runner.serve.shared.body import read_json, resolve_model
from runner.serve.shared.fields import sampling
from runner.serve.shared.http import guarded
from runner.serve.shared.images import with_pixels
from runner.serve.shared.translate import new_id


class Anthropic:
    """The routes, over one backend."""

    def __init__(self, backend: Backend, max_body: int) -> None:
        self.backend = backend
        self.max_body = max_body

    async def messages(self, request: Request) -> Response:
        """Submit first (a prompt too long is a 400 before any stream), then stream or answer whole."""
        req = MessagesRequest.model_validate(await read_json(request, self.max_body))
        model = resolve_model(self.backend, req.model)
        knobs = sampling(temperature=req.temperature, top_p=req.top_p, top_k=req.top_k)
        stop = req.stop_sequences or ()
        ask = serving.ask_of(req, model, sampling=knobs, max_tokens=req.max_tokens, stop=stop)
        ask = await with_pixels(self.backend, ask)  # decoded off the event loop
        generation = await submit(self.backend, ask, "messages")
        head = {"id": new_id("msg_"), "type": "message", "role": "assistant", "model": model}
        if req.stream:
            return EventStream(serving.events(request, generation, head, req.max_tokens), "text/event-stream")
        (outcome,) = await collect(request, [generation])
        return JSONResponse(serving.whole(head, outcome, req.max_tokens))

    async def count_tokens(self, request: Request) -> Response:
        """The prompt's tokens as /v1/messages would evaluate the same request (max_tokens not needed)."""
        req = CountRequest.model_validate(await read_json(request, self.max_body))
        ask = await with_pixels(self.backend, serving.ask_of(req, resolve_model(self.backend, req.model)))
        return JSONResponse({"input_tokens": await self.backend.count_tokens(ask)})


def routes(backend: Backend, max_body: int) -> list[Route]:
    api = Anthropic(backend, max_body)
    return [
        Route("/v1/messages", guarded(api.messages, SHAPE), methods=["POST"]),
        Route("/v1/messages/count_tokens", guarded(api.count_tokens, SHAPE), methods=["POST"]),
    ]
