"""The Ollama API's routes over one backend, each failure said in Ollama's shape (errors.SHAPE).

As Ollama does, answers stream as NDJSON unless `"stream": false`; a chat without messages (or a
generate without a prompt) loads the model, or with `"keep_alive": 0` unloads it (`ollama stop`).
Ollama's model management (pull, push, create, copy, delete) is refused: runner's own commands do that
on the server's machine, never a request.
"""

from __future__ import annotations

import time
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from runner.engine.text.fim import Infill
from runner.serve.backend import Ask, Backend, check_generates
from runner.serve.ollama import serving
from runner.serve.ollama.errors import SHAPE
from runner.serve.ollama.protocol import Base, ChatRequest, EmbeddingsRequest, EmbedRequest, GenerateRequest
from runner.serve.shared.answers import EventStream, collect, submit
from runner.serve.shared.body import read_json, resolve_model
from runner.serve.shared.embeddings import check_dimensions, check_texts, embed
from runner.serve.shared.fields import tool_list
from runner.serve.shared.http import ApiError, guarded, quoted
from runner.serve.shared.images import with_images, with_pixels

# What /api/version says. Ollama's clients gate features on it (structured outputs 0.5, think 0.9),
# so it names the Ollama release whose API this one matches, not runner's own version.
OLLAMA_VERSION = "0.9.0"
NDJSON = "application/x-ndjson"
# Ollama's model management, each refused with what to do instead (403: the request is understood and
# well formed, and repeating it, with any key, changes nothing: a server request never downloads,
# writes or removes a model file)
MANAGEMENT = {
    "/api/pull": "does not download models (a request never does): run `runner pull {model}` where the "
    "server runs",
    "/api/push": "does not push models: a served model is a GGUF file on the server's machine",
    "/api/create": "does not create models: serve a GGUF file (`runner serve FILE.gguf` or `--models DIR`) "
    "with `runner serve`'s sampling flags as its defaults",
    "/api/copy": "does not copy models: each is served under its catalog alias or its file's name",
    "/api/delete": "does not delete models: run `runner rm {model}` where the server runs",
}


