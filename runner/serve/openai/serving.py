"""The OpenAI API's requests as the engine's Ask, and its answers back: whole (chat.completion,
text_completion) or as Server-Sent Events."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator
from typing import Any

from starlette.requests import Request

from runner.serve.backend import Ask, Generation, Outcome, Scored
from runner.serve.openai import errors
from runner.serve.openai.protocol import ChatMessage, ChatRequest, Knobs, ResponseFormat
from runner.serve.shared.answers import Drained, sse, streamed
from runner.serve.shared.fields import sampling, schema_of, tool_list
from runner.serve.shared.http import ApiError
from runner.serve.shared.images import ImageRef
from runner.serve.shared.translate import NoSuchTool, NoTools, new_id, past_call, tool_choice

# -- requests -------------------------------------------------------------------------------------


def ask_of(req: Knobs, model: str, **fields: Any) -> Ask:
    """What chat and completions share, as an Ask (`fields`: the messages or the prompt, and more)."""
    json_schema, json_object = _formats(req.response_format)
    knobs = sampling(
        temperature=req.temperature,
        top_p=req.top_p,
        top_k=req.top_k,
        min_p=req.min_p,
        repeat_penalty=req.repeat_penalty,
        presence_penalty=req.presence_penalty,
        frequency_penalty=req.frequency_penalty,
        seed=req.seed,
    )
    return Ask(
        model=model,
        sampling=knobs,
        max_tokens=req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens,
        stop=req.stop or (),
        json_schema=json_schema,
        json_object=json_object,
        logprobs=req.n_logprobs,
        stream=bool(req.stream),
        **fields,
    )


def chat_ask(req: ChatRequest, model: str) -> Ask:
    return ask_of(
        req,
        model,
        messages=[message_of(message, i) for i, message in enumerate(req.messages)],
        think=think(req),
        reasoning_budget=None if req.reasoning_budget_tokens in (None, -1) else req.reasoning_budget_tokens,
        tools=tool_list(req.tools),
        tool_choice=tool_choice_of(req),
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


def message_of(message: ChatMessage, index: int) -> dict[str, Any]:
    """A message as Ask.messages carries it: developer is system, tool calls' arguments dicts, each
    image named by its whole field (messages[index].content[i].image_url.url)."""
    content = message.content
    if isinstance(content, list):
        content = [p.under(f"messages[{index}]") if isinstance(p, ImageRef) else p for p in content]
    out: dict[str, Any] = {
        "role": "system" if message.role == "developer" else message.role,
        "content": content,
    }
    if message.tool_calls:
        out["tool_calls"] = [
            past_call(call.id or new_id("call_"), call.function.name, call.function.arguments)
            for call in message.tool_calls
        ]
    for key in ("name", "tool_call_id", "reasoning_content"):
        if getattr(message, key) is not None:
            out[key] = getattr(message, key)
    return out


EFFORTS = {"none": "off", "minimal": "low", "low": "low", "medium": "medium", "high": "high"}


def think(req: ChatRequest) -> bool | str | None:
    """OpenAI's reasoning_effort as a level (runner.engine.text.reasoning.think_settings), else
    llama-server's chat_template_kwargs.enable_thinking."""
    if req.reasoning_effort is not None:
        if req.reasoning_effort not in EFFORTS:
            raise ApiError(
                400, f"reasoning_effort must be one of {', '.join(EFFORTS)}", param="reasoning_effort"
            )
        return EFFORTS[req.reasoning_effort]
    value = (req.chat_template_kwargs or {}).get("enable_thinking")
    if value is not None and not isinstance(value, bool):
        raise ApiError(
            400, "enable_thinking must be true or false", param="chat_template_kwargs.enable_thinking"
        )
    return value


def tool_choice_of(req: ChatRequest) -> str | dict[str, Any] | None:
    """tool_choice checked: "auto" | "none" | "required" | {"function": {"name"}} naming a given tool."""
    value, names = req.tool_choice, [tool.function.name for tool in req.tools or ()]
    kind, name = None, None
    if value is None or value in ("auto", "none", "required"):
        kind = value
    elif isinstance(value, dict) and isinstance(value.get("function"), dict):
        named = value["function"].get("name")
        kind, name = ("function", named) if isinstance(named, str) else ("unknown", None)
    else:
        kind = "unknown"
    try:
        if kind != "unknown":
            return tool_choice(kind, name, names)
    except (NoTools, NoSuchTool):
        pass
    message = 'tool_choice must be "auto", "none", "required" or {"type": "function", "function": {"name"}}'
    raise ApiError(400, f"{message} naming one of the tools given", param="tool_choice")


