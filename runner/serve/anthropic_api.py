"""The Anthropic Messages API: /v1/messages and /v1/messages/count_tokens, translated to and from an Ask,
so that the `anthropic` client and the agents built on it work by pointing their base URL at runner.

Content blocks map onto the chat messages the templates read: text joined, `tool_use` as an assistant's
tool calls, `tool_result` as a tool message, `thinking` dropped (the model's own past reasoning is not
shown back to it), `system` (top-level or among the messages) merged into one system message first.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import replace
from typing import Annotated, Any, Literal, Optional, Union

from pydantic import Field, StrictBool, StrictFloat, StrictInt, StrictStr, field_validator, model_validator
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from runner.serve.backend import Ask, Backend, Generation, Outcome
from runner.serve.common import (
    ApiError,
    EventStream,
    Loose,
    TopK,
    TopP,
    as_api_error,
    brief,
    collect,
    error_body,
    finish,
    json_line,
    read_json,
    resolve_model,
    sampling,
    stops,
    submit,
    traffic,
)

STOP_LIMIT = 16  # Anthropic sets no small bound; this one keeps the stop checks cheap
Temperature = Annotated[Optional[StrictFloat], Field(ge=0, le=1)]  # Anthropic's range, not OpenAI's 0-2
UNSERVED = ("image", "document")  # a 400 naming the block: the served models read text


def _text_of(value: Any) -> str:
    """A string, or a list of {"type": "text", "text"} blocks joined by newlines."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(_is_text(block) for block in value):
        return "\n".join(block["text"] for block in value)
    raise ValueError('must be a string or a list of {"type": "text", "text"} blocks')


def _is_text(block: Any) -> bool:
    return isinstance(block, dict) and block.get("type") == "text" and isinstance(block.get("text"), str)


class TextBlock(Loose):
    type: Literal["text"]
    text: StrictStr


class ToolUseBlock(Loose):
    type: Literal["tool_use"]
    id: StrictStr
    name: StrictStr = Field(min_length=1, max_length=256)
    input: dict[str, Any] = Field(default_factory=dict)


class ToolResultBlock(Loose):
    type: Literal["tool_result"]
    tool_use_id: StrictStr
    content: Any = ""
    is_error: Optional[StrictBool] = None

    @field_validator("content")
    @classmethod
    def _content(cls, value: Any) -> str:
        return "" if value is None else _text_of(value)


class ThinkingBlock(Loose):
    type: Literal["thinking", "redacted_thinking"]  # an assistant's past reasoning: not in the prompt


Block = Annotated[Union[TextBlock, ToolUseBlock, ToolResultBlock, ThinkingBlock], Field(discriminator="type")]
WHERE = {ToolUseBlock: "assistant", ToolResultBlock: "user", ThinkingBlock: "assistant"}


class Message(Loose):
    role: Literal["user", "assistant", "system"]  # system: where newer clients put it
    content: list[Block]

    @field_validator("content", mode="before")
    @classmethod
    def _blocks(cls, value: Any) -> Any:
        """A string is one text block; image and document blocks are refused by name."""
        if isinstance(value, str):
            return [{"type": "text", "text": value}]
        if not isinstance(value, list):
            raise ValueError("must be a string or a list of content blocks")
        for i, block in enumerate(value):
            kind = block.get("type") if isinstance(block, dict) else None
            if isinstance(kind, str) and kind in UNSERVED:
                raise ValueError(f"[{i}]: {kind} blocks are not supported (the served models read text)")
        return value

    @model_validator(mode="after")
    def _roles(self) -> Message:
        for i, block in enumerate(self.content):
            if self.role == "system" and not isinstance(block, TextBlock):
                raise ValueError(f"content[{i}]: a system message holds text blocks only")
            if WHERE.get(type(block), self.role) != self.role:
                raise ValueError(f"content[{i}]: {block.type} blocks belong in {WHERE[type(block)]} messages")
        return self


class Tool(Loose):
    type: Optional[StrictStr] = None
    name: StrictStr = Field(min_length=1, max_length=256)
    description: Optional[StrictStr] = None
    input_schema: dict[str, Any]

    @field_validator("type")
    @classmethod
    def _type(cls, value: str | None) -> str | None:
        if value not in (None, "custom"):  # web_search_…, bash_…, text_editor_…: Anthropic's own tools
            raise ValueError(f"{json.dumps(value)[:60]} is not supported: only client tools are served")
        return value


