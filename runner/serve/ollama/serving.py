"""The Ollama API's requests as the engine's Ask, and its answers back: whole, or as NDJSON lines (a
line per part, then the done line), durations in nanoseconds (load_duration: the wait for the model's
load, counted in total_duration too); and the models as /api/tags, /api/ps and
/api/show describe them."""

from __future__ import annotations

import math
from collections.abc import AsyncGenerator
from datetime import datetime, timezone
from typing import Any

from starlette.requests import Request

from runner.serve.backend import Ask, Backend, Generation, ModelInfo, Outcome, Scored
from runner.serve.ollama import errors
from runner.serve.ollama.protocol import Base, Message, Options
from runner.serve.shared.answers import Drained, streamed
from runner.serve.shared.audio import media_ref
from runner.serve.shared.fields import sampling, schema_of
from runner.serve.shared.http import ApiError, json_line
from runner.serve.shared.images import ImageRef, with_images
from runner.serve.shared.translate import past_call

# -- requests -------------------------------------------------------------------------------------


def ask_of(req: Base, backend: Backend, model: str, **fields: Any) -> Ask:
    """What chat and generate share, as an Ask (`fields`: the messages or the prompt, and more)."""
    options = req.options or Options()
    if req.logprobs and req.stream is not False and fields.get("tools"):
        message = "logprobs with tools are served whole (stream: false): the answer may be a call"
        raise ApiError(400, message, param="logprobs")
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
    schema = schema_of(req.format, "format") if isinstance(req.format, dict) else None
    return Ask(
        model=model,
        sampling=knobs,
        max_tokens=options.num_predict,
        stop=options.stop or (),
        json_schema=schema,
        json_object=req.format == "json",
        think=req.think,
        keep_alive=req.keep_alive,
        logprobs=req.n_logprobs,
        stream=req.stream is not False,  # Ollama streams unless told not to
        **fields,
    )


def message_of(message: Message, index: int) -> dict[str, Any]:
    """A message as Ask.messages carries it (OpenAI's names: reasoning_content, tool_calls); a user's
    images before its text, as `runner run --image` puts them."""
    refs = image_refs(message.images, f"messages[{index}].images")
    if refs and message.role != "user":
        raise ApiError(400, f"messages[{index}].images: images go in user messages", param=refs[0].field)
    out: dict[str, Any] = {
        "role": "system" if message.role == "developer" else message.role,
        "content": with_images(message.content or "", refs),
    }
    if message.thinking:
        out["reasoning_content"] = message.thinking
    if message.tool_calls:
        out["tool_calls"] = [
            past_call(f"call_{index}_{i}", call.function.name, call.function.arguments)
            for i, call in enumerate(message.tool_calls)
        ]
    if message.tool_name is not None:
        out["name"] = message.tool_name
    return out


def image_refs(images: list[str] | None, field: str) -> list[ImageRef]:
    """`images` (base64, decoded later off the event loop), each named by its field."""
    return [media_ref(f"{field}[{i}]", data) for i, data in enumerate(images or ())]  # a WAV: a clip


# -- answers --------------------------------------------------------------------------------------


def rfc3339(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, timezone.utc).isoformat().replace("+00:00", "Z")


def now() -> str:
    return datetime.now(timezone.utc).isoformat().replace("+00:00", "Z")


def _ns(seconds: float) -> int:
    return int(seconds * 1e9)


def done_fields(outcome: Outcome, load_s: float) -> dict[str, Any]:
    reason = "stop" if outcome.finish_reason == "tool_calls" else outcome.finish_reason
    return {
        "done": True,
        "done_reason": reason,
        "total_duration": _ns(load_s + outcome.total_s),
        "load_duration": _ns(load_s),
        "prompt_eval_count": outcome.prompt_tokens,
        "prompt_eval_duration": _ns(outcome.prefill_s),
        "eval_count": outcome.completion_tokens,
        "eval_duration": _ns(outcome.decode_s),
    }


