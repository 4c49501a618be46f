"""The two ways an answer leaves: whole, once every part is in, or streamed as its parts come. Either
way a client that leaves cancels its answer (its sequence freed at the engine's next step), and the
access line says what the answer made and how it ended.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import Any

import anyio
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from runner.serve.backend import Ask, Backend, Generation, Outcome, TooLong
from runner.serve.shared.http import ApiError, Traffic, as_api_error, brief, json_line, traffic

CANCEL_WAIT_S = 5.0  # a cancelled answer ends at the engine's next step: this is a bound, not a wait


async def submit(backend: Backend, ask: Ask, param: str) -> Generation:
    """backend.submit, before any response starts: a prompt too long is a 400 naming `param`."""
    try:
        return await backend.submit(ask)
    except TooLong as exc:
        raise ApiError(400, str(exc), param=param, code="context_length_exceeded") from None


async def finish(note: Traffic, generation: Generation, finished: bool, *, also: int = 0) -> None:
    """An answer's end, whichever way: cancelled if it did not run out (and waited for, a few seconds at
    most, so the log says what it had made), its figures noted for the log (`also`: this is one more of
    a request's n answers, its completion added to the others')."""
    if not finished:
        generation.cancel()
        with anyio.CancelScope(shield=True), anyio.move_on_after(CANCEL_WAIT_S):
            await generation.wait()
    note.prompt_tokens = generation.prompt_tokens
    outcome = generation.outcome
    before = (note.completion_tokens or 0) if also else 0
    note.completion_tokens = outcome.completion_tokens + before
    note.ttft_s = outcome.ttft_s if not also else min(note.ttft_s or outcome.ttft_s, outcome.ttft_s)
    note.finish = "cancelled" if note.client_left or not finished else outcome.finish_reason


async def collect(request: Request, generations: list[Generation]) -> list[Outcome]:
    """Whole answers: drain the generations, cancelling them if the client leaves before they are done."""
    note = traffic(request)
    finished = [False] * len(generations)
    errors: list[Exception] = []

    async def watch() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass
        note.client_left = True
        for generation in generations:
            generation.cancel()

    async def drain(i: int, generation: Generation) -> None:
        try:
            async for _ in generation:
                pass
            finished[i] = True
        except Exception as exc:  # raised below, outside the task group (no ExceptionGroup)
            errors.append(exc)

    try:
        async with anyio.create_task_group() as group:
            group.start_soon(watch)
            async with anyio.create_task_group() as answers:
                for i, generation in enumerate(generations):
                    answers.start_soon(drain, i, generation)
            group.cancel_scope.cancel()
    finally:
        for i, generation in enumerate(generations):
            await finish(note, generation, finished[i], also=i)
    if errors:
        raise errors[0]
    return [generation.outcome for generation in generations]


class Drained:
    """A Generation as a stream reads it: its parts, and whether they ran out (the answer complete,
    not cut short by the client leaving or an error)."""

    def __init__(self, generation: Generation) -> None:
        self.generation = generation
        self.ran_out = False

    @property
    def prompt_tokens(self) -> int:
        return self.generation.prompt_tokens

    @property
    def outcome(self) -> Outcome:
        return self.generation.outcome

    def __aiter__(self) -> AsyncIterator[tuple[str, Any]]:
        return self._parts()

    async def _parts(self) -> AsyncIterator[tuple[str, Any]]:
        async for part in self.generation:
            yield part
        self.ran_out = True


Chunks = Callable[[list[Drained]], AsyncGenerator[str, None]]


async def streamed(
    request: Request, generations: list[Generation], chunks: Chunks, error: Callable[[ApiError], str]
) -> AsyncGenerator[str, None]:
    """An answer's stream, as every API sends one: `chunks` writes the API's own chunks from the
    generations' parts; an error once the stream has begun goes in it (`error`: as that API's clients
    read one); and at its end, whichever way it comes, an answer that did not run out is cancelled
    and each answer's figures are noted for the access line."""
    note = traffic(request)
    answers = [Drained(generation) for generation in generations]
    body = chunks(answers)
    failed = False
    try:
        async for chunk in body:
            yield chunk
    except Exception as exc:  # the stream has begun: the error goes in it
        failed = True
        note.error = brief(exc)
        yield error(as_api_error(exc))
    finally:
        await body.aclose()
        note.client_left = not failed and not all(answer.ran_out for answer in answers)  # closed early
        for i, answer in enumerate(answers):
            await finish(note, answer.generation, answer.ran_out, also=i)


class EventStream(StreamingResponse):
    """A stream that always notices the client leaving, whatever the server's ASGI version, and always
    closes its generator, so the generator's `finally` cancels the answer and frees its sequence."""

    def __init__(self, chunks: AsyncGenerator[str, None], media_type: str) -> None:
        super().__init__(chunks, media_type=media_type, headers={"Cache-Control": "no-cache"})
        self.chunks = chunks

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            async with anyio.create_task_group() as group:

                async def stream() -> None:
                    with contextlib.suppress(OSError):  # the client left (ASGI 2.4 servers say so on send)
                        await self.stream_response(send)
                    group.cancel_scope.cancel()

                group.start_soon(stream)
                await self.listen_for_disconnect(receive)
                group.cancel_scope.cancel()
        finally:
            with anyio.CancelScope(shield=True):
                await self.chunks.aclose()


def sse(value: Any, event: str | None = None) -> str:
    """One Server-Sent Event: its data a compact JSON line, its name when the API names events."""
    named = f"event: {event}\n" if event else ""
    return f"{named}data: {json_line(value)}\n\n"