def _function(tool: Tool) -> dict[str, Any]:
    """A tool as an OpenAI function, the shape Ask.tools carries."""
    described = {"description": tool.description} if tool.description is not None else {}
    return {"name": tool.name, **described, "parameters": tool.input_schema}


class ToolChoice(Loose):
    type: Literal["auto", "any", "tool", "none"]
    name: Optional[StrictStr] = None
    disable_parallel_tool_use: Optional[StrictBool] = None  # accepted, not enforced


class Thinking(Loose):
    type: Literal["enabled", "disabled", "adaptive", "between_tools"]  # the last two: the model's default
    budget_tokens: Optional[StrictInt] = Field(default=None, ge=1)  # accepted, not enforced


class OutputFormat(Loose):
    type: Literal["json_schema"]
    schema_: dict[str, Any] = Field(alias="schema")


class OutputConfig(Loose):
    format: Optional[OutputFormat] = None  # structured output, through the grammar sampler
    effort: Any = None  # accepted, without meaning here


class CountRequest(Loose):
    """What shapes the prompt: count_tokens reads only this, /v1/messages the same and more."""

    model: Optional[StrictStr] = None
    system: Any = None
    messages: list[Message] = Field(min_length=1)
    tools: Optional[list[Tool]] = None
    tool_choice: Optional[ToolChoice] = None
    thinking: Optional[Thinking] = None
    output_config: Optional[OutputConfig] = None

    @field_validator("system")
    @classmethod
    def _system(cls, value: Any) -> str | None:
        return None if value is None else _text_of(value)

    def ask(self, model: str, **fields: Any) -> Ask:
        tools = [{"type": "function", "function": _function(tool)} for tool in self.tools or ()]
        output = self.output_config.format if self.output_config else None
        return Ask(
            model=model,
            messages=chat_messages(self.system, self.messages),
            think={"enabled": True, "disabled": False}.get(self.thinking.type) if self.thinking else None,
            tools=tools or None,
            tool_choice=self._tool_choice(),
            json_schema=output.schema_ if output else None,
            **fields,
        )

    def _tool_choice(self) -> str | dict[str, Any] | None:
        """Anthropic's tool_choice in OpenAI's words: any is "required", tool a named function."""
        choice, names = self.tool_choice, {tool.name for tool in self.tools or ()}
        if choice is None or choice.type in ("auto", "none"):
            return choice.type if choice else None
        if not names:
            raise ApiError(400, f"tool_choice: {choice.type!r} needs tools", param="tool_choice")
        if choice.type == "any":
            return "required"
        if choice.name not in names:
            message = f"tool_choice.name: {json.dumps(choice.name)[:60]} is none of the tools given"
            raise ApiError(400, message, param="tool_choice.name")
        return {"type": "function", "function": {"name": choice.name}}


class MessagesRequest(CountRequest):
    max_tokens: StrictInt = Field(ge=1, le=2**31 - 1)  # required, as Anthropic requires it
    stop_sequences: Any = None
    temperature: Temperature = None
    top_p: TopP = None
    top_k: TopK = None
    metadata: Optional[dict[str, Any]] = None  # accepted, without meaning here
    stream: Optional[StrictBool] = None

    @field_validator("stop_sequences")
    @classmethod
    def _stop(cls, value: Any) -> tuple[str, ...]:
        return stops(value, STOP_LIMIT)


