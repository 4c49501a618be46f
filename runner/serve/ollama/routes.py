"""The Ollama API's routes over one backend, each failure said in Ollama's shape (errors.SHAPE).

As Ollama does, answers stream as NDJSON unless `"stream": false`, and a chat without messages (or a
generate without a prompt) only says the model is loaded.
"""

from __future__ import annotations

import time
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from runner.serve.backend import Ask, Backend
from runner.serve.ollama import serving
from runner.serve.ollama.errors import SHAPE
from runner.serve.ollama.protocol import Base, ChatRequest, EmbedRequest, GenerateRequest
from runner.serve.shared.answers import EventStream, collect, submit
from runner.serve.shared.body import read_json, resolve_model
from runner.serve.shared.embeddings import check_dimensions, check_texts, embed
from runner.serve.shared.fields import tool_list
from runner.serve.shared.http import ApiError, guarded

# What /api/version says. Ollama's clients gate features on it (structured outputs 0.5, think 0.9),
# so it names the Ollama release whose API this one matches, not runner's own version.
OLLAMA_VERSION = "0.9.0"
NDJSON = "application/x-ndjson"


class Ollama:
    """The routes, over one backend."""

    def __init__(self, backend: Backend, max_body: int) -> None:
        self.backend = backend
        self.max_body = max_body

    async def chat(self, request: Request) -> Response:
        req = ChatRequest.model_validate(await read_json(request, self.max_body))
        model = resolve_model(self.backend, req.model)
        if not req.messages:
            return JSONResponse(self._loaded(model, {"message": serving.chat_message("")}))
        messages = [serving.message_of(message, i) for i, message in enumerate(req.messages)]
        ask = serving.ask_of(req, self.backend, model, messages=messages, tools=tool_list(req.tools))
        return await self._answer(request, req, ask, model, chat=True, raw=False)

    async def generate(self, request: Request) -> Response:
        req = GenerateRequest.model_validate(await read_json(request, self.max_body))
        model = resolve_model(self.backend, req.model)
        if not req.prompt:
            return JSONResponse(self._loaded(model, {"response": ""}))
        if req.raw:
            ask = serving.ask_of(req, self.backend, model, prompt=req.prompt)
        else:
            system = [{"role": "system", "content": req.system}] if req.system else []
            messages = [*system, {"role": "user", "content": req.prompt}]
            ask = serving.ask_of(req, self.backend, model, messages=messages)
        return await self._answer(request, req, ask, model, chat=False, raw=bool(req.raw))

    async def _answer(
        self, request: Request, req: Base, ask: Ask, model: str, *, chat: bool, raw: bool
    ) -> Response:
        """Submit first (a prompt too long is a 400 before any stream), then stream or answer whole."""
        generation = await submit(self.backend, ask, "prompt" if ask.prompt is not None else "messages")
        if req.stream is not False:  # Ollama streams unless told not to
            return EventStream(serving.lines(request, generation, model, chat=chat, raw=raw), NDJSON)
        (outcome,) = await collect(request, [generation])
        asked = ask.logprobs is not None
        return JSONResponse(serving.whole(model, outcome, chat=chat, raw=raw, asked=asked))

    def _loaded(self, model: str, empty: dict[str, Any]) -> dict[str, Any]:
        return {"model": model, "created_at": serving.now(), **empty, "done": True, "done_reason": "load"}

    async def embed(self, request: Request) -> Response:
        """Unit vectors; a text longer than the embedding context is cut to it (`truncate`, true by
        default, as Ollama has it); an input of "" alone only loads the model."""
        start = time.perf_counter()
        req = EmbedRequest.model_validate(await read_json(request, self.max_body))
        model = resolve_model(self.backend, req.model)
        texts: list[str] = req.input
        check_texts(texts)
        check_dimensions(self.backend, model, req.dimensions)
        vectors: list[list[float]] = []
        tokens = 0
        if texts:
            truncate = req.truncate is not False
            vectors, tokens = await embed(request, self.backend, model, texts, truncate=truncate)
            check_dimensions(self.backend, model, req.dimensions, len(vectors[0]))
        return JSONResponse(
            {
                "model": model,
                "embeddings": vectors,
                "total_duration": int((time.perf_counter() - start) * 1e9),
                "load_duration": 0,
                "prompt_eval_count": tokens,
            }
        )

    async def tags(self, request: Request) -> Response:
        return JSONResponse({"models": [self._entry(name) for name in self.backend.names()]})

    async def ps(self, request: Request) -> Response:
        if not self.backend.ready():
            return JSONResponse({"models": []})
        models = []
        for name in self.backend.loaded():
            info, memory = self.backend.info(name), self.backend.memory(name)
            models.append(
                {
                    **self._entry(name),
                    "size": memory or info.size,
                    "size_vram": 0,
                    "context_length": info.context,
                }
            )
        return JSONResponse({"models": models})

    def _entry(self, name: str) -> dict[str, Any]:
        info = self.backend.info(name)
        return {
            "name": name,
            "model": name,
            "modified_at": serving.rfc3339(info.modified),
            "size": info.size,
            "digest": info.sha256 or "",
            "details": serving.details(info),
        }

    async def show(self, request: Request) -> Response:
        body = await read_json(request, self.max_body)
        name = body.get("model") or body.get("name")
        if not name:
            raise ApiError(400, "model is required", param="model")
        info = self.backend.info(resolve_model(self.backend, name))
        return JSONResponse(
            {
                "modelfile": "",
                "parameters": "",
                "template": info.template or "",
                "details": serving.details(info),
                "model_info": {str(key): serving.plain(value) for key, value in info.metadata.items()},
                "capabilities": serving.capabilities(info),
                "modified_at": serving.rfc3339(info.modified),
            }
        )

    async def version(self, request: Request) -> Response:
        return JSONResponse({"version": OLLAMA_VERSION})


def routes(backend: Backend, max_body: int) -> list[Route]:
    api = Ollama(backend, max_body)
    return [
        Route("/api/chat", guarded(api.chat, SHAPE), methods=["POST"]),
        Route("/api/generate", guarded(api.generate, SHAPE), methods=["POST"]),
        Route("/api/embed", guarded(api.embed, SHAPE), methods=["POST"]),
        Route("/api/tags", guarded(api.tags, SHAPE), methods=["GET"]),
        Route("/api/show", guarded(api.show, SHAPE), methods=["POST"]),
        Route("/api/ps", guarded(api.ps, SHAPE), methods=["GET"]),
        Route("/api/version", guarded(api.version, SHAPE), methods=["GET"]),
    ]