class Ollama:
    """The routes, over one backend."""

    def __init__(self, backend: Backend, max_body: int) -> None:
        self.backend = backend
        self.max_body = max_body

    async def chat(self, request: Request) -> Response:
        req = ChatRequest.model_validate(await read_json(request, self.max_body))
        model = resolve_model(self.backend, req.model)
        if not req.messages:
            return await self._load_or_unload(req, model, {"message": serving.chat_message("")})
        messages = [serving.message_of(message, i) for i, message in enumerate(req.messages)]
        ask = serving.ask_of(req, self.backend, model, messages=messages, tools=tool_list(req.tools))
        return await self._answer(request, req, ask, model, chat=True, raw=False)

    async def generate(self, request: Request) -> Response:
        req = GenerateRequest.model_validate(await read_json(request, self.max_body))
        model = resolve_model(self.backend, req.model)
        if not req.prompt:
            return await self._load_or_unload(req, model, {"response": ""})
        refs = serving.image_refs(req.images, "images")
        if req.raw and refs:
            raise ApiError(
                400, "images: not served with raw: true (the images go in the template)", param="raw"
            )
        if req.suffix:  # fill-in-the-middle: the prompt is the prefix (runner.engine.text.fim)
            if refs:
                raise ApiError(400, "images: not served with suffix", param="suffix")
            ask = serving.ask_of(req, self.backend, model, infill=Infill(req.prompt, req.suffix))
            return await self._answer(request, req, ask, model, chat=False, raw=True)
        if req.raw:
            ask = serving.ask_of(req, self.backend, model, prompt=req.prompt)
        else:  # the images first, then the prompt, as one user turn
            system = [{"role": "system", "content": req.system}] if req.system else []
            messages = [*system, {"role": "user", "content": with_images(req.prompt, refs)}]
            ask = serving.ask_of(req, self.backend, model, messages=messages)
        return await self._answer(request, req, ask, model, chat=False, raw=bool(req.raw))

    async def _answer(
        self, request: Request, req: Base, ask: Ask, model: str, *, chat: bool, raw: bool
    ) -> Response:
        """The images decoded (off the event loop), then load the model (the wait is the answer's
        load_duration), submit (a prompt too long is a 400 before any stream), then stream or answer
        whole."""
        check_generates(self.backend.info(model))  # before it loads: a reranker does not generate
        ask = await with_pixels(self.backend, ask)
        load_s = await self.backend.load(model, req.keep_alive)
        generation = await submit(self.backend, ask, "messages" if ask.messages is not None else "prompt")
        if req.stream is not False:  # Ollama streams unless told not to
            lines = serving.lines(request, generation, model, chat=chat, raw=raw, load_s=load_s)
            return EventStream(lines, NDJSON)
        (outcome,) = await collect(request, [generation])
        asked = ask.logprobs is not None
        return JSONResponse(serving.whole(model, outcome, chat=chat, raw=raw, asked=asked, load_s=load_s))

    async def _load_or_unload(self, req: Base, model: str, empty: dict[str, Any]) -> Response:
        """Nothing to answer: Ollama's load (keep_alive as given), or with keep_alive 0 its unload, at
        once if the model is idle, else once its answers end. A model named when the server started
        stays: a 409 says so."""
        if req.keep_alive == 0:
            if not await self.backend.unload(model):
                raise ApiError(
                    409,
                    f"{model} stays loaded while this server runs: it was named when `runner serve` started; "
                    "a server started without naming it loads and unloads it on demand",
                    param="keep_alive",
                )
            return JSONResponse(serving.nothing_to_answer(model, empty, "unload"))
        load_s = await self.backend.load(model, req.keep_alive)
        return JSONResponse(serving.nothing_to_answer(model, empty, "load", load_s))

    async def embed(self, request: Request) -> Response:
        """Unit vectors; a text longer than the embedding context is cut to it (`truncate`, true by
        default, as Ollama has it); an input of "" alone only loads the model."""
        start = time.perf_counter()
        req = EmbedRequest.model_validate(await read_json(request, self.max_body))
        model = resolve_model(self.backend, req.model)
        texts: list[str] = req.input
        check_texts(texts)
        check_dimensions(self.backend, model, req.dimensions)
        load_s = await self.backend.load(model, req.keep_alive)
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
                "load_duration": int(load_s * 1e9),
                "prompt_eval_count": tokens,
            }
        )

    async def embeddings(self, request: Request) -> Response:
        """Ollama's older endpoint: one `prompt`, one unit vector, a text too long a 400 (it has no
        `truncate`); an empty prompt only loads the model."""
        req = EmbeddingsRequest.model_validate(await read_json(request, self.max_body))
        model = resolve_model(self.backend, req.model)
        await self.backend.load(model, req.keep_alive)
        if not req.prompt:
            return JSONResponse({"embedding": []})
        vectors, _ = await embed(request, self.backend, model, [req.prompt], truncate=False, field="prompt")
        return JSONResponse({"embedding": vectors[0]})

    async def refuse(self, request: Request) -> Response:
        """Model management: a 403 saying which runner command does it (MANAGEMENT)."""
        try:
            body = await read_json(request, self.max_body)
        except ApiError:
            body = {}  # refused whatever its body
        name = body.get("model") or body.get("name")
        model = quoted(name) if isinstance(name, str) and name else "MODEL"
        raise ApiError(403, "runner serve " + MANAGEMENT[request.url.path].format(model=model))

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
        shown = {
            "modelfile": "",
            "parameters": "",
            "template": info.template or "",
            "details": serving.details(info),
            "model_info": {str(key): serving.plain(value) for key, value in info.metadata.items()},
            "capabilities": serving.capabilities(info),
            "modified_at": serving.rfc3339(info.modified),
        }
        generates = info.cannot_generate is None  # a reranker, an encoder: no chat to warn about
        if generates and not (info.template or "").strip():  # as the server's start-up said: runner's own
            shown["warnings"] = [f"{info.name} has no chat template: chat messages go as plain text"]
        return JSONResponse(shown)

    async def version(self, request: Request) -> Response:
        return JSONResponse({"version": OLLAMA_VERSION})


def routes(backend: Backend, max_body: int) -> list[Route]:
    api = Ollama(backend, max_body)
    return [
        Route("/api/chat", guarded(api.chat, SHAPE), methods=["POST"]),
        Route("/api/generate", guarded(api.generate, SHAPE), methods=["POST"]),
        Route("/api/embed", guarded(api.embed, SHAPE), methods=["POST"]),
        Route("/api/embeddings", guarded(api.embeddings, SHAPE), methods=["POST"]),
        Route("/api/tags", guarded(api.tags, SHAPE), methods=["GET"]),
        Route("/api/show", guarded(api.show, SHAPE), methods=["POST"]),
        Route("/api/ps", guarded(api.ps, SHAPE), methods=["GET"]),
        Route("/api/version", guarded(api.version, SHAPE), methods=["GET"]),
        *(
            Route(path, guarded(api.refuse, SHAPE), methods=["DELETE" if path == "/api/delete" else "POST"])
            for path in MANAGEMENT
        ),
    ]
