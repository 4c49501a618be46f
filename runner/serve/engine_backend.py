"""The Backend behind the HTTP side: each served model's engine, driven by a thread of its own.

A request crosses from the event loop to the model's thread as a `_Request`; that thread renders the
chat template (each image's marker where it goes: the pixels came decoded, runner.serve.shared.images),
tokenizes (images through the projector's tokenizer), checks the prompt fits a sequence, builds the
request's sampler chain (its grammar compiled once, here), and adds the job to runner.engine.loop's
loop, the one every command runs; it then steps the loop while any job is active. Each answer's pieces
come back to the event loop (runner.serve.generation) through call_soon_threadsafe, a step's at once,
a stream's few next ones joined (runner.serve.outbox). Nothing else calls llama.cpp.
An embedding request crosses as an EmbedRequest: the thread pools its texts (runner.serve.embed_queue)
one llama_decode between two batch steps.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from runner import ui
from runner.engine.answer import Result
from runner.engine.infill import infill_prompt
from runner.engine.loop import Loop
from runner.engine.prefix import PrefixStore, StateCache
from runner.engine.prompt import render_prompt
from runner.engine.promptcache import PromptCache
from runner.engine.request import Prompt, Request, to_job
from runner.engine.sequence import dropped
from runner.engine.text.constrain import Constraint, checked_schema, json_shape, schema_shape
from runner.engine.text.fim import REUSE_CHUNK
from runner.engine.text.sampling import SamplingConfig
from runner.engine.text.template import Message
from runner.engine.text.tools import call_shape
from runner.errors import InvalidSetting, NoInfill, RunnerError
from runner.loader import LoadedModel
from runner.serve.backend import Ask, BadField, ModelInfo, QueueFull, TooLong, scored_tokens
from runner.serve.embed_queue import EmbedQueue, EmbedRequest
from runner.serve.generation import QueuedGeneration
from runner.serve.metrics import Metrics, ModelState
from runner.serve.outbox import STREAM_INTERVAL_MS, Outbox


@dataclass
class Served:
    """One model as `runner serve` loaded it."""

    info: ModelInfo
    loaded: LoadedModel
    sampling: Callable[[dict[str, Any]], SamplingConfig]  # a request's fields over the server's defaults
    cache_ram: int = 0  # bytes of prompt states kept past their sequence (runner.engine.prefix.StateCache)
    prompt_cache: PromptCache | None = None  # the prefix store's disk tier: heads other processes stored
    stream_interval: float = STREAM_INTERVAL_MS / 1000  # seconds a streamed piece may wait (outbox)


@dataclass
class _Request:
    ask: Ask
    sampling: SamplingConfig
    shape: Constraint | None  # what the answer must be: JSON, a schema, a forced tool call (compiled)
    forced: bool  # the answer is a forced tool call, as a whole JSON object
    generation: QueuedGeneration
    admitted: asyncio.Future[None]
    arrived: float
    count_only: bool = False  # count_tokens: the prompt rendered and counted, nothing decoded


class ModelThread:
    """One model: its engine, its batch loop and the thread that alone drives them."""

    def __init__(
        self, served: Served, queue: int, embed_ctx: int | None = None, metrics: Metrics | None = None
    ) -> None:
        """embed_ctx: the longest text an embedding takes (runner.engine.embed.EMBED_CTX by default),
        at most the model's --ctx. metrics: where its answers are counted (None: nowhere)."""
        self.served = served
        self.metrics = metrics
        self.engine = served.loaded.engine
        self.queue_limit = queue
        self._embeds = EmbedQueue(
            self.engine, served.info.context, embed_ctx, served.info.name
        )  # in this thread
        self._embedding = 0  # embedding requests submitted and not yet answered: past --queue, 429
        self.counters = {"requests": 0, "prompt_tokens": 0, "prefill_tokens": 0, "cached_tokens": 0}
        self._inbox: list[_Request | EmbedRequest] = []
        self._jobs: dict[int, QueuedGeneration] = {}
        self._ids = itertools.count()
        self._in_flight = 0  # submitted and not yet done: past parallel + queue, 429
        self._lock = threading.Lock()
        self._wakeup = threading.Condition(self._lock)
        self._stopping = False
        self._events: asyncio.AbstractEventLoop | None = None  # the HTTP side's event loop
        self._outbox = Outbox(served.stream_interval)  # parts for the event loop, sent after a step
        states = StateCache(served.cache_ram) if served.cache_ram > 0 else None
        self.states = states
        self.store = PrefixStore(ram=states, disk=served.prompt_cache)
        self._loop = self._new_loop()
        self.thread = threading.Thread(target=self._run, name=f"engine {served.info.name}", daemon=True)
        self.thread.start()

    # -- the event loop's side -------------------------------------------------------------------

    async def submit(self, ask: Ask) -> QueuedGeneration:
        sampling = self._sampling(ask)
        # a schema compiles off the event loop, which a big one would stall for seconds (10,000 members: 4 s)
        compiles = ask.json_schema is not None or bool(ask.tools)
        shape, forced = (await asyncio.to_thread(_shape, ask)) if compiles else _shape(ask)
        loop = self._events = asyncio.get_running_loop()
        hold = bool(ask.tools) and ask.tool_choice != "none"
        generation = QueuedGeneration(self._post, self.wake, hold=hold)
        admitted, now = loop.create_future(), time.perf_counter()
        request = _Request(ask, sampling, shape, forced, generation, admitted, now)
        with self._lock:
            if self._stopping:
                raise QueueFull("the server is stopping", retry_after=5)
            if self._in_flight >= self.engine.context.n_seq + self.queue_limit:
                if self.metrics is not None:
                    self.metrics.refused(self.served.info.name)
                raise QueueFull(
                    f"{ui.count(self.queue_limit, 'request')} already "
                    f"{'waits' if self.queue_limit == 1 else 'wait'} for {self.served.info.name} (--queue)"
                )
            self._in_flight += 1
            self._inbox.append(request)
            self._wakeup.notify()
        try:
            await request.admitted
        except BaseException:
            generation.cancel()  # the client went away while it waited: never decoded for nobody
            raise
        return generation

    async def count_tokens(self, ask: Ask) -> int:
        """The prompt's tokens as submit() would evaluate them (rendered and tokenized in the
        model's thread), nothing decoded."""
        loop = self._events = asyncio.get_running_loop()
        generation = QueuedGeneration(self._post, self.wake, hold=False)
        request = _Request(ask, SamplingConfig(), None, False, generation, loop.create_future(), 0.0, True)
        with self._lock:
            self._inbox.append(request)
            self._wakeup.notify()
        await request.admitted
        return generation.prompt_tokens

    async def embed(
        self, texts: list[str], truncate: bool, query: str | None = None
    ) -> tuple[list[list[float]], int]:
        """The texts' unit vectors and their tokens, pooled in this model's thread; with a `query`,
        each (query, text) pair's rerank values (the score first) and the pairs' tokens."""
        loop = self._events = asyncio.get_running_loop()
        request = EmbedRequest(texts, truncate, loop.create_future(), query=query)
        with self._lock:
            if self._stopping:
                raise QueueFull("the server is stopping", retry_after=5)
            if self._embedding >= max(1, self.queue_limit):
                if self.metrics is not None:
                    self.metrics.refused(self.served.info.name)
                waiting = ui.count(self._embedding, "embedding request")
                raise QueueFull(f"{waiting} already {'waits' if self._embedding == 1 else 'wait'} (--queue)")
            self._embedding += 1
            self._inbox.append(request)
            self._wakeup.notify()
        try:
            return await request.done
        except BaseException:
            request.cancelled = True  # the client went away, or it failed: nothing more is embedded for it
            raise

    def _sampling(self, ask: Ask) -> SamplingConfig:
        try:
            return self.served.sampling(ask.sampling)
        except InvalidSetting as exc:
            raise _bad_field(exc, "sampling") from None

    def _post(self, generation: QueuedGeneration, item: Any) -> None:
        self._outbox.post(generation, item)

    def _flush(self, *, force: bool = False) -> None:
        """What the last steps made, to the event loop in one call (one wake-up, not one per token),
        unless a stream's pieces may wait for the next (runner.serve.outbox)."""
        if self._events is not None and (sent := self._outbox.take(time.perf_counter(), force=force)):
            self._events.call_soon_threadsafe(_deliver, sent)

    def wake(self) -> None:
        with self._lock:
            self._wakeup.notify()

    def state(self, memory: dict[str, int]) -> ModelState:
        """This model as /metrics reads it, on the event loop's thread: a moment of the counts this
        model's thread keeps (each read whole; together, as near as a scrape needs)."""
        loop, states = self._loop, self.states
        free = len(loop.free)
        busy = loop.parallel - free
        return ModelState(
            self.served.info.name,
            dict(memory),
            busy=busy,
            free=free,
            waiting=max(0, self._in_flight - busy),
            kv_used=sum(len(cells) for cells in list(self.engine.context.cells)),
            kv_cells=self.engine.context.n_ctx,
            states=len(states) if states is not None else 0,
            states_bytes=states.held if states is not None else 0,
            states_kept=states.saved if states is not None else 0,
            states_hits=states.restored if states is not None else 0,
        )

    @property
    def longest_input(self) -> int:
        """The longest text an embedding takes, or a (query, document) pair a rerank, in tokens."""
        return self._embeds.longest

    def idle(self) -> bool:
        """No request in flight or waiting (a model that may be unloaded)."""
        with self._lock:
            return self._in_flight == 0 and not self._inbox and self._embedding == 0

    def close(self) -> None:
        """Every answer ended, the thread gone, the model freed (runner.serve.pool's unload)."""
        self.stop()
        self.thread.join(timeout=30)
        self.served.loaded.close()

    def stop(self) -> None:
        with self._lock:
            self._stopping = True
            for generation in self._jobs.values():
                if generation.job is not None:
                    generation.job.cancelled = True
            self._wakeup.notify()

    # -- the model's thread ----------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._lock:
                while not (self._inbox or self._loop.busy() or self._embeds.waiting or self._stopping):
                    self._wakeup.wait()
                arrived, self._inbox = self._inbox, []
                stopping = self._stopping
            for request in arrived:
                if isinstance(request, EmbedRequest):
                    self._embed_intake(request, stopping)
                else:
                    self._intake(request, stopping)
            loop = self._loop
            if self._embeds.waiting or loop.queue and loop.free:  # a step that may run long: nothing waits
                self._flush(force=True)
            if self._embeds.waiting:
                self._embed_step(stopping)
            if stopping and not loop.busy():
                self._flush(force=True)
                loop.close()
                self._embeds.close()
                return
            try:
                loop.step()
            except RunnerError as exc:  # llama_decode failed: every answer in it ends, the server goes on
                ui.warn(f"{self.served.info.name}: {exc}; the answers in progress ended")
                self._restart()
            self._flush()

    def _intake(self, request: _Request, stopping: bool) -> None:
        generation, ask = request.generation, request.ask
        if request.count_only:
            try:
                counted = self._prompt(ask)
                generation.prompt_tokens = len(counted.tokens)
                _release(counted)  # its images' chunks: nothing will evaluate them
                self._answered(request.admitted, None)
            except RunnerError as exc:
                self._answered(request.admitted, exc)
            return
        prompt: Prompt | None = None
        try:
            if stopping:
                raise QueueFull("the server is stopping", retry_after=5)
            prompt = self._prompt(ask)
            n, room = len(prompt.tokens), int(self._loop.n_ctx_seq)
            if n == 0:
                raise BadField("messages" if ask.messages is not None else "prompt", "the prompt is empty")
            if n >= room:
                raise TooLong(
                    f"the prompt is {n:,} tokens; a sequence's context is {room:,} "
                    f"(runner serve --ctx), with room for at least one token of answer",
                    prompt_tokens=n,
                    context=room,
                )
            asked = _asked(request, prompt)
            try:  # built once, here: the job owns it (a grammar llama.cpp cannot parse: a 400)
                if asked.guide is not None:  # compiled for this vocabulary once, and kept
                    self.engine.model.guide(asked.guide)
                sampler = self.engine.sampler(asked)
            except InvalidSetting as exc:
                raise BadField("tool_choice" if ask.tools else "response_format", exc.problem) from None
        except RunnerError as exc:
            _release(prompt)
            self._answered(request.admitted, exc)
            with self._lock:
                self._in_flight -= 1
            return
        index = next(self._ids)
        generation.prompt_tokens = len(prompt.tokens)
        generation.scored = functools.partial(scored_tokens, self.engine.model)
        generation.request = asked
        # streamed, each token's logprobs go with its text; whole, they come with the result only
        streamed = generation.logprobs if ask.logprobs is not None and ask.stream else None
        generation.job = to_job(
            asked,
            index,
            sampler=sampler,
            on_piece=generation.piece,
            on_logprobs=streamed,
            arrived=request.arrived,
        )
        self._jobs[index] = generation
        self._loop.add(generation.job)
        self._answered(request.admitted, None)

    # -- embeddings, in the model's thread ---------------------------------------------------------

    def _embed_intake(self, request: EmbedRequest, stopping: bool) -> None:
        try:
            if stopping:
                raise QueueFull("the server is stopping", retry_after=5)
            self._embeds.take(request)
        except RunnerError as exc:  # a text too long or empty: 400; the context not made: 500
            self._embedded(request, exc)

    def _embed_step(self, stopping: bool) -> None:
        if stopping:
            for request in self._embeds.drop():
                self._embedded(request, QueueFull("the server is stopping", retry_after=5))
            return
        for request, error in self._embeds.step():
            if error is not None:
                ui.warn(f"{self.served.info.name}: {error}; the embedding requests in it ended")
            self._embedded(request, error)

    def _embedded(self, request: EmbedRequest, error: BaseException | None) -> None:
        """The request answered (its vectors and tokens) or failed, on the event loop's side."""
        with self._lock:
            self._embedding -= 1
        if error is None and self.metrics is not None:
            self.metrics.embedding(self.served.info.name, request.tokens, rerank=request.query is not None)
        if request.cancelled:
            return
        result = (request.vectors, request.tokens)

        def settle() -> None:
            if request.done.done():
                return
            if error is None:
                request.done.set_result(result)
            else:
                request.done.set_exception(error)

        request.done.get_loop().call_soon_threadsafe(settle)

    def _prompt(self, ask: Ask) -> Prompt:
        engine, header = self.engine, self.served.loaded.header
        if ask.infill is not None:
            try:
                return infill_prompt(
                    engine.model, ask.infill, int(self._loop.n_ctx_seq), self.served.info.name
                )
            except NoInfill as exc:
                raise BadField("model", str(exc)) from None
        if ask.prompt is not None:
            return render_prompt(engine, header, [Message("user", ask.prompt)], raw=True)
        vision = engine.vision
        images: list[Any] = []  # runner.images.Image, in the order of their markers
        messages = [_message(m, vision.marker if vision else "", images) for m in ask.messages or []]
        if images and vision is None:  # the HTTP side checks first: a model loaded without a projector
            raise BadField("messages", f"{self.served.info.name} takes no images (served without --mmproj)")
        tools = ask.tools if ask.tools and ask.tool_choice != "none" else None
        return render_prompt(
            engine, header, messages, enable_thinking=ask.think, quiet=True, tools=tools, images=images
        )

    def _done(self, result: Result) -> None:
        generation = self._jobs.pop(result.index)
        if result.error is not None:
            ui.warn(f"{self.served.info.name}: {result.error}")
        t = result.timings
        c = self.counters
        c["requests"] += 1
        c["prompt_tokens"] += t.prompt_tokens
        c["prefill_tokens"] += t.prefill_tokens
        c["cached_tokens"] += t.cached_tokens
        if self.metrics is not None:
            self.metrics.answered(self.served.info.name, result)
        with self._lock:
            self._in_flight -= 1
        generation.done(result)

    def _restart(self) -> None:
        for generation in list(self._jobs.values()):
            if generation.job is not None:
                self._done(dropped(generation.job))
        self._loop.close()
        self.engine.context.reset()
        self._loop = self._new_loop()

    def _new_loop(self) -> Loop:
        parallel = self.engine.context.n_seq
        return Loop(self.engine, self._done, parallel=parallel, store=self.store, argmax=True)

    @staticmethod
    def _answered(future: asyncio.Future[None], error: BaseException | None) -> None:
        def settle() -> None:
            if future.done():
                return
            if error is None:
                future.set_result(None)
            else:
                future.set_exception(error)

        future.get_loop().call_soon_threadsafe(settle)