def nothing_to_answer(model: str, empty: dict[str, Any], reason: str, load_s: float = 0.0) -> dict[str, Any]:
    """The reply to a request with no prompt: Ollama's "load" (with the wait for it), or its "unload"."""
    waited = {"total_duration": _ns(load_s), "load_duration": _ns(load_s)} if reason == "load" else {}
    return {"model": model, "created_at": now(), **empty, "done": True, "done_reason": reason, **waited}


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


def logprobs(scored: list[Scored]) -> list[dict[str, Any]]:
    """Ollama's logprobs: each token's text, log-probability and bytes, with its alternatives."""

    def token(s: Scored) -> dict[str, Any]:
        return {"token": s.token, "logprob": s.logprob, "bytes": list(s.bytes)}

    return [{**token(s), "top_logprobs": [token(t) for t in s.top]} for s in scored]


def whole(
    model: str, outcome: Outcome, *, chat: bool, raw: bool, asked: bool = False, load_s: float = 0.0
) -> dict[str, Any]:
    head: dict[str, Any] = {"model": model, "created_at": now()}
    done = done_fields(outcome, load_s)
    if asked:
        head["logprobs"] = logprobs(outcome.logprobs)
    if chat:
        return {
            **head,
            "message": chat_message(outcome.text, outcome.reasoning, tool_calls(outcome)),
            **done,
        }
    if raw:  # no template, no channels: the text as the model wrote it
        return {**head, "response": outcome.reasoning + outcome.text, **done}
    thinking = {"thinking": outcome.reasoning} if outcome.reasoning else {}
    return {**head, "response": outcome.text, **thinking, **done}


def lines(
    request: Request, generation: Generation, model: str, *, chat: bool, raw: bool, load_s: float = 0.0
) -> AsyncGenerator[str, None]:
    """An answer as NDJSON: a line per part, the tool calls, then the done line with the durations."""

    def line(**fields: Any) -> str:
        return json_line({"model": model, "created_at": now(), **fields}) + "\n"

    def piece(kind: str, text: str) -> dict[str, Any]:
        thinking = kind == "reasoning" and not raw
        if chat:
            return {"message": chat_message("", text) if thinking else chat_message(text)}
        return {"response": "", "thinking": text} if thinking else {"response": text}

    async def chunks(answers: list[Drained]) -> AsyncGenerator[str, None]:
        (answer,) = answers
        held: list[Scored] = []  # scored tokens, on the line of the text they made
        async for kind, text in answer:
            if kind == "logprobs":
                held += text
                continue
            scored = {"logprobs": logprobs(held)} if held else {}
            held = []
            yield line(**piece(kind, text), **scored, done=False)
        outcome = answer.outcome
        if chat and outcome.tool_calls:
            yield line(message=chat_message("", calls=tool_calls(outcome)), done=False)
        scored = {"logprobs": logprobs(held)} if held else {}  # tokens of no text of their own
        last = {"message": chat_message("")} if chat else {"response": ""}
        yield line(**last, **scored, **done_fields(outcome, load_s))

    return streamed(request, [generation], chunks, errors.in_stream)


# -- the models -----------------------------------------------------------------------------------


def details(info: ModelInfo) -> dict[str, Any]:
    return {
        "parent_model": "",
        "format": "gguf",
        "family": info.architecture,
        "families": [info.architecture],
        "parameter_size": info.parameters,
        "quantization_level": info.quantization,
    }


def plain(value: Any) -> Any:
    """A metadata value that JSON can carry: non-finite floats as null, anything else odd as text."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, (bool, int, float)):
        return value
    return str(value).encode("utf-8", "replace").decode("utf-8")


def capabilities(info: ModelInfo) -> list[str]:
    """What Ollama's clients look for before they send tools, think or images: read off the chat
    template, and "vision" where the model is served with a projector; a reranker only "rerank", an
    encoder (or another model that cannot generate) only "embedding"."""
    if info.reranks:
        return ["rerank"]
    if info.cannot_generate is not None:
        return ["embedding"]
    template = info.template or ""
    found = ["completion"]
    if "tools" in template:
        found.append("tools")
    if "think" in template:
        found.append("thinking")
    if info.max_images > 0 and info.sees:
        found.append("vision")
    if info.max_images > 0 and info.hears:
        found.append("audio")
    return found
