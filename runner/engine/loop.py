"""The one generation loop: every answer of every command, one sequence or many, in one llama_decode
a step (llama.cpp's server does the same in update_slots).

`runner run` and `runner chat` are a batch of one (Engine.stream), `--each-line` and `runner bench`'s
batched row a batch known at the start (runner.engine.batch.run_batch), `runner serve` a batch whose
jobs arrive while others decode (its model thread calls add() and step()). Each step adds to one batch
the next token of every active sequence, with the tokens its speculator drafted (runner.engine
.speculate: verified in the same step, with logits at each of them), and the prompts of new jobs, as
many as the batch holds; a prompt too long for the room left, or any prompt of a one-sequence loop,
is evaluated alone first (Ctrl-C stops it mid-batch). Then each sequence samples its own tokens with
its own sampler chain and takes them (runner.engine.sequence: text, reasoning, stop strings, limits);
an answer that ends frees its sequence for the next job at once.

Prefix reuse (runner.engine.prefix): a job takes the free sequence whose cells share the longest head
with its prompt; a longer head held by another sequence is copied in, one kept in the prefix store's
RAM or disk tier restored, and only the rest evaluated. What a sequence held is kept in RAM before a
new job overwrites it; a prompt's stable head (job.head) is stored on disk once evaluated.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from runner.engine import logprobs
from runner.engine.answer import FINISH_ERROR, FINISH_INTERRUPTED, FINISH_LENGTH, Result
from runner.engine.cells import MIN_SHARED, add_tokens, common_prefix, shared_prefix
from runner.engine.context import Interrupted
from runner.engine.llamacpp import llama
from runner.engine.prefix import Found, PrefixStore, copy_sequence
from runner.engine.promptcache import CacheUse
from runner.engine.reuse import reusable, reuse_chunks
from runner.engine.sequence import Job, Slot, draft, dropped, failed, share_cost
from runner.engine.speculate import Speculator
from runner.engine.text.reasoning import closing
from runner.errors import EngineError, InvalidSetting

if TYPE_CHECKING:
    from runner.engine.engine import Engine
    from runner.engine.guide import Guide


class LoopStats:
    """What a loop did, for --verbose and the benchmarks."""

    def __init__(self) -> None:
        self.prompts = 0
        self.prefill_tokens = 0  # every prompt token evaluated, a shared head once
        self.shared_tokens = 0
        self.cached_tokens = 0  # prompt tokens a job found in its sequence (or copied in), not evaluated
        self.completion_tokens = 0
        self.steps = 0
        self.wall_s = 0.0
        self.interrupted = False
        self.threads = 0  # the decode threads most tokens ran on (runner.engine.threads)
        self.thread_changes = 0


class Loop:
    """add() jobs at any time, step() until not busy(), close() at the end. Every call from one thread
    (llama.cpp's): the server's model thread, or the command's own."""

    def __init__(
        self,
        engine: Engine,
        on_done: Callable[[Result], None],
        *,
        parallel: int | None = None,
        reuse: bool = True,
        store: PrefixStore | None = None,
        argmax: bool = False,
    ) -> None:
        """argmax: a greedy chain's token is the logits' argmax (runner.engine.logprobs.argmax), numpy
        imported here (~50 ms): for a long-lived loop, the server's."""
        context = engine.context
        parallel = parallel or context.n_seq
        if not 1 <= parallel <= context.n_seq:
            raise InvalidSetting(f"--parallel {parallel}: the context holds {context.n_seq} sequences")
        self.engine = engine  # its speculation, read as each job starts
        self.context = context  # the KV cache every step decodes into
        self.model = engine.model  # the vocabulary a step's tokens are read with
        self.lib = llama()
        self.parallel = parallel
        self.on_done = on_done
        self.reuse = reuse  # False: every prompt evaluated whole (what prefix reuse saves, measured)
        self.store = store if reuse else None
        self.cells = context.cells  # the tokens each sequence holds
        self.used: list[float] = [0.0] * parallel  # when each sequence last took a job
        self.free = list(range(parallel))
        self.active: list[Slot] = []
        self.queue: deque[Job] = deque()
        self.stats = LoopStats()
        self._speculators: dict[int, Speculator] = {}
        self._speculation: Any = None  # the engine's setting the speculators were made for
        self.argmax = argmax
        if argmax:
            import numpy  # noqa: F401  # now, not at the first token

        context.threads.begin()

    @property
    def n_ctx_seq(self) -> int:
        return self.context.n_ctx_seq

    def close(self) -> None:
        for slot in self.active:
            self.lib.llama_sampler_free(slot.sampler)
        self.active.clear()
        for job in self.queue:
            self._free_sampler(job)
        self.queue.clear()
        for speculator in self._speculators.values():
            speculator.close()
        self._speculators.clear()
        self.stats.threads = self.context.threads.used()
        self.stats.thread_changes = self.context.threads.changes

    def add(self, job: Job) -> None:
        if not job.tokens:  # nothing to evaluate, so no logits to sample the first token from
            self.fail(job, "the prompt is empty")
            return
        if job.echo and job.media is not None:
            self.fail(job, "a prompt with images cannot be echoed (its images have no tokens to score)")
            return
        too_long = self.context.too_long(len(job.tokens), job.max_tokens)
        if too_long is not None:
            self.fail(job, str(too_long))
            return
        self.queue.append(job)

    def busy(self) -> bool:
        return bool(self.queue or self.active)

    def waiting(self) -> int:
        return len(self.queue)

    def fail(self, job: Job, error: str) -> None:
        self._free_sampler(job)
        self.on_done(failed(job, error))

    def share_head(self, prompts: list[list[int]]) -> None:
        """The head every prompt starts with, evaluated once in sequence 0 (each job copies it)."""
        shared = shared_prefix(prompts)
        if not shared:
            return
        self.context.prefill(prompts[0][:shared], 0)
        self.stats.shared_tokens = shared
        self.stats.prefill_tokens += shared

    def interrupt(self) -> None:
        """Every active answer ends now, interrupted, what it made kept (Ctrl-C in run and chat)."""
        for slot in self.active:
            self._finish(slot, FINISH_INTERRUPTED)
            self.free.append(slot.seq)
        self.active = []
        while self.queue:
            job = self.queue.popleft()
            self._free_sampler(job)
            self.on_done(dropped(job))

    # -- one step --------------------------------------------------------------------------------

    def step(self) -> None:
        """One llama_decode: every active sequence's next token and drafts, and the prompts of new
        jobs (as llama-server mixes them), as many as the batch holds. Cancelled jobs end first."""
        self._cancel()
        context = self.context
        room = context.n_batch - len(self.active)
        started: list[Slot] = []
        while self.queue and self.free:
            job = self.queue[0]
            seq, keep, found = self._place(job)
            if self.parallel == 1 or job.echo or job.media is not None or len(job.tokens) - keep > room:
                if started or (self.active and job.media is None):
                    break  # the batch is full: next step (an image's prompt pauses the others instead)
                self.queue.popleft()
                self._alone(seq, job, keep, found)  # alone, in n_batch chunks, Ctrl-C stopping it
                return
            self.queue.popleft()
            slot = self._start(seq, job, keep, found)
            if slot is None:
                continue
            slot.pending = job.tokens[len(self.cells[seq]) :]
            room -= len(slot.pending)
            started.append(slot)
        for slot in self.active:
            slot.pending = [slot.last]
        if not self.active and not started:
            return
        drafted = (
            0 if started or self.engine.speculation is None else draft(self.active, room, self.n_ctx_seq)
        )
        # in sequence order, each sequence's tokens together: with a KV stream per sequence, llama.cpp
        # splits a batch into ubatches of consecutive sequence ids (split_equal), so a batch in the
        # order slots happened to free (3, 0, 5, 1 …) cost a ubatch per run: 32 clients on 8
        # sequences ran at 0.68x llama-server's aggregate, measured
        slots = sorted([*self.active, *started], key=lambda s: s.seq)
        total = sum(len(s.pending) + len(s.drafts) for s in slots)
        context.reserve(max(len(self.cells[s.seq]) + len(s.pending) + len(s.drafts) for s in slots))
        batch = context.batch_for(total)
        for slot in slots:
            tokens = slot.pending + slot.drafts
            slot.row = add_tokens(batch, slot.seq, tokens, slot.pos, all_logits=bool(slot.drafts))
        began = time.perf_counter()
        context.evaluate(batch)
        seconds = time.perf_counter() - began
        self.stats.steps += 1
        if self.engine.spec_costs is not None and not started:
            share_cost(self.engine.spec_costs, slots, drafted, seconds, parallel=self.parallel > 1)
        still = []
        for slot in slots:
            if self._advance(slot):
                still.append(slot)
            else:
                self.free.append(slot.seq)
        self.active = still

    def _advance(self, slot: Slot) -> bool:
        """After the decode: the slot's tokens in its cells, its samples taken (drafts verified in
        order: kept while the target's own sample agrees, the rest dropped from the cells)."""
        held = self.cells[slot.seq]
        held.extend(slot.pending)
        slot.pos += len(slot.pending)
        first = slot.row + len(slot.pending) - 1  # the row whose logits give the next token
        drafts, slot.pending, slot.drafts = slot.drafts, [], []
        for i in range(len(drafts) + 1):
            token = self._sample(slot, first + i)
            kept = i < len(drafts) and token == drafts[i] and not self.model.is_end(token)
            if token < 0 or not self._take(slot, token):
                if drafts:
                    self._drop_tail(slot)
                return False
            if not kept:
                break
            held.append(token)  # a kept draft: its keys and values stay
            slot.pos += 1
        if drafts:
            if slot.speculator is not None:
                slot.speculator.verified(len(drafts), i, *slot.verify_s, measured=self.parallel == 1)
            self._drop_tail(slot)
        return True

    def _sample(self, slot: Slot, row: int) -> int:
        """The slot's next token from the logits of batch row `row` (-1: the last), by its sampler
        chain, after its guide (a schema's) masked every token the schema cannot take there. -1
        where the guide refused the token (the answer has ended, its error said)."""
        if slot.forcing:  # the end of its reasoning, its budget spent: the chain sees it, nothing drawn
            forced = slot.forcing.pop(0)
            self.lib.llama_sampler_accept(slot.sampler, forced)
            return forced
        guide = slot.guide
        if guide is not None:
            guide.mask(self.lib.llama_get_logits_ith(self.context.ctx, row))
        token = logprobs.argmax(self.context.ctx, row, self.model.n_vocab) if slot.argmax else None
        if token is None:
            token = int(self.lib.llama_sampler_sample(slot.sampler, self.context.ctx, row))
        if slot.job.logprobs is not None:
            slot.scored = self._score(slot, row, token)
        if guide is None or guide.take(token):
            return token
        self._finish(slot, FINISH_ERROR, error=f"the schema's constraint failed: {guide.error}")
        return -1

    def _score(self, slot: Slot, row: int, token: int) -> logprobs.TokenLogprob:
        """The sampled token's log-probability and the job's alternatives, from the row it came from."""
        n_top = slot.job.logprobs or 0
        return logprobs.read(logprobs.row(self.context.ctx, row, self.model.n_vocab), token, n_top)

    def _drop_tail(self, slot: Slot) -> None:
        """The rejected drafts out of the sequence's cells (those at its next position and after)."""
        if not self.lib.llama_memory_seq_rm(self.context.memory, slot.seq, slot.pos, -1):
            self.context.reset()
            raise EngineError("llama.cpp could not drop the rejected draft tokens")

    def _take(self, slot: Slot, token: int) -> bool:
        """One sampled token into its slot; False once that answer is over (and reported)."""
        before = slot.n_out
        reason = slot.take(token, self.model, self.n_ctx_seq)
        self.stats.completion_tokens += slot.n_out - before
        if reason is None:
            return True
        self._finish(slot, reason)
        return False

    # -- speculation ------------------------------------------------------------------------------

    def _speculator(self, seq: int) -> Speculator | None:
        """Sequence `seq`'s speculator (its measured costs shared by all), made once per setting."""
        setting = self.engine.speculation
        if setting is not self._speculation:
            for speculator in self._speculators.values():
                speculator.close()
            self._speculators.clear()
            self._speculation = setting
        if setting is None:
            return None
        if seq not in self._speculators:
            self._speculators[seq] = self.engine.new_speculator(seq)
        speculator = self._speculators[seq]
        speculator.begin()
        return speculator

    # -- a job into its sequence -------------------------------------------------------------------

    def _place(self, job: Job) -> tuple[int, int, Found | None]:
        """Where the job goes: the free sequence holding the longest head of its prompt (else the one
        unused longest), how many of its cells stay, and a longer head to copy or restore instead."""
        if not self.reuse or job.echo:  # echo: the prompt evaluated whole, logits at every position
            return min(self.free, key=lambda s: self.used[s]), 0, None
        most = len(job.tokens) - 1  # at least one token evaluated: its logits give the first token
        seq = max(
            self.free,
            key=lambda s: (reusable(self.cells[s], job.tokens, job.reuse_chunks, most), -self.used[s]),
        )
        keep = reusable(self.cells[seq], job.tokens, job.reuse_chunks, most)  # the common head, or more
        found, best = None, keep + MIN_SHARED - 1
        for other in range(self.parallel):
            if other != seq:
                n = min(common_prefix(self.cells[other], job.tokens), most)
                if n > best:
                    found, best = Found(n, source=other), n
        if self.store is not None:
            kept = self.store.find(self.context, job.tokens, most, best)
            if kept is not None:
                found = kept
        return seq, keep, found

    def _start(self, seq: int, job: Job, keep: int, found: Found | None) -> Slot | None:
        """The job in sequence `seq`: its first `keep` tokens already there, or a longer head copied
        or restored (`found`); its stable head evaluated and stored first where the store wants it.
        None where it did not start (a grammar or schema refused, Ctrl-C: its result given). What a
        failed start built is freed in one place, the finally."""
        self.free.remove(seq)
        sampler, job.sampler = job.sampler, None  # this start owns it now
        slot: Slot | None = None
        started = False
        try:
            if sampler is None:
                sampler = self.model.sampler(job.sampling, job.tokens, job.grammar, window=self.context.n_ctx)
            guide = self.model.guide(job.guide) if job.guide is not None else None
            slot, keep, use = self._fill(seq, job, keep, found, (sampler, guide))
            self._head(slot, keep, use)
            started = True
            return slot
        except InvalidSetting as exc:  # a grammar llama.cpp, or a schema llguidance, refuses
            self.on_done(failed(job, str(exc)))
            return None
        except Interrupted:  # Ctrl-C stopped its head's prefill: the answer ends before its first token
            assert slot is not None
            self._finish(slot, FINISH_INTERRUPTED)  # its sampler freed there
            sampler = None
            return None
        finally:
            if not started:  # a failed llama_decode or a signal too: the sequence is free again
                if sampler is not None:
                    self.lib.llama_sampler_free(sampler)
                self.free.append(seq)

    def _fill(
        self, seq: int, job: Job, keep: int, found: Found | None, sampling: tuple[Any, Guide | None]
    ) -> tuple[Slot, int, CacheUse]:
        """Sequence `seq` made to hold what it can of the job's prompt without evaluating any: what
        it keeps, a head copied from another sequence or restored from the store (what it held kept
        in the store's RAM first where the job would lose enough of it). The job's slot, the tokens
        its sequence now holds, and what the store did."""
        context = self.context
        held = self.cells[seq]
        use = CacheUse()
        if job.reuse_chunks and found is None and self.reuse and not job.echo:  # runs moved into place
            keep = reuse_chunks(context, job.tokens, seq, job.reuse_chunks, len(job.tokens) - 1)
        if self.store is not None:
            self.store.keep(context, seq, len(held) - (keep if found is None else 0))
        if found is not None and found.source is not None:
            copy_sequence(context, found.source, seq)
        elif found is not None and self.store is not None:
            use = self.store.load(context, job.tokens, found, seq)
        if self.reuse and not job.echo:
            keep = context.keep_head(job.tokens, seq)
        else:  # every prompt evaluated whole (what prefix reuse saves, measured; echo's scores)
            context.forget(seq)
            keep = 0
        self.used[seq] = time.perf_counter()
        speculator = self._speculator(seq) if job.media is None else None  # no drafts after images
        slot = Slot(seq, job, sampling[0], speculator, time.perf_counter(), sampling[1], cache_use=use)
        slot.argmax = self.argmax and self.model.argmax_only(job.sampling, job.grammar)
        closing_text = closing(job.reasoning) if job.reasoning_budget is not None else None
        if closing_text is not None:  # tokenized once, forced when the budget is spent
            slot.closer = self.model.tokenize(closing_text, add_special=False, parse_special=True)
            if job.reasoning_budget == 0 and job.in_reasoning and job.grammar is None and job.guide is None:
                slot.forcing, slot.closer = slot.closer, []  # no thinking at all: its end comes first
        self._placed(slot)
        slot.threads_mark = context.threads.mark()
        if slot.speculator is not None:
            slot.history = list(job.tokens)
        return slot, keep, use

    def _head(self, slot: Slot, keep: int, use: CacheUse) -> None:
        """The job's stable head evaluated and stored on disk first, where the store wants it and the
        sequence does not hold it yet; the prompt's counts."""
        job, store = slot.job, self.store
        head = job.tokens[: job.head]
        if (
            store is not None
            and not job.echo
            and keep < len(head) < len(job.tokens)
            and store.wants(self.context, head)
        ):
            self.context.prefill(head, slot.seq)
            stored = store.store(self.context, head, slot.seq)
            slot.cache_use = CacheUse(use.loaded_tokens, stored.stored_tokens, stored.write_s, use.read_s)
            slot.prefill += len(head) - keep
            keep = len(head)
            self._placed(slot)
        slot.prefill += len(job.tokens) - keep
        self.stats.prefill_tokens += len(job.tokens) - keep
        self.stats.cached_tokens += keep

    def _alone(self, seq: int, job: Job, keep: int, found: Found | None) -> None:
        """A prompt evaluated alone (a one-sequence loop, or longer than the batch's room), in n_batch
        chunks that Ctrl-C can stop, then its first token sampled."""
        slot = self._start(seq, job, keep, found)
        if slot is None:
            return
        try:
            if job.echo:
                slot.prompt_logprobs = logprobs.score_prompt(self.context, job.tokens, seq, job.logprobs or 0)
            else:
                self.context.prefill(job.tokens, seq, media=job.media)
        except Interrupted:
            self._interrupted(slot)
            return
        except BaseException:  # llama_decode failed, or a signal: the sequence is free again
            self.lib.llama_sampler_free(slot.sampler)
            self.free.append(seq)
            raise
        finally:
            if job.media is not None:
                job.media.close()  # its images are in the cells now (or never will be)
        self._placed(slot)
        self.stats.steps += 1
        if job.max_tokens == 0:  # echo's prompt scores alone (an evaluation harness's log-likelihood)
            self._finish(slot, FINISH_LENGTH)
            self.free.append(seq)
            return
        token = self._sample(slot, -1)
        if token >= 0 and self._take(slot, token):
            self.active.append(slot)
        else:
            self.free.append(seq)

    def _placed(self, slot: Slot) -> None:
        """The slot's next position from what its sequence holds now (cells, less what images saved)."""
        slot.pos = self.context.position(slot.seq)
        slot.fewer = len(self.cells[slot.seq]) - slot.pos

    def _interrupted(self, slot: Slot) -> None:
        """Ctrl-C stopped its prefill: the answer ends before its first token."""
        self._finish(slot, FINISH_INTERRUPTED)
        self.free.append(slot.seq)

    # -- the end of a job ----------------------------------------------------------------------

    def _cancel(self) -> None:
        """Jobs whose client went away: out of the queue, and out of their sequences."""
        if any(job.cancelled for job in self.queue):
            for job in [j for j in self.queue if j.cancelled]:
                self.queue.remove(job)
                self._free_sampler(job)
                self.on_done(dropped(job))
        if not any(slot.job.cancelled for slot in self.active):
            return
        still = []
        for slot in self.active:
            if slot.job.cancelled:
                self._finish(slot, FINISH_INTERRUPTED, flush=False)
                self.free.append(slot.seq)
            else:
                still.append(slot)
        self.active = still

    def _finish(self, slot: Slot, reason: str, *, flush: bool = True, error: str | None = None) -> None:
        self.lib.llama_sampler_free(slot.sampler)
        slot.sampler = None
        threads, changes = self.context.threads.since(slot.threads_mark)
        extra = {"load_s": self.engine.load_s, "threads": threads, "thread_changes": changes}
        self.on_done(slot.result(reason, flush=flush, extra=extra, error=error))

    def _free_sampler(self, job: Job) -> None:
        if job.sampler is not None:
            self.lib.llama_sampler_free(job.sampler)
            job.sampler = None
