"""Many prompts, decoded together: continuous batching over the engine's one model and context.

A second loop over the same Engine (its model, context, sampler chain, text assembly), not a second
engine: `runner run --each-line` (run_batch, every job known at the start) and `runner serve` (jobs
arriving while others decode, BatchLoop driven by the server's engine thread) run this one loop. The
context holds `engine.n_seq` sequences, each in its own stream of n_ctx / n_seq cells. Each step
decodes one token of every active sequence, and the prompts of new ones, in one llama_decode; a
sequence that finishes (or is cancelled) frees its slot, and the next job takes it at once.

Prefix reuse: each sequence remembers the tokens its cells hold. A new job takes the free sequence
whose cells share the longest head with its prompt (llama-server picks slots the same way), so a
chat client re-sending its history evaluates only the new turn; when another sequence (busy or not)
holds a longer head, its cells are copied in first (copy_sequence) and only the rest is evaluated.
run_batch also evaluates the prompts' shared head (system prompt, template) once, before the first
job, so every job copies it. The server also keeps what a sequence held when a new job takes it
(StateCache, host memory), so a prompt seen before, or a chat client whose sequence went to others,
is restored rather than evaluated again.
"""

from __future__ import annotations

import ctypes
import itertools
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from runner import interrupt
from runner.engine.answer import FINISH_INTERRUPTED, FINISH_LENGTH, FINISH_STOP, TextAssembler
from runner.engine.context import common_prefix
from runner.engine.engine import CTX_STEP, Engine
from runner.engine.llamacpp import LLAMA_LOG, llama
from runner.engine.sampling import SamplingConfig
from runner.errors import EngineError, InvalidSetting

MIN_SHARED = 4  # a shared head shorter than this is not worth a copy
MIN_SAVED = 16  # a sequence losing fewer tokens than this to a new job is not kept in the StateCache


@dataclass
class Job:
    index: int  # position in the input: answers come out in this order
    tokens: list[int]
    sampling: SamplingConfig
    max_tokens: int | None = None
    stop: tuple[str, ...] = ()
    grammar: str | None = None
    on_piece: Callable[[str], None] | None = None  # each piece of text as it comes (the loop's thread)
    arrived: float | None = None  # perf_counter when it was asked (the server: TTFT counts the wait)
    cancelled: bool = False  # set from any thread (a client went away): ended at the next step


@dataclass
class Done:
    index: int
    text: str
    finish_reason: str
    prompt_tokens: int
    prefill_tokens: int  # evaluated for this prompt (a head already in the cache was not)
    completion_tokens: int
    ttft_s: float  # from its arrival (else from when its slot took it) to its first token
    total_s: float
    context_full: bool = False
    error: str | None = None
    prefill_s: float = 0.0  # from when its slot took it to its first token


@dataclass
class BatchStats:
    prompts: int = 0
    prefill_tokens: int = 0  # every prompt token evaluated, the shared head once
    shared_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens a job found in its sequence (or copied in), not evaluated
    completion_tokens: int = 0
    steps: int = 0
    wall_s: float = 0.0
    interrupted: bool = False
    threads: int = 0  # the decode threads most tokens ran on (runner.engine.threads)
    thread_changes: int = 0


@dataclass
class _Slot:
    seq: int
    job: Job
    sampler: Any
    text: TextAssembler
    start: float
    pos: int = 0
    last: int = 0
    n_out: int = 0
    first_at: float | None = None
    prefill: int = 0
    parts: list[str] = field(default_factory=list)
    pending: list[int] = field(default_factory=list)  # in this step's batch: into the cells once decoded