def chat_messages(system: str | None, messages: list[Message]) -> list[dict[str, Any]]:
    """Ask.messages: the system texts first as one message, then each turn as the templates read it
    (a user's tool results become tool messages, before the user's own text)."""
    systems = [system] if system else []
    out: list[dict[str, Any]] = []
    names: dict[str, str] = {}  # tool_use id -> the tool's name, for the tool messages that answer it
    for message in messages:
        text = "\n".join(block.text for block in message.content if isinstance(block, TextBlock))
        if message.role == "system":
            systems.append(text)
        elif message.role == "assistant":
            turn: dict[str, Any] = {"role": "assistant", "content": text}
            uses = [block for block in message.content if isinstance(block, ToolUseBlock)]
            if uses:
                names.update((use.id, use.name) for use in uses)
                turn["tool_calls"] = [
                    {"id": u.id, "type": "function", "function": {"name": u.name, "arguments": u.input}}
                    for u in uses
                ]
            out.append(turn)
        else:
            results = [block for block in message.content if isinstance(block, ToolResultBlock)]
            for result in results:
                name = {"name": names[result.tool_use_id]} if result.tool_use_id in names else {}
                content = f"Error: {result.content}" if result.is_error else result.content
                out.append({"role": "tool", "tool_call_id": result.tool_use_id, **name, "content": content})
            if text or not results:
                out.append({"role": "user", "content": text})
    return [{"role": "system", "content": "\n\n".join(systems)}, *out] if systems else out


# -- answers --------------------------------------------------------------------------------


def _id(prefix: str) -> str:
    return prefix + secrets.token_hex(12)


class Stops:
    """A Generation whose answer ends at the first of the request's stop_sequences, matched here (the
    engine says "stop" for an end token and a stop string alike; Anthropic's answer names the string).
    A tail that may begin one is held back; a match cancels the engine's sequence at its next step."""

    def __init__(self, inner: Generation, stop: tuple[str, ...]) -> None:
        self.inner = inner
        self.stop = stop
        self.matched: str | None = None
        self._said: list[str] = []  # the answer's text up to the match
        self.prompt_tokens = inner.prompt_tokens
        self.outcome = inner.outcome  # complete once iteration ended, as the inner one's

    def cancel(self) -> None:
        self.inner.cancel()

    async def wait(self) -> None:
        await self.inner.wait()

    def __aiter__(self) -> AsyncIterator[tuple[str, str]]:
        return self._parts()

    async def _parts(self) -> AsyncIterator[tuple[str, str]]:
        held = ""
        async for kind, text in self.inner:
            if self.matched is not None:
                continue  # what the engine made before it saw the cancel
            if kind != "answer" or not self.stop:
                if held:
                    self._said.append(held)
                    yield "answer", held
                    held = ""
                yield kind, text
                continue
            held += text
            hits = sorted((held.find(s), s) for s in self.stop if s in held)
            if hits:
                (at, self.matched), rest = hits[0], ""
                self.inner.cancel()
            else:
                at = len(held) - max(_overlap(held, s) for s in self.stop)
                rest = held[at:]
            out, held = held[:at], rest
            if out:
                self._said.append(out)
                yield kind, out
        outcome = self.inner.outcome
        if self.matched is not None:
            outcome = replace(outcome, text="".join(self._said), finish_reason="stop")
        self.outcome = outcome
        if held:
            yield "answer", held


def _overlap(text: str, stop: str) -> int:
    """Length of the longest suffix of text that is a proper prefix of stop."""
    return next((n for n in range(min(len(text), len(stop) - 1), 0, -1) if text.endswith(stop[:n])), 0)


def stop_reason(outcome: Outcome, matched: str | None, max_tokens: int) -> str:
    if outcome.tool_calls:
        return "tool_use"
    if matched is not None:
        return "stop_sequence"
    if outcome.finish_reason == "length":  # max_tokens, or the sequence's context full before it
        return "max_tokens" if outcome.completion_tokens >= max_tokens else "model_context_window_exceeded"
    return "end_turn"  # an end token; "interrupted" (the server stopping) too, said in timings


def usage(outcome: Outcome) -> dict[str, int]:
    """Anthropic's split: input_tokens the prompt's evaluated tokens, the reused ones apart (their
    sum, with cache_creation_input_tokens, is the prompt)."""
    return {
        "input_tokens": outcome.prompt_tokens - outcome.cached_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": outcome.cached_tokens,
        "output_tokens": outcome.completion_tokens,
    }


def tool_uses(outcome: Outcome) -> list[dict[str, Any]]:
    """The answer's calls as tool_use blocks, each with an id of its own."""
    calls = outcome.tool_calls
    return [
        {"type": "tool_use", "id": _id("toolu_"), "name": c["name"], "input": c["arguments"]} for c in calls
    ]


