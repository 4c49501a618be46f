"""Many prompts, decoded together: continuous batching over the engine's one model and context.

A second loop over the same Engine (its model, context, sampler chain, text assembly), not a second
engine. The context holds `engine.n_seq` sequences, each in its own stream of n_ctx / n_seq cells.
Each step decodes one token of every active sequence in one llama_decode; a sequence that finishes
frees its slot, and the next prompt takes it at once. The prompts' shared head (system prompt,
template) is evaluated once, in the first sequence, and copied to each new one
(llama_memory_seq_cp: across streams llama.cpp copies the stream's buffer); each prompt then
evaluates only its own tail.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from runner import interrupt
from runner.engine.answer import FINISH_LENGTH, FINISH_STOP, TextAssembler
from runner.engine.context import common_prefix
from runner.engine.engine import CTX_STEP, Engine
from runner.engine.llamacpp import LLAMA_LOG, llama
from runner.engine.sampling import SamplingConfig
from runner.errors import EngineError, InvalidSetting

MIN_SHARED = 4  # a shared head shorter than this is not worth a copy


@dataclass
class Job:
    index: int  # position in the input: answers come out in this order
    tokens: list[int]
    sampling: SamplingConfig
    max_tokens: int | None = None
    stop: tuple[str, ...] = ()
    grammar: str | None = None


@dataclass
class Done:
    index: int
    text: str
    finish_reason: str
    prompt_tokens: int
    prefill_tokens: int  # evaluated for this prompt (the shared head was not)
    completion_tokens: int
    ttft_s: float  # from when its slot took it
    total_s: float
    context_full: bool = False
    error: str | None = None


@dataclass
class BatchStats:
    prompts: int = 0
    prefill_tokens: int = 0  # every prompt token evaluated, the shared head once
    shared_tokens: int = 0
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
    with interrupt.deferred():
        return _Batch(engine, parallel or engine.n_seq, on_done).run(jobs, share_prefix)


class _Batch:
    def __init__(self, engine: Engine, parallel: int, on_done: Callable[[Done], None]) -> None:
        if not 1 <= parallel <= engine.n_seq:
            raise InvalidSetting(f"--parallel {parallel}: the context holds {engine.n_seq} sequences")
        self.engine = engine
        self.lib = llama()
        self.ctx = engine.ctx
        self.memory = engine._memory
        self.parallel = parallel
        self.on_done = on_done
        self.n_ctx_seq = int(self.lib.llama_n_ctx_seq(self.ctx))
        self.stats = BatchStats()
        self.batch = self.lib.llama_batch_init(engine.n_batch + parallel, 0, 1)
        self.shared = 0
        self.holders: set[int] = set()  # sequences whose first `shared` cells are the shared head

    def run(self, jobs: Sequence[Job], share_prefix: bool) -> BatchStats:
        start = time.perf_counter()
        self.stats.prompts = len(jobs)
        self.engine.reset()  # the KV cache cleared, the engine's record of it too
        self.engine.threads.begin()
        try:
            self._run(jobs, share_prefix)
        finally:
            self.lib.llama_batch_free(self.batch)
            self.engine.reset()
            self.stats.wall_s = time.perf_counter() - start
            self.stats.threads = self.engine.threads.used()
            self.stats.thread_changes = self.engine.threads.changes
        return self.stats

    def _run(self, jobs: Sequence[Job], share_prefix: bool) -> None:
        fitting = []
        for job in jobs:
            if len(job.tokens) >= self.n_ctx_seq:
                self._fail(job, self._too_long(job))
            else:
                fitting.append(job)
        if share_prefix:
            self.shared = shared_prefix([j.tokens for j in fitting])
        if self.shared:
            self._evaluate(0, fitting[0].tokens[: self.shared], 0, logits=False)
            self.holders.add(0)
            self.stats.shared_tokens = self.shared
            self.stats.prefill_tokens += self.shared
        queue = deque(fitting)
        free = list(range(self.parallel))
        active: list[_Slot] = []
        while queue or active:
            if interrupt.requested():
                self.stats.interrupted = True
                for slot in active:  # unfinished answers are dropped: what was done was passed on
                    self.lib.llama_sampler_free(slot.sampler)
                interrupt.clear()
                raise KeyboardInterrupt
            # one llama_decode: the next token of every active sequence, and the prompts of new ones
            # (as llama-server mixes them), as many as the batch holds
            self._clear()
            rows = [self._add(slot.seq, [slot.last], slot.pos, logits=True) for slot in active]
            for slot in active:
                slot.pos += 1
            started: list[tuple[_Slot, int]] = []
            alone = False
            while queue and free:
                job, seq = queue[0], free[0]
                if len(job.tokens) - self.shared > self.engine.n_batch - self.batch.n_tokens:
                    if started or active:
                        break  # the batch is full: next step
                    queue.popleft()  # a prompt longer than a batch: alone, in n_batch chunks
                    free.pop(0)
                    long = self._start(seq, job, evaluate=True)
                    if long is not None and self._take(long, self._sample(long, -1)):
                        active.append(long)
                    else:
                        free.append(seq)
                    alone = True
                    break
                queue.popleft()
                free.pop(0)
                new = self._start(seq, job, evaluate=False)
                if new is None:
                    free.append(seq)
                    continue
                tail = job.tokens[self.shared :]
                started.append((new, self._add(seq, tail, new.pos, logits=True)))
                new.pos += len(tail)
            if alone or self.batch.n_tokens == 0:
                continue
            self._decode()
            self.stats.steps += 1
            still = []
            for slot, row in [*zip(active, rows, strict=True), *started]:
                if self._take(slot, self._sample(slot, row)):
                    still.append(slot)
                else:
                    free.append(slot.seq)
            active = still

    def _too_long(self, job: Job) -> str:
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

    # -- one sequence ----------------------------------------------------------------------------

    def _start(self, seq: int, job: Job, *, evaluate: bool) -> _Slot | None:
        """The job in sequence `seq`: the shared head copied in, its own tail evaluated now (when
        `evaluate`) or by the caller's next batch."""
        lib = self.lib
        begin = self.shared
        if self.shared and seq not in self.holders:
            source = next(iter(self.holders))
            lib.llama_memory_seq_cp(self.memory, source, seq, -1, -1)  # the whole stream: its head
            self.holders.add(seq)
        lib.llama_memory_seq_rm(self.memory, seq, begin, -1)
        try:
            sampler = self.engine._sampler(job.sampling, job.tokens, job.grammar)
        except InvalidSetting as exc:
            self._fail(job, str(exc))
            return None
        slot = _Slot(seq, job, sampler, TextAssembler(job.stop), time.perf_counter(), pos=begin)
        tail = job.tokens[begin:]
        if evaluate:
            for at in range(0, len(tail), self.engine.n_batch):
                piece = tail[at : at + self.engine.n_batch]
                self._evaluate(seq, piece, slot.pos, logits=at + len(piece) == len(tail))
                slot.pos += len(piece)
        slot.prefill = len(tail)
        self.stats.prefill_tokens += len(tail)
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
        slot.parts.append(piece)
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

    def _finish(self, slot: _Slot, reason: str, *, context_full: bool = False) -> None:
        self.lib.llama_sampler_free(slot.sampler)
        if not slot.text.stopped:
            slot.parts.append(slot.text.flush())
        now = time.perf_counter()
        self.on_done(
            Done(
                index=slot.job.index,
                text="".join(slot.parts),
                finish_reason=reason,
                prompt_tokens=len(slot.job.tokens),
                prefill_tokens=slot.prefill,
                completion_tokens=slot.n_out,
                ttft_s=(slot.first_at or now) - slot.start,
                total_s=now - slot.start,
                context_full=context_full,
            )
        )

    def _fail(self, job: Job, error: str) -> None:
        self.on_done(Done(job.index, "", "error", len(job.tokens), 0, 0, 0.0, 0.0, error=error))

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
