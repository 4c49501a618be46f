"""The Anthropic Messages API's requests as the engine's Ask, and its answers back: whole (a message of
content blocks) or as Anthropic's Server-Sent Events.

Content blocks map onto the chat messages the templates read: text joined, `tool_use` as an assistant's
tool calls, `tool_result` as a tool message, `thinking` dropped (the model's own past reasoning is not
shown back to it), `system` (top-level or among the messages) merged into one system message first.
The stop sequence an answer names is the one the engine stopped at (Outcome.stop_sequence).
"""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncGenerator
from typing import Any

from starlette.requests import Request

from runner.errors import ImageError
from runner.images import sniff
from runner.serve.anthropic import errors
from runner.serve.anthropic.protocol import (
    CountRequest,
    ImageBlock,
    Message,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from runner.serve.backend import Ask, Generation, Outcome
from runner.serve.shared.answers import Drained, sse, streamed
from runner.serve.shared.http import ApiError
from runner.serve.shared.images import ImageRef, Part, joined
from runner.serve.shared.translate import (
    NoSuchTool,
    NoTools,
    function_tool,
    new_id,
    past_call,
    tool_choice,
    with_system,
)

# -- requests -------------------------------------------------------------------------------------

# the image media types Anthropic's API takes, by the format runner.images sniffs (BMP is not one)
MEDIA_TYPES = {"JPEG": "image/jpeg", "PNG": "image/png", "GIF": "image/gif", "WEBP": "image/webp"}


def ask_of(req: CountRequest, model: str, **fields: Any) -> Ask:
    """What shapes the prompt, as an Ask (`fields`: sampling, length and stop strings, for /v1/messages)."""
    tools = [function_tool(tool.name, tool.description, tool.input_schema) for tool in req.tools or ()]
    output = req.output_config.format if req.output_config else None
    return Ask(
        model=model,
        messages=chat_messages(req.system, req.messages),
        think={"enabled": True, "disabled": False}.get(req.thinking.type) if req.thinking else None,
        reasoning_budget=req.thinking.budget_tokens
        if req.thinking and req.thinking.type == "enabled"
        else None,
        tools=tools or None,
        tool_choice=tool_choice_of(req),
        json_schema=output.schema_ if output else None,
        **fields,
    )


def tool_choice_of(req: CountRequest) -> str | dict[str, Any] | None:
    """Anthropic's tool_choice in the Ask's words: any is "required", tool a named function."""
    choice = req.tool_choice
    if choice is None:
        return None
    kind = {"any": "required", "tool": "function"}.get(choice.type, choice.type)
    try:
        return tool_choice(kind, choice.name, (tool.name for tool in req.tools or ()))
    except NoTools:
        raise ApiError(400, f"tool_choice: {choice.type!r} needs tools", param="tool_choice") from None
    except NoSuchTool:
        message = f"tool_choice.name: {json.dumps(choice.name)[:60]} is none of the tools given"
        raise ApiError(400, message, param="tool_choice.name") from None


def chat_messages(system: str | None, messages: list[Message]) -> list[dict[str, Any]]:
    """Ask.messages: the system texts first as one message, then each turn as the templates read it
    (a user's tool results become tool messages, before the user's own text and images, joined as
    llama-server joins a message's parts)."""
    systems = [system] if system else []
    out: list[dict[str, Any]] = []
    names: dict[str, str] = {}  # tool_use id -> the tool's name, for the tool messages that answer it
    for i, message in enumerate(messages):
        parts: list[Part] = []
        for j, block in enumerate(message.content):
            if isinstance(block, TextBlock):
                parts.append(block.text)
            elif isinstance(block, ImageBlock):
                parts.append(image_ref(block.source, f"messages[{i}].content[{j}].source"))
        content = joined(parts)
        text = content if isinstance(content, str) else ""
        if message.role == "system":
            systems.append(text)
        elif message.role == "assistant":
            turn: dict[str, Any] = {"role": "assistant", "content": text}
            uses = [block for block in message.content if isinstance(block, ToolUseBlock)]
            if uses:
                names.update((use.id, use.name) for use in uses)
                turn["tool_calls"] = [past_call(use.id, use.name, use.input) for use in uses]
            out.append(turn)
        else:
            results = [block for block in message.content if isinstance(block, ToolResultBlock)]
            for result in results:
                name = {"name": names[result.tool_use_id]} if result.tool_use_id in names else {}
                said = f"Error: {result.content}" if result.is_error else result.content
                out.append({"role": "tool", "tool_call_id": result.tool_use_id, **name, "content": said})
            if content or not results:
                out.append({"role": "user", "content": content})
    return with_system(systems, out)


def image_ref(source: Any, field: str) -> ImageRef:
    """An image block's source: base64 (with its media_type) to decode; a URL is refused when it would
    be decoded (nothing is fetched); a file (Files API) is not served."""
    kind = source.get("type") if isinstance(source, dict) else None
    if isinstance(source, dict) and kind == "base64":
        data, media = source.get("data"), source.get("media_type")
        if not isinstance(data, str) or not isinstance(media, (str, type(None))):
            message = f'{field}: a base64 source is {{"media_type": "image/png", "data": "..."}}'
            raise ApiError(400, message, param=field)
        _check_media(media, data, field)
        return ImageRef(f"{field}.data", f"data:{media};base64,{data}")
    if isinstance(source, dict) and kind == "url" and isinstance(source.get("url"), str):
        return ImageRef(f"{field}.url", source["url"])
    said = json.dumps(kind)[:60] if isinstance(kind, str) else "a source without a type"
    message = f'{field}.type: {said} sources are not served: send the image as base64 ("type": "base64")'
    raise ApiError(400, message, param=f"{field}.type")


def _check_media(media: str | None, data: str, field: str) -> None:
    """As Anthropic's API: a media type, one of its four, and bytes of that format (PNG bytes sent as
    image/jpeg are a 400 there). The format is read from the base64's first characters alone, on the
    event loop; bytes that are no image are left to the decoding, which says what they look like."""
    if media is None:
        raise ApiError(400, f"{field}.media_type: Field required", param=f"{field}.media_type")
    if media not in MEDIA_TYPES.values():
        allowed = ", ".join(repr(m) for m in MEDIA_TYPES.values())
        message = f"{field}.media_type: Input should be one of {allowed} (got {json.dumps(media)[:60]})"
        raise ApiError(400, message, param=f"{field}.media_type")
    head = "".join(data[:256].split())[:32]
    try:
        kind = sniff(base64.b64decode(head[: len(head) // 4 * 4], validate=True), field)
    except (ImageError, ValueError):
        return
    found = MEDIA_TYPES.get(kind, f"image/{kind.lower()}")
    if found != media:
        message = f"{field}.data: the image's bytes are {found}, not the {media} its media_type says"
        raise ApiError(400, message, param=f"{field}.media_type")


# -- answers --------------------------------------------------------------------------------------


def cut_short(outcome: Outcome) -> ApiError | None:
    """Anthropic has no stop reason for an answer the server cut short, and `end_turn` would pass it
    off as complete: a whole answer is an error response instead, a stream ends with an error event
    after the text it sent (as Anthropic's API ends a stream that fails midway)."""
    if outcome.finish_reason == "interrupted":  # the server stopping (Ctrl-C, SIGTERM)
        why = "the server is stopping"
        return ApiError(503, f"the answer was cut short after {outcome.completion_tokens} tokens: {why}")
    if outcome.finish_reason == "error":
        why = outcome.error or "the engine failed"
        return ApiError(500, f"the answer was cut short after {outcome.completion_tokens} tokens: {why}")
    return None


def stop_reason(outcome: Outcome, max_tokens: int) -> str:
    if outcome.tool_calls:
        return "tool_use"
    if outcome.stop_sequence is not None:
        return "stop_sequence"
    if outcome.finish_reason == "length":  # max_tokens, or the sequence's context full before it
        return "max_tokens" if outcome.completion_tokens >= max_tokens else "model_context_window_exceeded"
    return "end_turn"  # an end token (an answer cut short is an error: cut_short)


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
        {"type": "tool_use", "id": new_id("toolu_"), "name": c["name"], "input": c["arguments"]}
        for c in calls
    ]


def whole(head: dict[str, Any], outcome: Outcome, max_tokens: int) -> dict[str, Any]:
    if (failure := cut_short(outcome)) is not None:
        raise failure
    content: list[dict[str, Any]] = []
    if outcome.reasoning:
        content.append({"type": "thinking", "thinking": outcome.reasoning, "signature": ""})
    if outcome.text:
        content.append({"type": "text", "text": outcome.text})
    return {
        **head,
        "content": content + tool_uses(outcome),
        "stop_reason": stop_reason(outcome, max_tokens),
        "stop_sequence": outcome.stop_sequence,
        "usage": usage(outcome),
        "timings": outcome.timings(),
    }


def _event(kind: str, value: dict[str, Any]) -> str:
    return sse({"type": kind, **value}, kind)


def _pieces(kind: str, text: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """A part's block as it opens (empty) and the part as that block's delta."""
    if kind == "reasoning":
        delta = {"type": "thinking_delta", "thinking": text}
        return {"type": "thinking", "thinking": "", "signature": ""}, delta
    return {"type": "text", "text": ""}, {"type": "text_delta", "text": text}


def events(
    request: Request, generation: Generation, head: dict[str, Any], max_tokens: int
) -> AsyncGenerator[str, None]:
    """An answer as Anthropic's Server-Sent Events: message_start, a content block per run of parts
    (thinking, text) and per tool call, message_delta with the stop reason and usage, message_stop."""

    async def chunks(answers: list[Drained]) -> AsyncGenerator[str, None]:
        (answer,) = answers
        index, open_kind = -1, ""
        started = {**head, "content": [], "stop_reason": None, "stop_sequence": None}
        begun = {"input_tokens": answer.prompt_tokens, "output_tokens": 0}
        yield _event("message_start", {"message": {**started, "usage": begun}})
        async for kind, text in answer:
            if not text:
                continue
            empty, delta = _pieces(kind, text)
            if kind != open_kind:
                if open_kind:
                    yield _event("content_block_stop", {"index": index})
                index, open_kind = index + 1, kind
                yield _event("content_block_start", {"index": index, "content_block": empty})
            yield _event("content_block_delta", {"index": index, "delta": delta})
        if open_kind:
            yield _event("content_block_stop", {"index": index})
        outcome = answer.outcome
        if (failure := cut_short(outcome)) is not None:
            raise failure  # said as the stream's error event, no message_delta or message_stop
        for use in tool_uses(outcome):  # whole, at the end: partial_json is the arguments' whole text
            index += 1
            partial = {"type": "input_json_delta", "partial_json": json.dumps(use["input"])}
            yield _event("content_block_start", {"index": index, "content_block": {**use, "input": {}}})
            yield _event("content_block_delta", {"index": index, "delta": partial})
            yield _event("content_block_stop", {"index": index})
        yield _event(
            "message_delta",
            {
                "delta": {
                    "stop_reason": stop_reason(outcome, max_tokens),
                    "stop_sequence": outcome.stop_sequence,
                },
                "usage": usage(outcome),
                "timings": outcome.timings(),
            },
        )
        yield _event("message_stop", {})

    return streamed(request, [generation], chunks, errors.in_stream)
