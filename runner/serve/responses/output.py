"""What /v1/responses answers: the response object, its output items, and the stream events that
build them as the answer's parts arrive.

One builder (`Output`) serves both ways an answer leaves: streamed, its events are sent as they come;
whole, the same items are built from the answer's outcome and the events dropped. A run of reasoning
parts is a `reasoning` item (its text as `reasoning_text` content), a run of answer parts a `message`
item, each tool call a `function_call` item.
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any

from starlette.requests import Request

from runner.serve.backend import Generation, Outcome
from runner.serve.responses.errors import error_event
from runner.serve.shared.answers import Drained, sse, streamed
from runner.serve.shared.translate import new_id

Event = dict[str, Any]  # {"type": "response.…", …}: sequence_number is added as it is sent

# how an answer ended -> the response's status, and incomplete_details.reason where it is incomplete
STATUS = {"stop": "completed", "tool_calls": "completed", "length": "incomplete", "interrupted": "incomplete"}
INCOMPLETE = {"length": "max_output_tokens", "interrupted": "interrupted"}
FAILED = "the model failed while answering (the server's log has its line)"


def status_of(outcome: Outcome) -> str:
    return STATUS.get(outcome.finish_reason, "failed")


class Output:
    """The output items, built part by part; every step returns the events it makes."""

    def __init__(self) -> None:
        self.items: list[dict[str, Any]] = []
        self._kind = ""  # "reasoning" | "answer": what the last item open takes, "" when none is
        self._texts: list[str] = []

    def part(self, kind: str, text: str) -> list[Event]:
        """One part of the answer: the open item grows, or the open one ends and the next begins."""
        events = []
        if kind != self._kind:
            events = self._close("completed") + self._open(kind)
        self._texts.append(text)
        where = self._where()
        if kind == "reasoning":
            return [*events, {"type": "response.reasoning_text.delta", **where, "delta": text}]
        return [*events, {"type": "response.output_text.delta", **where, "delta": text, "logprobs": []}]

    def end(self, outcome: Outcome, *, one_call: bool = False) -> list[Event]:
        """The answer is out: the open item ends, a message (even empty) unless the answer is a call,
        then one function_call item per call (only the first when parallel calls are off)."""
        status = "incomplete" if status_of(outcome) == "incomplete" else "completed"
        events = self._close(status)
        calls = outcome.tool_calls[:1] if one_call else outcome.tool_calls
        if not calls and not any(item["type"] == "message" for item in self.items):
            events += self._open("answer") + self._close(status)
        for call in calls:
            arguments = json.dumps(call.get("arguments", {}), ensure_ascii=False)
            item = {
                "type": "function_call",
                "id": new_id("fc_"),
                "call_id": new_id("call_"),
                "name": call.get("name", ""),
                "arguments": "",
                "status": "in_progress",
            }
            self.items.append(item)
            index = len(self.items) - 1
            where = {"item_id": item["id"], "output_index": index}
            events.append({"type": "response.output_item.added", "output_index": index, "item": dict(item)})
            events.append({"type": "response.function_call_arguments.delta", **where, "delta": arguments})
            events.append({"type": "response.function_call_arguments.done", **where, "arguments": arguments})
            item.update(arguments=arguments, status="completed")
            events.append({"type": "response.output_item.done", "output_index": index, "item": dict(item)})
        return events

    def _where(self) -> dict[str, Any]:
        index = len(self.items) - 1
        return {"item_id": self.items[index]["id"], "output_index": index, "content_index": 0}

    def _open(self, kind: str) -> list[Event]:
        self._kind, self._texts = kind, []
        if kind == "reasoning":
            item = {"type": "reasoning", "id": new_id("rs_"), "summary": [], "content": []}
            part: dict[str, Any] = {"type": "reasoning_text", "text": ""}
        else:
            item = {"type": "message", "id": new_id("msg_"), "role": "assistant", "content": []}
            part = {"type": "output_text", "text": "", "annotations": []}
        self.items.append({**item, "status": "in_progress"})
        index = len(self.items) - 1
        return [
            {"type": "response.output_item.added", "output_index": index, "item": dict(self.items[index])},
            {"type": "response.content_part.added", **self._where(), "part": part},
        ]

    def _close(self, status: str) -> list[Event]:
        if not self._kind:
            return []
        kind, text, where = self._kind, "".join(self._texts), self._where()
        self._kind, self._texts = "", []
        item = self.items[where["output_index"]]
        if kind == "reasoning":
            part: dict[str, Any] = {"type": "reasoning_text", "text": text}
            done: Event = {"type": "response.reasoning_text.done", **where, "text": text}
        else:
            part = {"type": "output_text", "text": text, "annotations": []}
            done = {"type": "response.output_text.done", **where, "text": text, "logprobs": []}
        item.update(content=[part], status=status)
        return [
            done,
            {"type": "response.content_part.done", **where, "part": part},
            {"type": "response.output_item.done", "output_index": where["output_index"], "item": dict(item)},
        ]


def whole_output(outcome: Outcome, *, one_call: bool = False) -> list[dict[str, Any]]:
    """The output items of an answer already complete."""
    output = Output()
    if outcome.reasoning:
        output.part("reasoning", outcome.reasoning)
    if outcome.text:
        output.part("answer", outcome.text)
    output.end(outcome, one_call=one_call)
    return output.items


def usage(outcome: Outcome) -> dict[str, Any]:
    """input_tokens the whole prompt (cached_tokens of it reused from the KV cache, not evaluated)."""
    return {
        "input_tokens": outcome.prompt_tokens,
        "input_tokens_details": {"cached_tokens": outcome.cached_tokens, "cache_write_tokens": 0},
        "output_tokens": outcome.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": outcome.reasoning_tokens},
        "total_tokens": outcome.prompt_tokens + outcome.completion_tokens,
    }


def in_progress(head: dict[str, Any]) -> dict[str, Any]:
    """The response as the stream's first events show it: nothing out yet."""
    return {**head, "status": "in_progress", "output": [], "usage": None}