# -- answers --------------------------------------------------------------------------------------


def usage(outcomes: list[Outcome]) -> dict[str, Any]:
    """The prompt once (n answers share it), every answer's tokens."""
    first, completion = outcomes[0], sum(o.completion_tokens for o in outcomes)
    return {
        "prompt_tokens": first.prompt_tokens,
        "completion_tokens": completion,
        "total_tokens": first.prompt_tokens + completion,
        "prompt_tokens_details": {"cached_tokens": first.cached_tokens},
        "completion_tokens_details": {"reasoning_tokens": sum(o.reasoning_tokens for o in outcomes)},
    }


def tool_calls(outcome: Outcome) -> list[dict[str, Any]]:
    return [
        {
            "id": new_id("call_"),
            "type": "function",
            "function": {"name": call.get("name", ""), "arguments": json.dumps(call.get("arguments", {}))},
        }
        for call in outcome.tool_calls
    ]


def finish_reason(outcome: Outcome) -> str:
    return "tool_calls" if outcome.tool_calls else outcome.finish_reason


def chat_answer(
    head: dict[str, Any], outcomes: list[Outcome], *, asked_logprobs: bool = False
) -> dict[str, Any]:
    choices = []
    for index, outcome in enumerate(outcomes):
        message: dict[str, Any] = {"role": "assistant", "content": outcome.text}
        if outcome.reasoning:
            message["reasoning_content"] = outcome.reasoning
        if outcome.tool_calls:
            message["content"] = outcome.text or None
            message["tool_calls"] = tool_calls(outcome)
        choices.append(
            {
                "index": index,
                "message": message,
                "logprobs": chat_logprobs(outcome.logprobs) if asked_logprobs else None,
                "finish_reason": finish_reason(outcome),
            }
        )
    return {**head, "object": "chat.completion", "choices": choices, **_tail(outcomes)}


def text_answer(
    head: dict[str, Any], outcomes: list[Outcome], *, asked_logprobs: bool = False, prompt: str = ""
) -> dict[str, Any]:
    """text_completion; `prompt`: echo's, written before the answer (and its tokens scored first)."""
    choices = []
    for i, o in enumerate(outcomes):
        text = o.reasoning + o.text  # no template, no channels: the text as the model wrote it
        scored = [*o.prompt_logprobs, *o.logprobs]
        choices.append(
            {
                "text": prompt + text,
                "index": i,
                "logprobs": text_logprobs(scored) if asked_logprobs else None,
                "finish_reason": o.finish_reason,
            }
        )
    return {**head, "choices": choices, **_tail(outcomes)}


def _token(s: Scored) -> dict[str, Any]:
    return {"id": s.id, "token": s.token, "bytes": list(s.bytes), "logprob": s.logprob}


def chat_logprobs(scored: list[Scored]) -> dict[str, Any]:
    """Chat's logprobs: each token with its alternatives (`id` is llama-server's addition)."""
    content = [{**_token(s), "top_logprobs": [_token(t) for t in s.top]} for s in scored]
    return {"content": content, "refusal": None}


def text_logprobs(scored: list[Scored], offset: int = 0) -> dict[str, Any]:
    """Completions' (legacy) logprobs: tokens, their logprobs (null for a prompt's first token,
    which nothing predicted), each position's alternatives as {token: logprob}, and where each token
    starts in the text (`offset`: the text before these tokens, streamed)."""
    offsets = []
    for s in scored:
        offsets.append(offset)
        offset += len(s.token)
    return {
        "tokens": [s.token for s in scored],
        "token_logprobs": [s.logprob for s in scored],
        "top_logprobs": [None if s.logprob is None else {t.token: t.logprob for t in s.top} for s in scored],
        "text_offset": offsets,
    }


def _tail(outcomes: list[Outcome]) -> dict[str, Any]:
    return {"usage": usage(outcomes), "timings": timings_of(outcomes)}