def _deliver(sent: list[tuple[QueuedGeneration, Any]]) -> None:
    for generation, item in sent:
        generation.arrive(item)


def _message(m: dict[str, Any], marker: str, images: list[Any]) -> Message:
    """Ask.messages' one as the template reads it: text, an image's marker where it goes (its pixels
    added to `images`, in order)."""
    content = m.get("content")
    if isinstance(content, list):
        images += [part for part in content if not isinstance(part, str)]
        content = "".join(part if isinstance(part, str) else marker for part in content)
    extra = {k: v for k, v in m.items() if k not in ("role", "content") and v is not None}
    return Message(str(m["role"]), content if isinstance(content, str) else "", extra or None)


def _release(prompt: Prompt | None) -> None:
    """A prompt's image chunks freed where no job will evaluate them."""
    if prompt is not None and prompt.media is not None:
        prompt.media.close()


def _bad_field(exc: InvalidSetting, param: str) -> BadField:
    """An engine's InvalidSetting as a request's 400: the field it names (else `param`), said by its
    field name rather than the command line's flag."""
    field = exc.field or param
    return BadField(field, f"{field} {exc.problem}" if exc.field else str(exc))


def _shape(ask: Ask) -> tuple[Constraint | None, bool]:
    """What a request's answer must be (any JSON object, a schema's, a forced tool call's), compiled
    as every door compiles it (runner.engine.text.constrain); and whether the answer is then a tool
    call as a whole JSON object."""
    forced = bool(ask.tools) and ask.tool_choice not in (None, "auto", "none")
    param = "tool_choice" if forced else "response_format"
    try:
        if forced and ask.tools:
            return call_shape(ask.tools, ask.tool_choice), True
        if ask.json_schema is not None:
            try:
                schema = checked_schema(ask.json_schema, "the schema")
            except InvalidSetting as exc:
                raise BadField(param, f"the schema {exc.problem}") from None
            return schema_shape(schema), False
    except InvalidSetting as exc:  # what the constraint engine cannot enforce
        raise BadField(param, exc.problem) from None
    return (json_shape() if ask.json_object else None), False


def _asked(request: _Request, prompt: Prompt) -> Request:
    """The engine's Request for a served one, once its prompt is rendered: tool calls read back
    where tools were given (and not turned off)."""
    ask = request.ask
    tools = tuple(ask.tools) if ask.tools and ask.tool_choice != "none" else ()
    return Request(
        prompt,
        request.sampling,
        max_tokens=ask.max_tokens,
        stop=ask.stop,
        shape=request.shape,
        tools=tools,
        forced_call=request.forced,
        logprobs=ask.logprobs,
        echo=ask.echo,
        reasoning_budget=ask.reasoning_budget,
        reuse_chunks=REUSE_CHUNK if ask.infill is not None else 0,  # each keystroke moves the prefix's start
    )
