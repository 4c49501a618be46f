"""The Ollama API: /api/chat, /api/generate, /api/tags, /api/show, /api/ps and /api/version, so that
Ollama's clients work by pointing OLLAMA_HOST at runner.

As Ollama does, answers stream as NDJSON unless `"stream": false`, durations are in nanoseconds, and a
chat without messages (or a generate without a prompt) only says the model is loaded.
"""

from __future__ import annotations

import math
from collections.abc import AsyncGenerator
from datetime import datetime, timezone
from typing import Any, Literal, Optional

from pydantic import Field, StrictBool, StrictInt, StrictStr, ValidationInfo, field_validator
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from runner.errors import InvalidSetting
from runner.limits import parse_duration
from runner.serve.backend import Ask, Backend, Generation, ModelInfo, Outcome
from runner.serve.common import (
    ApiError,
    EventStream,
    Loose,
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
    finish,
    json_line,
    read_json,
    resolve_model,
    sampling,
    schema_of,
    stops,
    submit,
    tool_list,
    traffic,
)

# What /api/version says. Ollama's clients gate features on it (structured outputs 0.5, think 0.9),
# so it names the Ollama release whose API this one matches, not runner's own version.
OLLAMA_VERSION = "0.9.0"
STOP_LIMIT = 16  # Ollama sets no bound; this one keeps the stop checks cheap
NDJSON = "application/x-ndjson"


class Options(Loose):
    temperature: Temperature = None
    top_k: TopK = None
    top_p: TopP = None
    min_p: MinP = None
    seed: Seed = None
    stop: Any = None
    num_predict: Optional[StrictInt] = Field(default=None, ge=-2, le=2**31 - 1)
    repeat_penalty: RepeatPenalty = None
    presence_penalty: Penalty = None
    frequency_penalty: Penalty = None
    num_ctx: Optional[StrictInt] = Field(default=None, ge=1, le=2**31 - 1)

    @field_validator("stop")
    @classmethod
    def _stop(cls, value: Any) -> tuple[str, ...]:
        return stops(value, STOP_LIMIT)

    @field_validator("num_predict")
    @classmethod
    def _num_predict(cls, value: int | None) -> int | None:
        if value == 0:
            raise ValueError("must be -1 (no limit) or at least 1")
        return None if value is None or value < 0 else value


def _no_images(value: list[Any] | None) -> None:
    if value:
        raise ValueError("not supported: the served models read text")
    return None


class Base(Loose):
    """What /api/chat and /api/generate share."""

    model: Optional[StrictStr] = None
    stream: Optional[StrictBool] = None
    options: Optional[Options] = None
    format: Any = None
    think: Any = None
    keep_alive: Any = None  # seconds or "5m": how long the model stays loaded once idle (0: unload now)

    @field_validator("keep_alive")
    @classmethod
    def _keep_alive(cls, value: Any) -> float | None:
        if value is None or value == "":
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise ValueError('must be a number of seconds or a duration such as "5m"')
        try:
            seconds = parse_duration(value, "keep_alive")
        except InvalidSetting as exc:
            raise ValueError(str(exc)) from None
        return -1.0 if seconds is None else seconds

    images: Optional[list[Any]] = None

    @field_validator("format")
    @classmethod
    def _format(cls, value: Any) -> Any:
        if value in (None, "", "json") or isinstance(value, dict):
            return value
        raise ValueError('must be "json" or a JSON Schema object')

    @field_validator("think")
    @classmethod
    def _think(cls, value: Any) -> bool | None:
        if value is None or isinstance(value, bool):
            return value
        if value in ("low", "medium", "high"):  # gpt-oss's levels: thinking on
            return True
        raise ValueError('must be true, false, "low", "medium" or "high"')

    @field_validator("images")
    @classmethod
    def _images(cls, value: list[Any] | None) -> None:
        return _no_images(value)

    def ask(self, backend: Backend, model: str, **fields: Any) -> Ask:
        options = self.options or Options()
        if options.num_ctx is not None and options.num_ctx > (context := backend.info(model).context):
            message = f"options.num_ctx: {options.num_ctx} is over the {context} tokens a sequence has here"
            raise ApiError(400, message, param="options.num_ctx")
        knobs = sampling(
            temperature=options.temperature,
            top_k=options.top_k,
            top_p=options.top_p,
            min_p=options.min_p,
            seed=options.seed,
            repeat_penalty=options.repeat_penalty,
            presence_penalty=options.presence_penalty,
            frequency_penalty=options.frequency_penalty,
        )
        schema = schema_of(self.format, "format") if isinstance(self.format, dict) else None
        return Ask(
            model=model,
            sampling=knobs,
            max_tokens=options.num_predict,
            stop=options.stop or (),
            json_schema=schema,
            json_object=self.format == "json",
            think=self.think,
            keep_alive=self.keep_alive,
            **fields,
        )