SPANS = {"ttft_s": min, "prefill_s": max, "decode_s": max, "total_s": max, "threads": max}


def timings_of(outcomes: list[Outcome]) -> dict[str, Any]:
    """One timings object however many choices: for n > 1 the tokens of every choice added up (each
    evaluated its prompt, all but the first mostly from the first's KV cache), the earliest first
    token and the latest end, and each choice's own in `choices`."""
    each = [o.timings() for o in outcomes]
    if len(each) == 1:
        return each[0]
    merged = {key: SPANS.get(key, sum)(t[key] for t in each) for key in each[0]}
    return {**merged, "choices": each}


async def merged_parts(answers: list[Drained]) -> AsyncGenerator[tuple[int, str | None, Any], None]:
    """The answers' parts as they come, each as (index, kind, text), and (index, None, "") as an
    answer ends; an answer's error raised once its parts are out. One answer is read as it is, with no
    task between (a token a wake-up fewer: what one client's stream costs the event loop per token)."""
    if len(answers) == 1:
        async for kind, text in answers[0]:
            yield 0, kind, text
        yield 0, None, ""
        return
    parts: asyncio.Queue[tuple[int, str | None, Any]] = asyncio.Queue()

    async def pump(index: int, answer: Drained) -> None:
        try:
            async for kind, text in answer:
                await parts.put((index, kind, text))
        finally:
            await parts.put((index, None, ""))

    pumps = [asyncio.ensure_future(pump(i, answer)) for i, answer in enumerate(answers)]
    try:
        for _ in answers:
            while (part := await parts.get())[1] is not None:
                yield part
            await pumps[part[0]]  # its error, if it ended by one
            yield part
    finally:
        for task in pumps:
            task.cancel()


def events(
    request: Request,
    generations: list[Generation],
    head: dict[str, Any],
    *,
    chat: bool,
    include_usage: bool,
) -> AsyncGenerator[str, None]:
    """Answers as Server-Sent Events: a role delta (chat), a delta per part, the finish reason and
    timings, the usage when asked, then [DONE]; n answers interleaved, each chunk naming its index.
    Asked for, the tokens' logprobs ride on the chunk of the text they made."""
    held: dict[int, list[Scored]] = {}  # scored tokens, until the chunk of their text
    offsets: dict[int, int] = {}  # completions: the text streamed so far, for text_offset

    def chunk(index: int, choice: dict[str, Any], **extra: Any) -> str:
        scored = held.pop(index, None)
        logprobs = None
        if scored is not None and chat:
            logprobs = chat_logprobs(scored)
        elif scored is not None:
            logprobs = text_logprobs(scored, offsets.get(index, 0))
        if not chat:
            offsets[index] = offsets.get(index, 0) + len(choice.get("text", ""))
        return sse({**head, "choices": [{"index": index, "logprobs": logprobs, **choice}], **extra})

    def piece(text: str, reasoning: bool = False) -> dict[str, Any]:
        if not chat:
            return {"text": text, "finish_reason": None}
        return {"delta": {"reasoning_content" if reasoning else "content": text}, "finish_reason": None}

    async def chunks(answers: list[Drained]) -> AsyncGenerator[str, None]:
        parts = merged_parts(answers)
        try:
            if chat:
                for index in range(len(answers)):
                    yield chunk(index, {"delta": {"role": "assistant", "content": ""}, "finish_reason": None})
            async for index, kind, text in parts:
                if kind == "logprobs":
                    held.setdefault(index, []).extend(text)
                    continue
                if kind is not None:
                    yield chunk(index, piece(text, kind == "reasoning"))
                    continue
                outcome = answers[index].outcome
                if chat and outcome.tool_calls:
                    calls = [{"index": i, **call} for i, call in enumerate(tool_calls(outcome))]
                    yield chunk(index, {"delta": {"tool_calls": calls}, "finish_reason": None})
                end: dict[str, Any] = {"delta": {}} if chat else {"text": ""}
                yield chunk(
                    index, {**end, "finish_reason": finish_reason(outcome)}, timings=outcome.timings()
                )
            if include_usage:
                yield sse({**head, "choices": [], "usage": usage([a.outcome for a in answers])})
            yield "data: [DONE]\n\n"
        finally:
            await parts.aclose()

    return streamed(request, generations, chunks, errors.in_stream)
