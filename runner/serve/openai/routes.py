"""The OpenAI API's routes over one backend, each failure said in OpenAI's shape (errors.SHAPE)."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from runner.engine.text.fim import Infill
from runner.serve.backend import Ask, Backend, Generation
from runner.serve.openai import embeddings, rerank, serving, transcriptions
from runner.serve.openai.errors import SHAPE
from runner.serve.openai.protocol import ChatRequest, CompletionRequest, Knobs
from runner.serve.shared.answers import EventStream, collect, submit
from runner.serve.shared.body import read_json, resolve_model
from runner.serve.shared.fields import SEED_MAX
from runner.serve.shared.http import ApiError, guarded
from runner.serve.shared.images import with_pixels
from runner.serve.shared.translate import new_id


class OpenAI:
    """The routes, over one backend."""

    def __init__(self, backend: Backend, max_body: int) -> None:
        self.backend = backend
        self.max_body = max_body

    async def chat(self, request: Request) -> Response:
        req = ChatRequest.model_validate(await read_json(request, self.max_body))
        model = resolve_model(self.backend, req.model)
        ask = await with_pixels(self.backend, serving.chat_ask(req, model))  # decoded off the event loop
        head = {
            "id": new_id("chatcmpl-"),
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": model,
        }
        return await self._answer(request, req, ask, head, chat=True)

    async def completions(self, request: Request) -> Response:
        req = CompletionRequest.model_validate(await read_json(request, self.max_body))
        model = resolve_model(self.backend, req.model)
        # echo scores the prompt where logprobs are asked (else it is only written back), or where
        # nothing is generated (max_tokens 0: the prompt alone is the answer)
        scored = bool(req.echo) and (req.logprobs is not None or req.max_tokens == 0)
        if req.suffix is not None:  # fill-in-the-middle: the prompt is the prefix (runner.engine.text.fim)
            ask = serving.ask_of(req, model, infill=Infill(req.prompt, req.suffix))
        else:
            ask = serving.ask_of(req, model, prompt=req.prompt, echo=scored)
        head = {
            "id": new_id("cmpl-"),
            "object": "text_completion",
            "created": int(time.time()),
            "model": model,
        }
        return await self._answer(request, req, ask, head, chat=False)

    async def _answer(
        self, request: Request, req: Knobs, ask: Ask, head: dict[str, Any], *, chat: bool
    ) -> Response:
        """Submit first (a prompt too long is a 400 before any stream), then stream or answer whole."""
        generations = await self._submit(ask, req.n or 1, "messages" if chat else "prompt")
        if req.stream:
            include_usage = bool(req.stream_options and req.stream_options.include_usage)
            chunks = serving.events(request, generations, head, chat=chat, include_usage=include_usage)
            return EventStream(chunks, "text/event-stream")
        outcomes = await collect(request, generations)
        asked = ask.logprobs is not None
        if chat:
            return JSONResponse(serving.chat_answer(head, outcomes, asked_logprobs=asked))
        prompt = (ask.prompt or "") if isinstance(req, CompletionRequest) and req.echo else ""
        return JSONResponse(serving.text_answer(head, outcomes, asked_logprobs=asked, prompt=prompt))

    async def _submit(self, ask: Ask, n: int, param: str) -> list[Generation]:
        """n answers, each in a sequence of its own (a seed given: seed, seed + 1, …, so they differ)."""
        parallel = self.backend.info(ask.model).parallel
        if n > parallel:
            raise ApiError(
                400, f"n={n}: {ask.model} answers {parallel} at once (runner serve --parallel)", param="n"
            )
        generations: list[Generation] = []
        try:
            for i in range(n):
                seed = ask.sampling.get("seed")
                nth = (
                    ask
                    if i == 0 or seed is None
                    else replace(ask, sampling={**ask.sampling, "seed": (seed + i) % (SEED_MAX + 1)})
                )
                generations.append(await submit(self.backend, nth, param))
        except BaseException:
            for generation in generations:
                generation.cancel()
            raise
        return generations

    async def models(self, request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [self._model(name) for name in self.backend.names()]})

    async def model(self, request: Request) -> Response:
        name = request.path_params["id"]
        if not name:  # resolve_model's default (the first model) is for requests that name none
            raise ApiError(404, "GET /v1/models/ needs a model id", kind="not_found_error")
        return JSONResponse(self._model(resolve_model(self.backend, name)))

    def _model(self, name: str) -> dict[str, Any]:
        info = self.backend.info(name)
        loaded = name in self.backend.loaded()
        meta: dict[str, Any] = {"context": info.context, "parallel": info.parallel, "size": info.size}
        meta["loaded"] = loaded
        # it takes images, or audio clips (served with a projector, --mmproj: vision, audio or both)
        meta["vision"] = info.max_images > 0 and info.sees
        meta["audio"] = info.max_images > 0 and info.hears
        meta["rerank"] = info.reranks  # it scores documents against a query (POST /v1/rerank), nothing else
        if loaded:
            meta["memory"] = self.backend.memory(name)  # planned bytes: weights, KV cache, compute
            counters = self.backend.counters(name)
            if "states_bytes" in counters:  # prompt states kept past their sequence (--cache-ram)
                meta["prompt_states"] = {
                    "kept": counters["states_kept"],
                    "restored": counters["states_restored"],
                    "bytes": counters["states_bytes"],
                }
        return {
            "id": name,
            "object": "model",
            "created": int(info.modified),
            "owned_by": "runner",
            "meta": meta,
        }


RERANK_PATHS = ("/v1/rerank", "/v1/reranking", "/rerank")  # llama-server's three names


def routes(backend: Backend, max_body: int) -> list[Route]:
    api = OpenAI(backend, max_body)
    embed = embeddings.Embeddings(backend, max_body)
    ranker = rerank.Rerank(backend, max_body)
    heard = transcriptions.Transcriptions(backend, max_body)
    return [
        Route("/v1/chat/completions", guarded(api.chat, SHAPE), methods=["POST"]),
        Route("/v1/completions", guarded(api.completions, SHAPE), methods=["POST"]),
        Route("/v1/models", guarded(api.models, SHAPE), methods=["GET"]),
        Route("/v1/models/{id:path}", guarded(api.model, SHAPE), methods=["GET"]),
        Route("/v1/embeddings", guarded(embed.create, SHAPE), methods=["POST"]),
        *(Route(path, guarded(ranker.create, SHAPE), methods=["POST"]) for path in RERANK_PATHS),
        Route("/v1/audio/transcriptions", guarded(heard.create, SHAPE), methods=["POST"]),
    ]