class CallFunction(Loose):
    name: StrictStr
    arguments: Any = None

    @field_validator("arguments")
    @classmethod
    def _arguments(cls, value: Any) -> Any:
        return call_arguments(value)


class ToolCall(Loose):
    function: CallFunction


class Message(Loose):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Optional[StrictStr] = None
    thinking: Optional[StrictStr] = None
    images: Optional[list[Any]] = None
    tool_calls: Optional[list[ToolCall]] = None
    tool_name: Optional[StrictStr] = None

    @field_validator("images")
    @classmethod
    def _images(cls, value: list[Any] | None) -> None:
        return _no_images(value)

    def as_dict(self, index: int) -> dict[str, Any]:
        """The message as Ask.messages carries it (OpenAI's names: reasoning_content, tool_calls)."""
        out: dict[str, Any] = {
            "role": "system" if self.role == "developer" else self.role,
            "content": self.content or "",
        }
        if self.thinking:
            out["reasoning_content"] = self.thinking
        if self.tool_calls:
            out["tool_calls"] = [
                {
                    "id": f"call_{index}_{i}",
                    "type": "function",
                    "function": {"name": call.function.name, "arguments": call.function.arguments},
                }
                for i, call in enumerate(self.tool_calls)
            ]
        if self.tool_name is not None:
            out["name"] = self.tool_name
        return out


class ChatRequest(Base):
    messages: Optional[list[Message]] = None
    tools: Optional[list[ToolDef]] = None


class GenerateRequest(Base):
    prompt: Optional[StrictStr] = None
    system: Optional[StrictStr] = None
    raw: Optional[StrictBool] = None
    suffix: Optional[StrictStr] = None
    template: Optional[StrictStr] = None
    context: Optional[list[Any]] = None

    @field_validator("suffix", "template", "context")
    @classmethod
    def _unserved(cls, value: Any, info: ValidationInfo) -> Any:
        if value:
            why = {"context": ": send the conversation to /api/chat", "template": ": the model's own is used"}
            raise ValueError("not supported" + why.get(info.field_name or "", ""))
        return value


# -- answers --------------------------------------------------------------------------------


def rfc3339(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, timezone.utc).isoformat().replace("+00:00", "Z")


def _now() -> str:
    return datetime.now(timezone.utc).isoformat().replace("+00:00", "Z")


def _ns(seconds: float) -> int:
    return int(seconds * 1e9)


def done_fields(outcome: Outcome) -> dict[str, Any]:
    reason = "stop" if outcome.finish_reason == "tool_calls" else outcome.finish_reason
    return {
        "done": True,
        "done_reason": reason,
        "total_duration": _ns(outcome.total_s),
        "load_duration": 0,
        "prompt_eval_count": outcome.prompt_tokens,
        "prompt_eval_duration": _ns(outcome.prefill_s),
        "eval_count": outcome.completion_tokens,
        "eval_duration": _ns(outcome.decode_s),
    }


def tool_calls(outcome: Outcome) -> list[dict[str, Any]]:
    return [
        {"function": {"name": call.get("name", ""), "arguments": call.get("arguments", {})}}
        for call in outcome.tool_calls
    ]


