"""The OpenAI API: /v1/chat/completions, /v1/completions and /v1/models, translated to and from an Ask.

A request's fields are checked here for shape and range (a 400 naming the field, as OpenAI's own API
does); what only the model knows (a prompt's length in tokens, a schema's grammar) is the backend's.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from collections.abc import AsyncGenerator
from dataclasses import replace
from typing import Any, Literal, Optional

from pydantic import Field, StrictBool, StrictInt, StrictStr, ValidationInfo, field_validator
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from runner.serve.backend import Ask, Backend, Generation, Outcome
from runner.serve.common import (
    SEED_MAX,
    ApiError,
    EventStream,
    Loose,
    MaxTokens,
    MinP,
    Penalty,
    RepeatPenalty,
    Seed,
    Temperature,
    ToolDef,
    TopK,
    TopP,
    as_api_error,
    brief,
    call_arguments,
    collect,
    error_body,
    finish,
    json_line,
    read_json,
    resolve_model,
    sampling,
    schema_of,
    stops,
    submit,
    tool_choice_of,
    tool_list,
    traffic,
)

N_MAX = 16  # answers to one request: each takes a sequence of its own, at most --parallel of them
STOP_LIMIT = 4  # OpenAI's own bound on `stop`: a request that works there works here


class StreamOptions(Loose):
    include_usage: Optional[StrictBool] = None


class ResponseFormat(Loose):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: Any = None
    # llama-server's {"type": "json_object", "schema": {...}}: a schema without the json_schema wrapper
    schema_: Any = Field(default=None, alias="schema")


class Knobs(Loose):
    """The fields chat and completions share: sampling, length, stop strings, output format."""

    model: Optional[StrictStr] = None
    stream: Optional[StrictBool] = None
    stream_options: Optional[StreamOptions] = None
    temperature: Temperature = None
    top_p: TopP = None
    top_k: TopK = None
    min_p: MinP = None
    repeat_penalty: RepeatPenalty = None
    presence_penalty: Penalty = None
    frequency_penalty: Penalty = None
    seed: Seed = None
    max_tokens: MaxTokens = None
    max_completion_tokens: MaxTokens = None
    stop: Any = None
    n: Optional[StrictInt] = None
    logit_bias: Optional[dict[str, Any]] = None
    response_format: Optional[ResponseFormat] = None

    @field_validator("stop")
    @classmethod
    def _stop(cls, value: Any) -> tuple[str, ...]:
        return stops(value, STOP_LIMIT)

    @field_validator("n")
    @classmethod
    def _n(cls, value: int | None) -> int | None:
        if value is not None and not 1 <= value <= N_MAX:
            raise ValueError(f"must be between 1 and {N_MAX} (and at most the server's --parallel)")
        return value

    @field_validator("logit_bias")
    @classmethod
    def _logit_bias(cls, value: dict[str, Any] | None) -> None:
        if value:
            raise ValueError("not supported")
        return None

    def ask(self, model: str, **fields: Any) -> Ask:
        json_schema, json_object = _formats(self.response_format)
        knobs = sampling(
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            min_p=self.min_p,
            repeat_penalty=self.repeat_penalty,
            presence_penalty=self.presence_penalty,
            frequency_penalty=self.frequency_penalty,
            seed=self.seed,
        )
        return Ask(
            model=model,
            sampling=knobs,
            max_tokens=self.max_completion_tokens or self.max_tokens,
            stop=self.stop or (),
            json_schema=json_schema,
            json_object=json_object,
            **fields,
        )


def _formats(value: ResponseFormat | None) -> tuple[dict[str, Any] | None, bool]:
    """response_format as (Ask.json_schema, Ask.json_object)."""
    if value is None or value.type == "text":
        return None, False
    if value.type == "json_object":
        if value.schema_ is not None:
            return schema_of(value.schema_, "response_format"), False
        return None, True
    spec = value.json_schema
    if not isinstance(spec, dict) or "schema" not in spec:
        raise ApiError(
            400, 'response_format.json_schema must be {"name", "schema": {...}}', param="response_format"
        )
    return schema_of(spec["schema"], "response_format"), False


class CallFunction(Loose):
    name: StrictStr
    arguments: Any = None

    @field_validator("arguments")
    @classmethod
    def _arguments(cls, value: Any) -> Any:
        return call_arguments(value)


class ToolCall(Loose):
    id: Optional[StrictStr] = None
    type: Literal["function"] = "function"
    function: CallFunction


class ChatMessage(Loose):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Any = Field(default=None, validate_default=True)
    name: Optional[StrictStr] = None
    tool_calls: Optional[list[ToolCall]] = None
    tool_call_id: Optional[StrictStr] = None
    reasoning_content: Optional[StrictStr] = None

    @field_validator("content")
    @classmethod
    def _content(cls, value: Any, info: ValidationInfo) -> str:
        """A string, or a list of text parts joined; null only from the assistant (a tool call)."""
        if isinstance(value, str):
            return value
        if value is None:
            if info.data.get("role") in ("assistant", None):
                return ""
            raise ValueError("required (null only in an assistant's message)")
        if not isinstance(value, list):
            raise ValueError("must be a string or a list of text parts")
        texts = []
        for part in value:
            kind = part.get("type") if isinstance(part, dict) else None
            if kind != "text" or not isinstance(part.get("text"), str):
                shown = json.dumps(kind)[:40] if isinstance(kind, str) else "a part without a type"
                raise ValueError(f'only {{"type": "text", "text"}} parts are served (got {shown})')
            texts.append(part["text"])
        return "".join(texts)

    def as_dict(self) -> dict[str, Any]:
        """The message as Ask.messages carries it: developer is system, tool calls' arguments dicts."""
        out: dict[str, Any] = {
            "role": "system" if self.role == "developer" else self.role,
            "content": self.content,
        }
        if self.tool_calls:
            out["tool_calls"] = [
                {
                    "id": call.id or _id("call_"),
                    "type": "function",
                    "function": {"name": call.function.name, "arguments": call.function.arguments},
                }
                for call in self.tool_calls
            ]
        for key in ("name", "tool_call_id", "reasoning_content"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        return out


class ChatRequest(Knobs):
    messages: list[ChatMessage] = Field(min_length=1)
    tools: Optional[list[ToolDef]] = None
    tool_choice: Any = None
    logprobs: Optional[StrictBool] = None
    chat_template_kwargs: Optional[dict[str, Any]] = None

    @field_validator("logprobs")
    @classmethod
    def _logprobs(cls, value: bool | None) -> bool | None:
        if value:
            raise ValueError("not supported")
        return value

    def think(self) -> bool | None:
        """llama-server's chat_template_kwargs.enable_thinking, the one template switch served."""
        value = (self.chat_template_kwargs or {}).get("enable_thinking")
        if value is not None and not isinstance(value, bool):
            raise ApiError(
                400, "enable_thinking must be true or false", param="chat_template_kwargs.enable_thinking"
            )
        return value


class CompletionRequest(Knobs):
    prompt: Any
    echo: Optional[StrictBool] = None
    suffix: Optional[StrictStr] = None
    best_of: Optional[StrictInt] = None
    logprobs: Optional[StrictInt] = None

    @field_validator("prompt")
    @classmethod
    def _prompt(cls, value: Any) -> str:
        if isinstance(value, list) and len(value) == 1:
            value = value[0]
        if not isinstance(value, str):
            raise ValueError("must be a string (or a list of one string)")
        return value

    @field_validator("echo", "suffix", "best_of", "logprobs")
    @classmethod
    def _unserved(cls, value: Any, info: ValidationInfo) -> Any:
        if value and not (info.field_name == "best_of" and value == 1):
            raise ValueError("not supported")
        return value


# -- answers --------------------------------------------------------------------------------


def _id(prefix: str) -> str:
    return prefix + secrets.token_hex(12)


def usage(outcomes: list[Outcome]) -> dict[str, Any]:
    """The prompt once (n answers share it), every answer's tokens."""
    first, completion = outcomes[0], sum(o.completion_tokens for o in outcomes)
    return {
        "prompt_tokens": first.prompt_tokens,
        "completion_tokens": completion,
        "total_tokens": first.prompt_tokens + completion,
        "prompt_tokens_details": {"cached_tokens": first.cached_tokens},
    }


def tool_calls(outcome: Outcome) -> list[dict[str, Any]]:
    return [
        {
            "id": _id("call_"),
            "type": "function",
            "function": {"name": call.get("name", ""), "arguments": json.dumps(call.get("arguments", {}))},
        }
        for call in outcome.tool_calls
    ]


def finish_reason(outcome: Outcome) -> str:
    return "tool_calls" if outcome.tool_calls else outcome.finish_reason


def chat_answer(head: dict[str, Any], outcomes: list[Outcome]) -> dict[str, Any]:
    choices = []
    for index, outcome in enumerate(outcomes):
        message: dict[str, Any] = {"role": "assistant", "content": outcome.text}
        if outcome.reasoning:
            message["reasoning_content"] = outcome.reasoning
        if outcome.tool_calls:
            message["content"] = outcome.text or None
            message["tool_calls"] = tool_calls(outcome)
        choices.append(
            {"index": index, "message": message, "logprobs": None, "finish_reason": finish_reason(outcome)}
        )
    return {**head, "object": "chat.completion", "choices": choices, **_tail(outcomes)}


def text_answer(head: dict[str, Any], outcomes: list[Outcome]) -> dict[str, Any]:
    choices = [
        # no template, no channels: the text as the model wrote it
        {"text": o.reasoning + o.text, "index": i, "logprobs": None, "finish_reason": o.finish_reason}
        for i, o in enumerate(outcomes)
    ]
    return {**head, "choices": choices, **_tail(outcomes)}


def _tail(outcomes: list[Outcome]) -> dict[str, Any]:
    timings = outcomes[0].timings() if len(outcomes) == 1 else [o.timings() for o in outcomes]
    return {"usage": usage(outcomes), "timings": timings}


def _sse(value: Any) -> str:
    return f"data: {json_line(value)}\n\n"


async def events(
    request: Request,
    generations: list[Generation],
    head: dict[str, Any],
    *,
    chat: bool,
    include_usage: bool,
) -> AsyncGenerator[str, None]:
    """Answers as Server-Sent Events: a role delta (chat), a delta per part, the finish reason and
    timings, the usage when asked, then [DONE]; n answers interleaved, each chunk naming its index.
    Its `finally` cancels an answer the client left."""
    note = traffic(request)
    finished = [False] * len(generations)
    parts: asyncio.Queue[tuple[int, str | None, str]] = asyncio.Queue()

    async def pump(index: int, generation: Generation) -> None:
        try:
            async for kind, text in generation:
                await parts.put((index, kind, text))
        finally:
            await parts.put((index, None, ""))

    def chunk(index: int, choice: dict[str, Any], **extra: Any) -> str:
        return _sse({**head, "choices": [{"index": index, "logprobs": None, **choice}], **extra})

    def piece(text: str, reasoning: bool = False) -> dict[str, Any]:
        if not chat:
            return {"text": text, "finish_reason": None}
        return {"delta": {"reasoning_content" if reasoning else "content": text}, "finish_reason": None}

    pumps = [asyncio.ensure_future(pump(i, g)) for i, g in enumerate(generations)]
    try:
        if chat:
            for index in range(len(generations)):
                yield chunk(index, {"delta": {"role": "assistant", "content": ""}, "finish_reason": None})
        running = len(generations)
        while running:
            index, kind, text = await parts.get()
            if kind is not None:
                yield chunk(index, piece(text, kind == "reasoning"))
                continue
            running -= 1
            await pumps[index]  # its error, if it ended by one
            finished[index] = True
            outcome = generations[index].outcome
            if chat and outcome.tool_calls:
                calls = [{"index": i, **call} for i, call in enumerate(tool_calls(outcome))]
                yield chunk(index, {"delta": {"tool_calls": calls}, "finish_reason": None})
            end: dict[str, Any] = {"delta": {}} if chat else {"text": ""}
            yield chunk(index, {**end, "finish_reason": finish_reason(outcome)}, timings=outcome.timings())
        if include_usage:
            yield _sse({**head, "choices": [], "usage": usage([g.outcome for g in generations])})
        yield "data: [DONE]\n\n"
    except Exception as exc:  # the stream has begun: the error goes in it, as OpenAI's clients read it
        err = as_api_error(exc)
        note.error = brief(exc)
        yield _sse(error_body(request.url.path, err))
    finally:
        for task in pumps:
            task.cancel()
        for index, generation in enumerate(generations):
            await finish(note, generation, finished[index], also=index)


# -- routes ---------------------------------------------------------------------------------


class OpenAI:
    """The routes, over one backend."""

    def __init__(self, backend: Backend, max_body: int) -> None:
        self.backend = backend
        self.max_body = max_body

    async def chat(self, request: Request) -> Response:
        req = ChatRequest.model_validate(await read_json(request, self.max_body))
        model = resolve_model(self.backend, req.model)
        ask = req.ask(
            model,
            messages=[message.as_dict() for message in req.messages],
            think=req.think(),
            tools=tool_list(req.tools),
            tool_choice=tool_choice_of(req.tool_choice, req.tools),
        )
        head = {
            "id": _id("chatcmpl-"),
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": model,
        }
        return await self._answer(request, req, ask, head, chat=True)

    async def completions(self, request: Request) -> Response:
        req = CompletionRequest.model_validate(await read_json(request, self.max_body))
        model = resolve_model(self.backend, req.model)
        ask = req.ask(model, prompt=req.prompt)
        head = {"id": _id("cmpl-"), "object": "text_completion", "created": int(time.time()), "model": model}
        return await self._answer(request, req, ask, head, chat=False)

    async def _answer(
        self, request: Request, req: Knobs, ask: Ask, head: dict[str, Any], *, chat: bool
    ) -> Response:
        """Submit first (a prompt too long is a 400 before any stream), then stream or answer whole."""
        generations = await self._submit(ask, req.n or 1, "messages" if chat else "prompt")
        if req.stream:
            include_usage = bool(req.stream_options and req.stream_options.include_usage)
            chunks = events(request, generations, head, chat=chat, include_usage=include_usage)
            return EventStream(chunks, "text/event-stream")
        outcomes = await collect(request, generations)
        return JSONResponse(chat_answer(head, outcomes) if chat else text_answer(head, outcomes))

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


def routes(backend: Backend, max_body: int) -> list[Route]:
    api = OpenAI(backend, max_body)
    return [
        Route("/v1/chat/completions", api.chat, methods=["POST"]),
        Route("/v1/completions", api.completions, methods=["POST"]),
        Route("/v1/models", api.models, methods=["GET"]),
        Route("/v1/models/{id:path}", api.model, methods=["GET"]),
    ]