def whole(head: dict[str, Any], generation: Stops, max_tokens: int) -> dict[str, Any]:
    outcome = generation.outcome
    content: list[dict[str, Any]] = []
    if outcome.reasoning:
        content.append({"type": "thinking", "thinking": outcome.reasoning, "signature": ""})
    if outcome.text:
        content.append({"type": "text", "text": outcome.text})
    return {
        **head,
        "content": content + tool_uses(outcome),
        "stop_reason": stop_reason(outcome, generation.matched, max_tokens),
        "stop_sequence": generation.matched,
        "usage": usage(outcome),
        "timings": outcome.timings(),
    }


def _event(kind: str, value: dict[str, Any]) -> str:
    return f"event: {kind}\ndata: {json_line({'type': kind, **value})}\n\n"


def _pieces(kind: str, text: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """A part's block as it opens (empty) and the part as that block's delta."""
    if kind == "reasoning":
        delta = {"type": "thinking_delta", "thinking": text}
        return {"type": "thinking", "thinking": "", "signature": ""}, delta
    return {"type": "text", "text": ""}, {"type": "text_delta", "text": text}


async def events(
    request: Request, generation: Stops, head: dict[str, Any], max_tokens: int
) -> AsyncGenerator[str, None]:
    """An answer as Anthropic's Server-Sent Events: message_start, a content block per run of parts
    (thinking, text) and per tool call, message_delta with the stop reason and usage, message_stop.
    Its `finally` cancels an answer the client left."""
    note = traffic(request)
    finished = False
    index, open_kind = -1, ""
    try:
        started = {**head, "content": [], "stop_reason": None, "stop_sequence": None}
        begun = {"input_tokens": generation.prompt_tokens, "output_tokens": 0}
        yield _event("message_start", {"message": {**started, "usage": begun}})
        async for kind, text in generation:
            if not text:
                continue
            empty, delta = _pieces(kind, text)
            if kind != open_kind:
                if open_kind:
                    yield _event("content_block_stop", {"index": index})
                index, open_kind = index + 1, kind
                yield _event("content_block_start", {"index": index, "content_block": empty})
            yield _event("content_block_delta", {"index": index, "delta": delta})
        finished = True
        if open_kind:
            yield _event("content_block_stop", {"index": index})
        outcome = generation.outcome
        for use in tool_uses(outcome):  # whole, at the end: partial_json is the arguments' whole text
            index += 1
            partial = {"type": "input_json_delta", "partial_json": json.dumps(use["input"])}
            yield _event("content_block_start", {"index": index, "content_block": {**use, "input": {}}})
            yield _event("content_block_delta", {"index": index, "delta": partial})
            yield _event("content_block_stop", {"index": index})
        reason = stop_reason(outcome, generation.matched, max_tokens)
        yield _event(
            "message_delta",
            {
                "delta": {"stop_reason": reason, "stop_sequence": generation.matched},
                "usage": usage(outcome),
                "timings": outcome.timings(),
            },
        )
        yield _event("message_stop", {})
    except Exception as exc:  # the stream has begun: the error goes in it, as Anthropic's clients read it
        note.error = brief(exc)
        yield _event("error", {"error": error_body(request.url.path, as_api_error(exc))["error"]})
    finally:
        await finish(note, generation, finished)


# -- routes ---------------------------------------------------------------------------------


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
        ask = req.ask(model, sampling=knobs, max_tokens=req.max_tokens)
        generation = Stops(await submit(self.backend, ask, "messages"), req.stop_sequences or ())
        head = {"id": _id("msg_"), "type": "message", "role": "assistant", "model": model}
        if req.stream:
            return EventStream(events(request, generation, head, req.max_tokens), "text/event-stream")
        await collect(request, [generation])
        return JSONResponse(whole(head, generation, req.max_tokens))

    async def count_tokens(self, request: Request) -> Response:
        """The prompt's tokens as /v1/messages would evaluate the same request (max_tokens not needed)."""
        req = CountRequest.model_validate(await read_json(request, self.max_body))
        ask = req.ask(resolve_model(self.backend, req.model))
        return JSONResponse({"input_tokens": await self.backend.count_tokens(ask)})


def routes(backend: Backend, max_body: int) -> list[Route]:
    api = Anthropic(backend, max_body)
    return [
        Route("/v1/messages", api.messages, methods=["POST"]),
        Route("/v1/messages/count_tokens", api.count_tokens, methods=["POST"]),
    ]