def chat_message(text: str, thinking: str = "", calls: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if thinking:
        message["thinking"] = thinking
    if calls:
        message["tool_calls"] = calls
    return message


def whole(model: str, outcome: Outcome, *, chat: bool, raw: bool) -> dict[str, Any]:
    head = {"model": model, "created_at": _now()}
    if chat:
        return {
            **head,
            "message": chat_message(outcome.text, outcome.reasoning, tool_calls(outcome)),
            **done_fields(outcome),
        }
    if raw:  # no template, no channels: the text as the model wrote it
        return {**head, "response": outcome.reasoning + outcome.text, **done_fields(outcome)}
    thinking = {"thinking": outcome.reasoning} if outcome.reasoning else {}
    return {**head, "response": outcome.text, **thinking, **done_fields(outcome)}


async def lines(
    request: Request, generation: Generation, model: str, *, chat: bool, raw: bool
) -> AsyncGenerator[str, None]:
    """An answer as NDJSON: a line per part, the tool calls, then the done line with the durations.
    Its `finally` cancels an answer the client left."""
    note = traffic(request)
    finished = False

    def line(**fields: Any) -> str:
        return json_line({"model": model, "created_at": _now(), **fields}) + "\n"

    def piece(kind: str, text: str) -> dict[str, Any]:
        thinking = kind == "reasoning" and not raw
        if chat:
            return {"message": chat_message("", text) if thinking else chat_message(text)}
        return {"response": "", "thinking": text} if thinking else {"response": text}

    try:
        async for kind, text in generation:
            yield line(**piece(kind, text), done=False)
        finished = True
        outcome = generation.outcome
        if chat and outcome.tool_calls:
            yield line(message=chat_message("", calls=tool_calls(outcome)), done=False)
        yield line(**({"message": chat_message("")} if chat else {"response": ""}), **done_fields(outcome))
    except Exception as exc:  # the stream has begun: the error goes in it, as Ollama's clients read it
        note.error = brief(exc)
        yield json_line({"error": as_api_error(exc).message}) + "\n"
    finally:
        await finish(note, generation, finished)


def details(info: ModelInfo) -> dict[str, Any]:
    return {
        "parent_model": "",
        "format": "gguf",
        "family": info.architecture,
        "families": [info.architecture],
        "parameter_size": info.parameters,
        "quantization_level": info.quantization,
    }


def _plain(value: Any) -> Any:
    """A metadata value that JSON can carry: non-finite floats as null, anything else odd as text."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, (bool, int, float)):
        return value
    return str(value).encode("utf-8", "replace").decode("utf-8")


def capabilities(info: ModelInfo) -> list[str]:
    """What Ollama's clients look for before they send tools or think: read off the chat template."""
    template = info.template or ""
    found = ["completion"]
    if "tools" in template:
        found.append("tools")
    if "think" in template:
        found.append("thinking")
    return found


# -- routes ---------------------------------------------------------------------------------


class Ollama:
    """The routes, over one backend."""

    def __init__(self, backend: Backend, max_body: int) -> None:
        self.backend = backend
        self.max_body = max_body

    async def chat(self, request: Request) -> Response:
        req = ChatRequest.model_validate(await read_json(request, self.max_body))
        model = resolve_model(self.backend, req.model)
        if not req.messages:
            return JSONResponse(self._loaded(model, {"message": chat_message("")}))
        messages = [message.as_dict(i) for i, message in enumerate(req.messages)]
        ask = req.ask(self.backend, model, messages=messages, tools=tool_list(req.tools))
        return await self._answer(request, req, ask, model, chat=True, raw=False)

    async def generate(self, request: Request) -> Response:
        req = GenerateRequest.model_validate(await read_json(request, self.max_body))
        model = resolve_model(self.backend, req.model)
        if not req.prompt:
            return JSONResponse(self._loaded(model, {"response": ""}))
        if req.raw:
            ask = req.ask(self.backend, model, prompt=req.prompt)
        else:
            system = [{"role": "system", "content": req.system}] if req.system else []
            ask = req.ask(self.backend, model, messages=[*system, {"role": "user", "content": req.prompt}])
        return await self._answer(request, req, ask, model, chat=False, raw=bool(req.raw))

    async def _answer(
        self, request: Request, req: Base, ask: Ask, model: str, *, chat: bool, raw: bool
    ) -> Response:
        """Submit first (a prompt too long is a 400 before any stream), then stream or answer whole."""
        generation = await submit(self.backend, ask, "prompt" if ask.prompt is not None else "messages")
        if req.stream is not False:  # Ollama streams unless told not to
            return EventStream(lines(request, generation, model, chat=chat, raw=raw), NDJSON)
        (outcome,) = await collect(request, [generation])
        return JSONResponse(whole(model, outcome, chat=chat, raw=raw))

    def _loaded(self, model: str, empty: dict[str, Any]) -> dict[str, Any]:
        return {"model": model, "created_at": _now(), **empty, "done": True, "done_reason": "load"}

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
            "modified_at": rfc3339(info.modified),
            "size": info.size,
            "digest": info.sha256 or "",
            "details": details(info),
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
                "details": details(info),
                "model_info": {str(key): _plain(value) for key, value in info.metadata.items()},
                "capabilities": capabilities(info),
                "modified_at": rfc3339(info.modified),
            }
        )

    async def version(self, request: Request) -> Response:
        return JSONResponse({"version": OLLAMA_VERSION})


def routes(backend: Backend, max_body: int) -> list[Route]:
    api = Ollama(backend, max_body)
    return [
        Route("/api/chat", api.chat, methods=["POST"]),
        Route("/api/generate", api.generate, methods=["POST"]),
        Route("/api/tags", api.tags, methods=["GET"]),
        Route("/api/show", api.show, methods=["POST"]),
        Route("/api/ps", api.ps, methods=["GET"]),
        Route("/api/version", api.version, methods=["GET"]),
    ]