class StateCache:
    """Sequences' KV states kept in host memory once their sequence goes to another prompt, so a
    prompt seen before is restored rather than evaluated again: a chat client coming back after
    other clients took its sequence, the same prompt sent again. llama-server keeps one too
    (--cache-ram). Each entry is llama_state_seq_get_data's bytes (the sequence's own cells only)
    and the tokens they hold; an entry another one extends is dropped; past `limit` bytes the least
    recently used go first. Used from the batch loop's thread only."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0  # bytes
        self.saved = 0  # entries ever kept
        self.restored = 0  # entries ever loaded into a sequence
        self._entries: OrderedDict[int, tuple[list[int], Any]] = OrderedDict()
        self._ids = itertools.count()

    def __len__(self) -> int:
        return len(self._entries)

    def best(self, tokens: Sequence[int], most: int) -> tuple[int | None, int]:
        """The entry sharing the longest head with `tokens` (at most `most`), and that length."""
        found, n = None, 0
        for key, (held, _) in self._entries.items():
            k = min(common_prefix(held, tokens), most)
            if k > n:
                found, n = key, k
        return found, n

    def save(self, ctx: Any, seq: int, tokens: Sequence[int]) -> None:
        """Keep what sequence `seq` holds (`tokens`), unless an entry holds as much already."""
        for key, (held, _) in list(self._entries.items()):
            common = common_prefix(held, tokens)
            if common == len(tokens):  # this entry holds all of the new one
                self._entries.move_to_end(key)
                return
            if common == len(held):
                self._drop(key)  # the new entry holds all of this one
        buffer = sequence_state(ctx, seq, self.limit)
        if buffer is None:
            return
        size = len(buffer)
        while self._entries and self.held + size > self.limit:
            self._drop(next(iter(self._entries)))
        self._entries[next(self._ids)] = (list(tokens), buffer)
        self.held += size
        self.saved += 1

    def load(self, ctx: Any, memory: Any, key: int, seq: int) -> list[int]:
        """Entry `key` into sequence `seq` (whatever it held is gone); the tokens it now holds
        (none where llama.cpp refused the state, or it did not hold what the entry says)."""
        tokens, buffer = self._entries[key]
        self._entries.move_to_end(key)
        lib = llama()
        ok = lib.llama_state_seq_set_data(ctx, buffer, len(buffer), seq)
        if not ok or int(lib.llama_memory_seq_pos_max(memory, seq)) != len(tokens) - 1:
            lib.llama_memory_seq_rm(memory, seq, -1, -1)
            self._drop(key)  # never trusted again
            return []
        self.restored += 1
        return list(tokens)

    def _drop(self, key: int) -> None:
        _, buffer = self._entries.pop(key)
        self.held -= len(buffer)


def copy_sequence(ctx: Any, memory: Any, source: int, seq: int) -> bool:
    """Sequence `source`'s cells into `seq` (whatever `seq` held is gone), through host memory.
    llama_memory_seq_cp across KV streams copies the whole stream (every cell of every layer: 47 MB
    for SmolLM2's 2,048-cell stream); this copies the source's cells only."""
    lib = llama()
    buffer = sequence_state(ctx, source)
    if buffer is not None and lib.llama_state_seq_set_data(ctx, buffer, len(buffer), seq):
        return True
    lib.llama_memory_seq_rm(memory, seq, -1, -1)
    return False


def sequence_state(ctx: Any, seq: int, most: int | None = None) -> Any:
    """Sequence `seq`'s cells as llama_state_seq_get_data writes them, in a buffer of their size;
    None where that is nothing, more than `most` bytes, or not what llama.cpp said it would write."""
    lib = llama()
    size = int(lib.llama_state_seq_get_size(ctx, seq))
    if size <= 0 or (most is not None and size > most):
        return None
    buffer = (ctypes.c_uint8 * size)()
    return buffer if int(lib.llama_state_seq_get_data(ctx, buffer, size, seq)) == size else None


def shared_prefix(prompts: Sequence[Sequence[int]]) -> int:
    """Tokens every prompt starts with, leaving each at least one of its own to evaluate."""
    if len(prompts) < 2:
        return 0
    n = min(len(p) for p in prompts) - 1
    for p in prompts[1:]:
        n = min(n, common_prefix(prompts[0], p))
    return n if n >= MIN_SHARED else 0


def run_batch(
    engine: Engine,
    jobs: Sequence[Job],
    on_done: Callable[[Done], None],
    *,
    parallel: int | None = None,
    share_prefix: bool = True,
) -> BatchStats:
    """Answer every job, up to `parallel` (default engine.n_seq) at a time; on_done as each ends.

    Ctrl-C (runner.interrupt) stops between steps: the answers already done were passed on; the
    rest are not. A job too long for a sequence's share of the context is done at once with an error.
    """
    start = time.perf_counter()
    with interrupt.deferred():
        engine.reset()  # the KV cache cleared, the engine's record of it too
        loop = BatchLoop(engine, on_done, parallel=parallel or engine.n_seq, reuse=share_prefix)
        try:
            fitting = []
            for job in jobs:
                if len(job.tokens) >= loop.n_ctx_seq:
                    loop.fail(job, loop.too_long(job))
                else:
                    fitting.append(job)
            if share_prefix:
                loop.share_head([j.tokens for j in fitting])
            for job in fitting:
                loop.add(job)
            while loop.busy():
                if interrupt.requested():
                    loop.stats.interrupted = True
                    interrupt.clear()
                    raise KeyboardInterrupt  # unfinished answers are dropped: what was done was passed on
                loop.step()
        finally:
            loop.close()
            engine.reset()
            loop.stats.prompts = len(jobs)
            loop.stats.wall_s = time.perf_counter() - start
    return loop.stats


class BatchLoop:
    """The loop itself: add() jobs at any time, step() until not busy(), close() at the end. Every
    call from one thread (llama.cpp's): the server's engine thread, or run_batch's caller."""

    def __init__(
        self,
        engine: Engine,
        on_done: Callable[[Done], None],
        *,
        parallel: int,
        reuse: bool = True,
        cache: StateCache | None = None,
    ) -> None:
        if not 1 <= parallel <= engine.n_seq:
            raise InvalidSetting(f"--parallel {parallel}: the context holds {engine.n_seq} sequences")
        self.engine = engine
        self.lib = llama()
        self.ctx = engine.ctx
        self.memory = engine._memory
        self.parallel = parallel
        self.on_done = on_done
        self.reuse = reuse  # False: every prompt evaluated whole (what prefix reuse saves, measured)
        self.cache = cache if reuse else None  # sequences' states kept past their sequence (the server)
        self.n_ctx_seq = int(self.lib.llama_n_ctx_seq(self.ctx))
        self.stats = BatchStats()
        self.batch = self.lib.llama_batch_init(engine.n_batch + parallel, 0, 1)
        self.cells: list[list[int]] = [[] for _ in range(parallel)]  # the tokens each sequence holds
        self.used: list[float] = [0.0] * parallel  # when each sequence last took a job
        self.free = list(range(parallel))
        self.active: list[_Slot] = []
        self.queue: deque[Job] = deque()
        engine.threads.begin()

    def close(self) -> None:
        for slot in self.active:
            self.lib.llama_sampler_free(slot.sampler)
        self.active.clear()
        if self.batch is not None:
            self.lib.llama_batch_free(self.batch)
            self.batch = None
        self.stats.threads = self.engine.threads.used()
        self.stats.thread_changes = self.engine.threads.changes

    def add(self, job: Job) -> None:
        if not job.tokens:  # nothing to evaluate, so no logits to sample the first token from
            self.fail(job, "the prompt is empty")
            return
        self.queue.append(job)

    def busy(self) -> bool:
        return bool(self.queue or self.active)

    def waiting(self) -> int:
        return len(self.queue)

    def share_head(self, prompts: Sequence[Sequence[int]]) -> None:
        """The head every prompt starts with, evaluated once in sequence 0 (each job copies it)."""
        shared = shared_prefix(prompts)
        if not shared:
            return
        head = list(prompts[0][:shared])
        self._evaluate(0, head, 0, logits=False)
        self.cells[0] = head
        self.stats.shared_tokens = shared
        self.stats.prefill_tokens += shared

    def step(self) -> None:
        """One llama_decode: the next token of every active sequence, and the prompts of new ones
        (as llama-server mixes them), as many as the batch holds. Cancelled jobs end first."""
        self._cancel()
        for slot in self.active:
            slot.pending = [slot.last]
        used = len(self.active)
        started: list[_Slot] = []
        while self.queue and self.free:
            job = self.queue[0]
            seq, keep, source, kept = self._place(job)
            if len(job.tokens) - keep > self.engine.n_batch - used:
                if started or self.active:
                    break  # the batch is full: next step
                self.queue.popleft()  # a prompt longer than a batch: alone, in n_batch chunks
                self.free.remove(seq)
                long = self._start(seq, job, keep, source, kept, evaluate=True)
                if long is not None and self._take(long, self._sample(long, -1)):
                    self.active.append(long)
                else:
                    self.free.append(seq)
                return
            self.queue.popleft()
            self.free.remove(seq)
            new = self._start(seq, job, keep, source, kept, evaluate=False)
            if new is None:
                self.free.append(seq)
                continue
            new.pending = job.tokens[keep:]
            used += len(new.pending)
            started.append(new)
        if used == 0:
            return
        # in sequence order, each sequence's tokens together: with a KV stream per sequence, llama.cpp
        # splits a batch into ubatches of consecutive sequence ids (split_equal), so a batch in the
        # order slots happened to free (3, 0, 5, 1 …) cost a ubatch per run: 32 clients on 8
        # sequences ran at 0.68x llama-server's aggregate, measured
        slots = sorted([*self.active, *started], key=lambda slot: slot.seq)
        self._clear()
        rows = {}
        for slot in slots:
            rows[slot.seq] = self._add(slot.seq, slot.pending, slot.pos, logits=True)
            slot.pos += len(slot.pending)
        self._decode()
        self.stats.steps += 1
        still = []
        for slot in slots:
            self.cells[slot.seq].extend(slot.pending)
            slot.pending = []
            if self._take(slot, self._sample(slot, rows[slot.seq])):
                still.append(slot)
            else:
                self.free.append(slot.seq)
        self.active = still

    def too_long(self, job: Job) -> str:
        """Why a prompt does not fit its sequence, and the --ctx that would (each sequence's, as
        --ctx is in every command), never past the context the model was trained on."""
        n, trained = len(job.tokens), self.engine.n_ctx_train
        suggest = -(-(n + (job.max_tokens or CTX_STEP)) // CTX_STEP) * CTX_STEP
        if trained and suggest > trained:
            return (
                f"the prompt is {n:,} tokens, more than this model's trained context of {trained:,} "
                "allows with room for an answer; shorten it"
            )
        return (
            f"the prompt is {n:,} tokens, more than a sequence's context of {self.n_ctx_seq:,}; "
            f"use --ctx {suggest} or more"
        )

    def fail(self, job: Job, error: str) -> None:
        self.on_done(Done(job.index, "", "error", len(job.tokens), 0, 0, 0.0, 0.0, error=error))

    # -- one sequence ----------------------------------------------------------------------------

    def _place(self, job: Job) -> tuple[int, int, int | None, int | None]:
        """Where the job goes: the free sequence holding the longest head of its prompt (else the one
        unused longest), how many of its cells stay, and a sequence or a kept state (self.cache) to
        copy a longer head from."""
        if not self.reuse:
            return min(self.free, key=lambda s: self.used[s]), 0, None, None
        most = len(job.tokens) - 1  # at least one token evaluated: its logits give the first token
        seq = max(
            self.free, key=lambda s: (min(common_prefix(self.cells[s], job.tokens), most), -self.used[s])
        )
        keep = min(common_prefix(self.cells[seq], job.tokens), most)
        source, kept, best = None, None, keep + MIN_SHARED - 1
        for other in range(self.parallel):
            if other != seq:
                n = min(common_prefix(self.cells[other], job.tokens), most)
                if n > best:
                    source, best = other, n
        if self.cache is not None and len(self.cache):
            key, n = self.cache.best(job.tokens, most)
            if n > best:
                source, kept, best = None, key, n
        if source is None and kept is None:
            return seq, keep, None, None
        return seq, best, source, kept

    def _start(
        self, seq: int, job: Job, keep: int, source: int | None, kept: int | None, *, evaluate: bool
    ) -> _Slot | None:
        """The job in sequence `seq`: its first `keep` tokens already there (or copied in from
        sequence `source`, or from the cache's entry `kept`), the rest evaluated now (when
        `evaluate`) or by the caller's next batch. What `seq` held is kept in the cache first when
        the job would lose MIN_SAVED tokens of it or more (llama-server: half of it; a chat client's
        short turn after the template's long head loses less than half, and is worth keeping)."""
        lib = self.lib
        try:
            sampler = self.engine._sampler(job.sampling, job.tokens, job.grammar)
        except InvalidSetting as exc:
            self.fail(job, str(exc))
            return None
        held = self.cells[seq]
        own = keep if source is None and kept is None else 0
        if self.cache is not None and len(held) - own >= MIN_SAVED:
            self.cache.save(self.ctx, seq, held)
        if kept is not None and self.cache is not None:
            self.cells[seq] = self.cache.load(self.ctx, self.memory, kept, seq)
        elif source is not None:
            ok = copy_sequence(self.ctx, self.memory, source, seq)
            self.cells[seq] = list(self.cells[source]) if ok else []
        keep = min(keep, len(self.cells[seq]))
        if keep < len(self.cells[seq]) and not lib.llama_memory_seq_rm(self.memory, seq, keep, -1):
            lib.llama_memory_seq_rm(self.memory, seq, -1, -1)  # a memory that cannot drop a tail
            keep = 0
        del self.cells[seq][keep:]
        self.used[seq] = time.perf_counter()
        slot = _Slot(seq, job, sampler, TextAssembler(job.stop), time.perf_counter(), pos=keep)
        tail = job.tokens[keep:]
        if evaluate:
            for at in range(0, len(tail), self.engine.n_batch):
                piece = tail[at : at + self.engine.n_batch]
                self._evaluate(seq, piece, slot.pos, logits=at + len(piece) == len(tail))
                self.cells[seq].extend(piece)
                slot.pos += len(piece)
        slot.prefill = len(tail)
        self.stats.prefill_tokens += len(tail)
        self.stats.cached_tokens += keep
        return slot

    def _take(self, slot: _Slot, token: int) -> bool:
        """One sampled token into its slot; False once that answer is over (and reported)."""
        if slot.first_at is None:
            slot.first_at = time.perf_counter()
        engine, job = self.engine, slot.job
        if engine.is_end(token):
            self._finish(slot, FINISH_STOP)
            return False
        slot.n_out += 1
        self.stats.completion_tokens += 1
        piece, stopped = slot.text.push(engine.token_bytes(token))
        self._emit(slot, piece)
        if stopped:
            self._finish(slot, FINISH_STOP)
            return False
        if job.max_tokens is not None and slot.n_out >= job.max_tokens:
            self._finish(slot, FINISH_LENGTH)
            return False
        if slot.pos + 1 >= self.n_ctx_seq:
            self._finish(slot, FINISH_LENGTH, context_full=True)
            return False
        slot.last = token
        return True

    def _emit(self, slot: _Slot, piece: str) -> None:
        if piece:
            slot.parts.append(piece)
            if slot.job.on_piece is not None:
                slot.job.on_piece(piece)

    def _cancel(self) -> None:
        """Jobs whose client went away: out of the queue, and out of their sequences."""
        if any(job.cancelled for job in self.queue):
            for job in [j for j in self.queue if j.cancelled]:
                self.queue.remove(job)
                self.on_done(Done(job.index, "", FINISH_INTERRUPTED, len(job.tokens), 0, 0, 0.0, 0.0))
        still = []
        for slot in self.active:
            if slot.job.cancelled:
                self._finish(slot, FINISH_INTERRUPTED, flush=False)
                self.free.append(slot.seq)
            else:
                still.append(slot)
        self.active = still

    def _finish(self, slot: _Slot, reason: str, *, context_full: bool = False, flush: bool = True) -> None:
        self.lib.llama_sampler_free(slot.sampler)
        if flush and not slot.text.stopped:
            self._emit(slot, slot.text.flush())
        now = time.perf_counter()
        first = slot.first_at or now
        self.on_done(
            Done(
                index=slot.job.index,
                text="".join(slot.parts),
                finish_reason=reason,
                prompt_tokens=len(slot.job.tokens),
                prefill_tokens=slot.prefill,
                completion_tokens=slot.n_out,
                ttft_s=first - (slot.job.arrived or slot.start),
                total_s=now - (slot.job.arrived or slot.start),
                context_full=context_full,
                prefill_s=first - slot.start,
            )
        )

    # -- llama.cpp -------------------------------------------------------------------------------

    def _sample(self, slot: _Slot, index: int) -> int:
        return int(self.lib.llama_sampler_sample(slot.sampler, self.ctx, index))

    def _clear(self) -> None:
        self.batch.n_tokens = 0

    def _add(self, seq: int, tokens: Sequence[int], pos: int, *, logits: bool) -> int:
        """Tokens of one sequence into the batch; returns the row of the last (its logits, if asked)."""
        b, n = self.batch, self.batch.n_tokens
        for i, token in enumerate(tokens):
            b.token[n + i] = token
            b.pos[n + i] = pos + i
            b.n_seq_id[n + i] = 1
            b.seq_id[n + i][0] = seq
            b.logits[n + i] = 0
        last = n + len(tokens) - 1
        b.logits[last] = int(logits)
        b.n_tokens = n + len(tokens)
        return last

    def _evaluate(self, seq: int, tokens: Sequence[int], pos: int, *, logits: bool) -> None:
        self._clear()
        self._add(seq, tokens, pos, logits=logits)
        self._decode()

    def _decode(self) -> None:
        rc = self.engine.decode(self.batch, self.batch.n_tokens)  # timed: threads follow the machine
        if rc != 0:
            raise EngineError(f"llama_decode failed ({rc}): {LLAMA_LOG.last_error() or 'no log'}")
