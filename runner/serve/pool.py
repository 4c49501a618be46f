"""The Backend the HTTP side talks to, over a pool of models on demand: each served model loaded when
it is first asked for, if the plan says it fits beside those already loaded; the least recently used
idle ones unloaded to make room, and any idle past its keep-alive or asked to leave (Ollama's
unload). A model named when the server started is kept while it serves: no keep-alive unloads it.

Every model's cost is its plan's (weights, KV cache for its sequences, compute buffers, per device),
counted against a budget taken when the server started (or `--memory`): the plan matches llama.cpp's
buffers, so room is decided before a load, not found out by one. Loads run in a worker thread (a
model's load takes seconds; the event loop goes on answering the others); two requests for a model
that is loading wait for the one load.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from runner import ui
from runner.errors import RunnerError, WontFit
from runner.serve.backend import Ask, BadField, Generation, ModelInfo, QueueFull, check_generates
from runner.serve.engine_backend import ModelThread, Served
from runner.serve.metrics import Metrics, ModelState

REAP_EVERY_S = 0.25  # how often idle models are checked against their keep-alive
SCAN_EVERY_S = 1.0  # the offered models are looked for again at most this often (a listing, a name)


@dataclass
class Offer:
    """A model the server may load: what it is, what it costs, how to load it."""

    name: str
    describe: Callable[[], ModelInfo]  # from its header alone
    needs: Callable[[], dict[str, int]]  # planned bytes per device ("cpu", "gpu"); WontFit if nowhere
    load: Callable[[], Served]
    key: object = None  # what a rescan compares: a file's size and time (another: a new offer)


@dataclass
class _Loaded:
    thread: ModelThread
    needs: dict[str, int]
    keep_alive: float | None  # seconds idle before it is unloaded; None: never
    pinned: bool = False  # named when the server started: kept while served, whatever a request asks
    active_at: float = field(default_factory=time.monotonic)  # last seen answering (or loaded)


class Pool:
    """The loaded models among the offered ones. Used from the event loop's thread only."""

    def __init__(
        self,
        offers: list[Offer],
        *,
        queue: int,
        budget: dict[str, int] | None,
        keep_alive: float | None,
        scan: Callable[[], list[Offer]] | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        self.offers = {o.name: o for o in offers}
        self.scan = scan  # the models on demand as they are now (files added, changed, removed)
        self._scanned_at = -SCAN_EVERY_S
        self._unreadable: dict[str, object] = {}  # name -> the key of its offer that could not be read
        self.queue = queue
        self.budget = budget
        self.keep_alive = keep_alive
        self.loaded: dict[str, _Loaded] = {}
        self._loading: dict[str, asyncio.Future[ModelThread]] = {}
        self._infos: dict[str, ModelInfo] = {}
        self._reaper: asyncio.Task[None] | None = None
        self.metrics = metrics  # loads and unloads counted; the loaded models read at each scrape
        if metrics is not None:
            metrics.watch(self.states)

    def preload(self, served: Served, needs: dict[str, int]) -> None:
        """A model loaded before the server started (runner serve MODEL …): kept while served. (Its offer
        could not always load it again: a file given by path is served under its stem, which names no
        file.)"""
        thread = ModelThread(served, self.queue, metrics=self.metrics)
        self.loaded[served.info.name] = _Loaded(thread, needs, None, pinned=True)
        if self.metrics is not None:
            self.metrics.loaded(served.info.name)

    def names(self) -> list[str]:
        """The models served now: the offers as last scanned, less those whose header cannot be read
        (each said once on stderr, until its file changes): a listing never fails for one bad file."""
        self.rescan()
        return [name for name in self.offers if self._readable(name)]

    def rescan(self) -> None:
        """The offers as `scan` finds them now: a new file offered, a changed one described again, a
        removed one no longer offered (a loaded or loading model stays until it is unloaded)."""
        now = time.monotonic()
        if self.scan is None or now - self._scanned_at < SCAN_EVERY_S:
            return
        self._scanned_at = now
        found = {o.name: o for o in self.scan()}
        for name, old in list(self.offers.items()):
            new = found.get(name)
            if (new is None or new.key != old.key) and name not in self.loaded and name not in self._loading:
                del self.offers[name]
                self._infos.pop(name, None)
        for name, offer in found.items():
            self.offers.setdefault(name, offer)

    def _readable(self, name: str) -> bool:
        key = self.offers[name].key
        if self._unreadable.get(name, self) == key:
            return False
        try:
            self.info(name)
        except (RunnerError, OSError) as exc:
            self._unreadable[name] = key
            ui.warn(f"not serving {name}: {exc}")
            return False
        self._unreadable.pop(name, None)
        return True

    def info(self, name: str) -> ModelInfo:
        if name in self.loaded:
            return self.loaded[name].thread.served.info
        if name not in self._infos:
            self._infos[name] = self.offers[name].describe()
        return self._infos[name]

    def states(self) -> list[ModelState]:
        """The loaded models as /metrics reads them (runner.serve.metrics)."""
        return [m.thread.state(m.needs) for m in self.loaded.values()]

    def memory(self, name: str) -> int:
        """The planned bytes of a loaded model, on every device (0: not loaded)."""
        found = self.loaded.get(name)
        return sum(found.needs.values()) if found else 0

    async def get(self, name: str, keep_alive: float | None = None) -> ModelThread:
        """The model's thread, loading it first if need be. keep_alive: this request's, in seconds
        (negative: forever); None leaves the model's as it is (the server's --keep-alive at its load). A
        pinned model keeps its own."""
        self._start_reaper()
        found = self.loaded.get(name)
        if found is None:
            pending = self._loading.get(name)
            if pending is None:
                pending = self._loading[name] = asyncio.get_running_loop().create_future()
                try:
                    pending.set_result(await self._load(name))
                except BaseException as exc:
                    pending.set_exception(exc)
                    pending.exception()  # retrieved: the waiters, if any, re-raise it
                    raise
                finally:
                    del self._loading[name]
            await asyncio.shield(pending)
            found = self.loaded[name]
        found.active_at = time.monotonic()
        if keep_alive is not None and not found.pinned:
            found.keep_alive = None if keep_alive < 0 else keep_alive
        return found.thread

    async def _load(self, name: str) -> ModelThread:
        offer = self.offers[name]
        try:
            needs = await asyncio.to_thread(offer.needs)
        except WontFit as exc:
            raise BadField("model", str(exc)) from None
        await self._make_room(name, needs)
        ui.info(f"loading {name} ({_mb(sum(needs.values()))} planned)")
        try:
            served = await asyncio.to_thread(offer.load)
        except WontFit as exc:
            raise BadField("model", str(exc)) from None
        except RunnerError as exc:  # the server's fault, not the request's: a 500 that says why
            raise RunnerError(f"{name} could not be loaded: {exc}") from None
        thread = ModelThread(served, self.queue, metrics=self.metrics)
        self.loaded[name] = _Loaded(thread, needs, self.keep_alive)
        if self.metrics is not None:
            self.metrics.loaded(name)
        return thread

    async def _make_room(self, name: str, needs: dict[str, int]) -> None:
        """Unload idle models, least recently used first, until `needs` fits the budget."""
        if self.budget is None:
            return
        for device, n in needs.items():
            have = self.budget.get(device, 0)
            if n > have:  # the parts as serve counts them (loader.serve_needs): fit --serve shows each
                more = "more memory for the server (--memory)" if device == "cpu" else "fewer layers there"
                raise BadField(
                    "model",
                    f"{name} needs {_mb(n)} of {device} memory: its weights, KV cache for every sequence, "
                    "compute and output buffers (with rows of logits for logprobs) and its embedding "
                    f"context, as `runner fit {self.info(name).path} --serve` with this server's flags "
                    f"shows them; this server may use {_mb(have)} there. To fit: fewer sequences "
                    f"(--parallel), a smaller context (--ctx), or {more}",
                )
        while not self._fits(needs):
            idle = [(m.active_at, n) for n, m in self.loaded.items() if m.thread.idle()]
            if not idle:
                raise QueueFull(f"{name} does not fit beside the models answering now; retry shortly", 2)
            await self.unload(min(idle)[1], why="to make room for " + name)

    def _fits(self, needs: dict[str, int]) -> bool:
        assert self.budget is not None
        for device, n in needs.items():
            used = sum(m.needs.get(device, 0) for m in self.loaded.values())
            if used + n > self.budget.get(device, 0):
                return False
        return True

    async def expire(self, name: str) -> bool:
        """Ollama's unload (keep_alive 0, no prompt): the model leaves now if idle, else once its answers
        end (its keep-alive made 0, for the reaper); a load under way is waited for first. Nothing to do
        for a model not loaded. False: a pinned model, which stays."""
        pending = self._loading.get(name)
        if pending is not None:
            await asyncio.wait([pending])  # loaded or failed: either way, then decided below
        found = self.loaded.get(name)
        if found is None:
            return True
        if found.pinned:
            return False
        found.keep_alive = 0.0
        if found.thread.idle():
            await self.unload(name, why="asked to by a request")
        return True

    async def unload(self, name: str, *, why: str) -> None:
        found = self.loaded.pop(name, None)
        if found is None:  # another task unloaded it while this one waited
            return
        ui.info(f"unloading {name} ({why})")
        await asyncio.to_thread(found.thread.close)
        if self.metrics is not None:
            self.metrics.unloaded(name)

    def _start_reaper(self) -> None:
        if self._reaper is None:
            self._reaper = asyncio.get_running_loop().create_task(self._reap())

    async def _reap(self) -> None:
        while True:
            await asyncio.sleep(REAP_EVERY_S)
            now = time.monotonic()
            for name, m in list(self.loaded.items()):
                if not m.thread.idle():
                    m.active_at = now
                elif (
                    m.keep_alive is not None
                    and now - m.active_at >= m.keep_alive
                    and name not in self._loading
                ):
                    await self.unload(name, why=f"idle {m.keep_alive:g} s")

    def stop(self) -> None:
        for m in self.loaded.values():
            m.thread.stop()

    def close(self) -> None:
        if self._reaper is not None:
            self._reaper.cancel()
        for m in self.loaded.values():
            m.thread.close()
        self.loaded.clear()


def _mb(n: int) -> str:
    return f"{n / 1e6:,.0f} MB"


class EngineBackend:
    """runner.serve.backend.Backend over the pool; close() ends every answer and frees every model."""

    def __init__(self, pool: Pool) -> None:
        self.pool = pool

    def names(self) -> list[str]:
        return self.pool.names()

    def info(self, name: str) -> ModelInfo:
        return self.pool.info(name)

    def ready(self) -> bool:
        return all(m.thread.thread.is_alive() for m in self.pool.loaded.values())

    def loaded(self) -> list[str]:
        return list(self.pool.loaded)

    def memory(self, name: str) -> int:
        return self.pool.memory(name)

    def counters(self, name: str) -> dict[str, int]:
        found = self.pool.loaded.get(name)
        if not found:
            return {}
        counters, states = dict(found.thread.counters), found.thread.states
        if states is not None:  # prompt states kept past their sequence, and brought back
            counters.update(states_kept=states.saved, states_restored=states.restored)
            counters["states_bytes"] = states.held
        return counters

    async def submit(self, ask: Ask) -> Generation:
        check_generates(self.pool.info(ask.model))
        thread = await self.pool.get(ask.model, ask.keep_alive)
        return await thread.submit(ask)

    async def load(self, name: str, keep_alive: float | None = None) -> float:
        """The model loaded (keep_alive as Ask's); the seconds this request waited for its load, 0 if it
        was loaded already."""
        start, cold = time.perf_counter(), name not in self.pool.loaded
        await self.pool.get(name, keep_alive)
        return time.perf_counter() - start if cold else 0.0

    async def unload(self, name: str) -> bool:
        return await self.pool.expire(name)

    async def count_tokens(self, ask: Ask) -> int:
        return await (await self.pool.get(ask.model)).count_tokens(ask)

    async def embed(self, model: str, texts: list[str], *, truncate: bool) -> tuple[list[list[float]], int]:
        return await (await self.pool.get(model)).embed(texts, truncate)

    async def rerank(
        self, model: str, query: str, documents: list[str], *, truncate: bool
    ) -> tuple[list[float], int]:
        values, tokens = await (await self.pool.get(model)).embed(documents, truncate, query=query)
        return [v[0] for v in values], tokens

    def stop(self) -> None:
        """The server is stopping: every answer ends at the next step (finish_reason "interrupted")."""
        self.pool.stop()

    def close(self) -> None:
        self.pool.close()
