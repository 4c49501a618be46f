"""An answer in progress as the HTTP side reads it (runner.serve.backend.Generation): the model's
thread posts its parts (runner.serve.engine_backend), the event loop reads them from an asyncio queue;
its end checked as the request asked (a JSON answer against its schema, tool calls read out of it)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from typing import Any

from runner import ui
from runner.engine.answer import FINISH_ERROR, FINISH_STOP, Result
from runner.engine.logprobs import TokenLogprob
from runner.engine.request import Request, finish
from runner.engine.sequence import Job
from runner.engine.text.constrain import ConstraintError
from runner.engine.text.reasoning import ANSWER
from runner.serve.backend import Outcome, Scored

Parts = asyncio.Queue[Any]  # an answer's parts, then None


class QueuedGeneration:
    """runner.serve.backend.Generation: parts go from the model's thread to an asyncio queue."""

    def __init__(
        self, post: Callable[[QueuedGeneration, Any], None], wake: Callable[[], None], hold: bool
    ) -> None:
        self._post = post
        self._wake = wake
        self._queue: Parts = asyncio.Queue()
        self._ended = asyncio.Event()  # set with the last item: the outcome is complete
        self._hold = hold  # tools: the answer may be a call, so it comes whole at the end
        self.job: Job | None = None
        self.request: Request | None = None  # what the engine was asked: its answer checked as it asked
        self.invalid: str | None = None  # how a finished JSON answer failed its check
        self.prompt_tokens = 0
        self.outcome = Outcome()
        self.scored: Callable[..., list[Scored]] = lambda entries, prompt=False: []

    def __aiter__(self) -> AsyncIterator[tuple[str, Any]]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[tuple[str, Any]]:
        while (item := await self._queue.get()) is not None:
            yield item
        if self.invalid is not None:  # said in the API's shape, never passed on as a finished answer
            raise ConstraintError(self.invalid)

    def cancel(self) -> None:
        if self.job is not None and not self.job.cancelled:
            self.job.cancelled = True
            self._wake()

    async def wait(self) -> None:
        await self._ended.wait()

    def arrive(self, item: tuple[str, Any] | None) -> None:
        """An item from the model's thread, on the event loop's."""
        self._queue.put_nowait(item)
        if item is None:
            self._ended.set()

    # -- the model's thread ----------------------------------------------------------------------

    def piece(self, kind: str, text: str) -> None:
        """A piece of the answer or its reasoning (the loop split them), in the model's thread."""
        if not (self._hold and kind == ANSWER):
            self._put((kind, text))

    def logprobs(self, entries: list[TokenLogprob]) -> None:
        """Scored tokens, just before the answer piece they made (the loop's on_logprobs)."""
        if not self._hold:
            self._put(("logprobs", self.scored(entries)))

    def done(self, result: Result) -> None:
        if self.request is not None:
            result = finish(self.request, result)  # its JSON checked, its tool calls read
        if result.invalid is not None and result.finish_reason == FINISH_STOP:  # a cut answer is "length"
            self.invalid = result.invalid
            result = replace(result, finish_reason=FINISH_ERROR)
            ui.warn(f"an answer failed its check: {self.invalid}")
        o = self.outcome
        o.result = result
        o.logprobs = self.scored(result.logprobs)
        if result.prompt_logprobs or self.job is not None and self.job.echo:
            first = self.job.tokens[:1] if self.job is not None else []
            o.prompt_logprobs = self.scored(first, True) + self.scored(result.prompt_logprobs, True)
        if self._hold and o.text:
            self._put(("answer", o.text))
        self._put(None)

    def _put(self, item: tuple[str, Any] | None) -> None:
        self._post(self, item)