def finished(head: dict[str, Any], outcome: Outcome, items: list[dict[str, Any]]) -> dict[str, Any]:
    """The response once its answer is out: its status, output, usage and runner's timings."""
    status = status_of(outcome)
    reason = INCOMPLETE.get(outcome.finish_reason)
    return {
        **head,
        "status": status,
        "completed_at": int(time.time()) if status == "completed" else None,
        "error": {"code": "server_error", "message": FAILED} if status == "failed" else None,
        "incomplete_details": {"reason": reason} if status == "incomplete" else None,
        "output": items,
        "usage": usage(outcome),
        "timings": outcome.timings(),
    }


def final_event(response: dict[str, Any]) -> Event:
    """response.completed, response.incomplete or response.failed, with the whole response."""
    return {"type": f"response.{response['status']}", "response": response}


def _sse(event: Event, number: int) -> str:
    return sse({**event, "sequence_number": number}, event["type"])


def events(
    request: Request,
    generation: Generation,
    head: dict[str, Any],
    keep: Callable[[dict[str, Any]], Awaitable[None]],
    *,
    one_call: bool = False,
) -> AsyncGenerator[str, None]:
    """An answer as the Responses API's Server-Sent Events, each with its sequence_number:
    response.created and .in_progress, each item's events as its parts come, then the whole response
    (kept first, unless store is false) in response.completed, .incomplete or .failed. An error once
    the stream began is an `error` event."""
    numbers = itertools.count()

    async def chunks(answers: list[Drained]) -> AsyncGenerator[str, None]:
        (answer,) = answers
        started = in_progress(head)
        yield _sse({"type": "response.created", "response": started}, next(numbers))
        yield _sse({"type": "response.in_progress", "response": started}, next(numbers))
        output = Output()
        async for kind, text in answer:
            for event in output.part(kind, text) if text else ():
                yield _sse(event, next(numbers))
        for event in output.end(answer.outcome, one_call=one_call):
            yield _sse(event, next(numbers))
        response = finished(head, answer.outcome, output.items)
        await keep(response)
        yield _sse(final_event(response), next(numbers))

    return streamed(request, [generation], chunks, lambda err: _sse(error_event(err), next(numbers)))
