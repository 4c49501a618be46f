"""A llama.cpp context over a loaded model (runner.engine.model) and its KV cache: which tokens each
sequence's cells hold, evaluating more (the one prefill every caller uses: the loop for a prompt alone,
a draft model, scoring, the benchmarks), keeping a prefix and dropping the rest, a sequence's state as
bytes (the prefix tiers, a context that grows), the llama_batch the loop fills, and why a prompt does
not fit.

An Engine (runner.engine.engine) holds one Context over its Model; runner.engine.loop runs the
generation over these steps. A one-sequence context is allocated small and grows as it fills (reserve).
"""

from __future__ import annotations

import ctypes
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from runner import interrupt
from runner.engine.cells import add_tokens, common_prefix, restream
from runner.engine.llamacpp import LLAMA_LOG, Placement, context_params, interrupt_callbacks, llama
from runner.engine.model import Model
from runner.engine.positions import Positions, outside_image
from runner.engine.threads import Threads, set_threads
from runner.errors import EngineError, PromptTooLong
from runner.limits import DEFAULT_CTX

if TYPE_CHECKING:
    from runner.engine.vision import ImageSpan, MediaPrompt

CTX_PAD = 256  # llama.cpp rounds a context up to this
CTX_STEP = 256  # a suggested --ctx is rounded up to this
START_CTX = 512  # a one-sequence context is first allocated at most this large, then grows (reserve)
DECODE_ABORTED = 2  # llama_decode's status when the abort callback stopped it


class _Deadline:
    """The abort callback of a probe's step: true past its deadline (and, within a prefill, on Ctrl-C
    as well). llama.cpp calls it after every graph node, a Python call each (~8% of a one-token step),
    so it is set for a probe's steps only. Made once, kept alive for the process."""

    def __init__(self) -> None:
        self.deadline = 0.0
        self.interrupts = False
        self._callback: Any = None

    def arm(self, deadline: float, *, interrupts: bool) -> Any:
        self.deadline, self.interrupts = deadline, interrupts
        if self._callback is None:
            self._callback = llama().ggml_abort_callback(self._past)
        return self._callback

    def _past(self, _data: Any) -> bool:
        return time.perf_counter() > self.deadline or (self.interrupts and interrupt.requested())


DEADLINE = _Deadline()


class Interrupted(Exception):
    """Ctrl-C during a prefill: llama.cpp aborted the batch (the engine's own, never seen outside)."""


class Context:
    """A llama.cpp context over a loaded Model: its KV cache, which tokens each sequence's cells hold,
    and the steps that fill and empty them. The loop, the prefix tiers, speculation's draft and
    scoring all work through one."""

    def __init__(
        self,
        model: Model,
        n_ctx: int | None,
        n_seq: int,
        threads: Threads,
        placement: Placement,
        pooling: int | None = None,
    ) -> None:
        """A context for n_seq sequences sharing n_ctx (one sequence: n_ctx is what it may grow to,
        allocated START_CTX first); EngineError where llama.cpp cannot make it. `pooling` (a
        llama_pooling_type): a context that pools instead of generating (runner.engine.embed), each
        batch at most n_ctx tokens in one ubatch, its cells one pool for every sequence.

        `threads` may be shared with another context over the same model (an embedding context
        beside the generation one): each sets the count on its own llama context before it decodes."""
        self.model = model
        self.pooling = pooling
        self.n_seq = n_seq
        self.threads = threads  # the decode thread count, chosen again between steps (runner.engine.threads)
        self.kv_type = placement.kv_type or "f16"
        self.flash_attn = placement.flash_attn  # None: llama.cpp's "auto"
        self._settings = (placement.kv_type, placement.flash_attn)
        self.cells: list[list[int]] = [[] for _ in range(n_seq)]  # per sequence: the tokens its cells hold
        self.positions = (
            Positions()
        )  # where those cells sit (an M-RoPE image takes fewer positions than cells)
        self._batch: Any = None  # the llama_batch every evaluation fills (batch_for)
        self._batch_size = 0
        self.last_prefill_tokens = 0  # prompt tokens the last prefill evaluated (the rest were cached)
        self._ctx: Any = None
        asked = n_ctx or min(DEFAULT_CTX, model.n_ctx_train or DEFAULT_CTX)
        # one sequence: the context is allocated small and grows as it fills (reserve); n_ctx is the
        # size it may grow to, as llama.cpp would have made it (a multiple of 256)
        self.n_ctx = -(-asked // CTX_PAD) * CTX_PAD if self.growing else asked
        self._new_context(min(self.n_ctx, START_CTX) if self.growing else asked)
        if not self.growing:
            self.n_ctx = self._allocated

    def _decode(self, batch: Any, n_tokens: int) -> int:
        """One llama_decode, timed for the thread count (which may change for the next one); its status.

        A step that tries one thread more (runner.engine.threads) is given a budget, what the count it
        came from takes: on a machine where that thread would wait for a core, one such step can cost
        fifty. Past its budget llama.cpp aborts it between two graph nodes and drops the cells it
        added (llama_decode's own rollback of an aborted ubatch), and the step is run again on the
        count it came from: a failed probe costs about one step more, whatever the machine."""
        lib = llama()
        if self._on != self.threads.n:  # another context sharing the count changed it
            self._set_threads(self.threads.n)
        budget = self.threads.budget(n_tokens)  # None but in a probe's steps
        if budget is not None and not self._abortable(n_tokens):
            budget = None
        started = time.perf_counter()
        if budget is None:
            rc = int(lib.llama_decode(self._ctx, batch))
        else:
            rc = self._decode_within(batch, started + budget)
            if rc == DECODE_ABORTED and not (self._prefilling and interrupt.requested()):
                back = self.threads.step(time.perf_counter() - started, n_tokens, aborted=True)
                if back is not None:
                    self._set_threads(back)
                started = time.perf_counter()
                rc = int(lib.llama_decode(self._ctx, batch))
        if rc == 0:
            changed = self.threads.step(time.perf_counter() - started, n_tokens)
            if changed is not None:
                self._set_threads(changed)
        return rc

    def _set_threads(self, n: int) -> None:
        set_threads(llama(), self._ctx, n)
        self._on = n

    def pool(self, batch: Any, *, steer: bool) -> None:
        """One llama_decode of a pooling context's filled batch (runner.engine.embed), every cell
        cleared first (what the last batch left is nobody's); EngineError where it fails. `steer`
        (runner embed, nothing generating beside it): Ctrl-C stops it (Interrupted), and the thread
        count follows its steps; else (the server's model thread) it decodes on the count the
        generation's steps chose."""
        lib = llama()
        self.reset()
        if not steer:
            if self._on != self.threads.n:
                self._set_threads(self.threads.n)
            rc = int(lib.llama_decode(self._ctx, batch))
        else:
            lib.llama_set_abort_callback(self._ctx, interrupt_callbacks()[1], None)
            self._prefilling = True
            try:
                rc = self._decode(batch, batch.n_tokens)
            finally:
                self._prefilling = False
                lib.llama_set_abort_callback(self._ctx, lib.ggml_abort_callback(0), None)  # NULL
            if rc == DECODE_ABORTED:
                self.reset()
                raise Interrupted
        if rc != 0:
            self._failed(rc)

    _prefilling = False  # prefill() has Ctrl-C's abort callback set on the context

    def _abortable(self, n_tokens: int) -> bool:
        """Whether an aborted llama_decode of n_tokens leaves the memory as it was: one ubatch (an
        abort keeps the ubatches before the last) into a plain KV cache (a sliding-window, recurrent
        or hybrid memory may have let go of what it held, and cannot drop a tail)."""
        return self.state_streams == 1 and n_tokens <= int(llama().llama_n_ubatch(self._ctx))

    def _decode_within(self, batch: Any, deadline: float) -> int:
        lib = llama()
        callback = DEADLINE.arm(deadline, interrupts=self._prefilling)
        lib.llama_set_abort_callback(self._ctx, callback, None)
        try:
            return int(lib.llama_decode(self._ctx, batch))
        finally:
            restore = interrupt_callbacks()[1] if self._prefilling else lib.ggml_abort_callback(0)
            lib.llama_set_abort_callback(self._ctx, restore, None)

    @property
    def ctx(self) -> Any:
        """The llama_context (for the loop and a draft model's sampler)."""
        return self._ctx

    @property
    def memory(self) -> Any:
        return self._memory

    @property
    def growing(self) -> bool:
        """One sequence: the context is allocated small and grows as it fills, up to n_ctx."""
        return self.n_seq == 1 and self.pooling is None

    @property
    def n_ctx_seq(self) -> int:
        """The cells one sequence may fill (the whole n_ctx for a context that grows)."""
        return self.n_ctx if self.growing else self._n_ctx_seq

    def _new_context(self, size: int) -> None:
        """(Re)create the llama.cpp context with room for `size` tokens."""
        lib = llama()
        kv_type, flash_attn = self._settings
        cparams = context_params(lib, size, self.threads.n, kv_type, flash_attn, self.n_seq)
        if self.pooling is not None:
            cparams.embeddings = True
            cparams.pooling_type = self.pooling
            cparams.n_batch = cparams.n_ubatch = size  # llama.cpp pools each ubatch alone
            cparams.kv_unified = True  # one pool of cells for every sequence: a batch of short inputs fits
        self._ctx = lib.llama_init_from_model(self.model.handle, cparams)
        if not self._ctx:
            kind = "an embedding context" if self.pooling is not None else "a context"
            raise EngineError(
                f"llama.cpp could not create {kind} of {cparams.n_ctx:,} tokens: "
                f"{LLAMA_LOG.last_error() or 'no log'}"
            )
        self._on = self.threads.n  # the thread count set on this llama context
        self._allocated = int(lib.llama_n_ctx(self._ctx))
        self._n_ctx_seq = int(lib.llama_n_ctx_seq(self._ctx))  # read each token: kept, not asked
        self.n_batch = int(lib.llama_n_batch(self._ctx))
        self._memory = lib.llama_get_memory(self._ctx)

    def close(self) -> None:
        """Free the context, its KV cache and its batch (the model stays). `runner embed` pools in a
        context of its own (runner.engine.embed) and never generates: its engine's is closed."""
        lib = llama()
        with interrupt.deferred():  # llama_free logs through a ctypes callback: no KeyboardInterrupt there
            if self._batch is not None:
                lib.llama_batch_free(self._batch)
                self._batch = None
            if self._ctx:
                lib.llama_free(self._ctx)
                self._ctx = None
            for held in self.cells:
                held.clear()

    def reserve(self, tokens: int) -> None:
        """Have the context hold `tokens` cells: past its allocation (and within n_ctx), a context twice
        as large takes the KV cache's state over (llama_state_seq_get/set_data, through host memory:
        the old one is freed before the new one is made, so the peak stays within the plan's).
        A one-shot answer so starts with a 512-token context: allocating 8,192 took 0.17 s of each
        start here, 2,048 0.037 s, 512 0.010-0.015 s. A longer prompt grows it once, before its
        prefill, to the size it needs; an answer that fills it doubles it (SmolLM2: ~12 MB of state
        moved at 512 tokens). Several sequences: allocated whole at the load, nothing to do."""
        if not self.growing or tokens <= self._allocated or self._allocated >= self.n_ctx:
            return
        size = min(self.n_ctx, max(-(-tokens // CTX_PAD) * CTX_PAD, 2 * self._allocated))
        lib = llama()
        with interrupt.deferred():
            state = self.state_bytes() if self.cells[0] else b""
            lib.llama_free(self._ctx)
            self._ctx = None
            self._new_context(size)
            if state and not self._set_state(state, 0):
                self.cells[0].clear()
                raise EngineError("llama.cpp could not move the KV cache into a larger context")

    # -- the batch ------------------------------------------------------------------------------

    def batch_for(self, n: int) -> Any:
        """The llama_batch evaluations fill, with room for n tokens, emptied."""
        lib = llama()
        if self._batch is None or self._batch_size < n:
            if self._batch is not None:
                lib.llama_batch_free(self._batch)
            self._batch_size = max(n, self.n_batch + self.n_seq, 64)
            self._batch = lib.llama_batch_init(self._batch_size, 0, 1)
        self._batch.n_tokens = 0
        return self._batch

    def evaluate(self, batch: Any) -> None:
        """llama_decode of the filled batch; an EngineError (and every sequence forgotten) if it fails."""
        rc = self._decode(batch, batch.n_tokens)
        if rc != 0:
            self._failed(rc)

    # -- one sequence ---------------------------------------------------------------------------

    def extend(
        self,
        tokens: Sequence[int],
        seq: int = 0,
        *,
        logits: bool = True,
        all_logits: bool = False,
        rows_from: int | None = None,
    ) -> None:
        """Evaluate tokens after those sequence `seq` holds (at most n_batch); logits for the last (True),
        none (False), for every one (all_logits), or for those from index `rows_from` on."""
        held = self.cells[seq]
        self.reserve(len(held) + len(tokens))
        batch = self.batch_for(len(tokens))
        n, pos = len(held), self.position(seq)
        add_tokens(batch, seq, tokens, pos, logits=logits, all_logits=all_logits)
        if rows_from is not None:
            for row in range(rows_from, len(tokens)):
                batch.logits[row] = 1
        rc = self._decode(batch, len(tokens))
        if rc == DECODE_ABORTED:  # Ctrl-C: llama.cpp kept the ubatches it finished, dropped the rest
            held.extend(tokens)
            del held[n + max(0, llama().llama_memory_seq_pos_max(self._memory, seq) + 1 - pos) :]
            raise Interrupted
        if rc != 0:
            self._failed(rc)
        held.extend(tokens)

    def prefill(self, tokens: Sequence[int], seq: int = 0, media: MediaPrompt | None = None) -> int:
        """Evaluate the prompt into sequence `seq`, reusing the head its cells hold already; returns
        the tokens evaluated (the last prompt token always is: its logits give the first answer token).
        Ctrl-C stops it mid-batch (Interrupted), the tokens evaluated so far kept. `media`: the
        prompt's images (runner.engine.vision.MediaPrompt), each evaluated in its positions' place."""
        lib = llama()
        keep = self.keep_head(tokens, seq)
        self.reserve(len(tokens))  # before the abort callback is set on the context
        self.last_prefill_tokens = len(tokens) - keep
        # llama.cpp asks the abort callback at every graph node: a Python call each time, ~8% of a
        # one-token decode here, nothing next to a batch. So it is set for a prefill only; a decode
        # step is checked between tokens instead.
        lib.llama_set_abort_callback(self._ctx, interrupt_callbacks()[1], None)
        self._prefilling = True
        try:
            at = keep
            for span in media.spans if media is not None else ():
                if span.start >= at and media is not None:
                    self._extend_run(tokens[at : span.start], seq)
                    self._image(media, span, tokens, seq)
                    at = span.start + span.n_tokens
            self._extend_run(tokens[at:], seq)
            # llama_decode returns once the work is queued: on a GPU or on workers (--rpc) it may still
            # run. Done means done, for the timings (TTFT, prefill tok/s) and for whoever comes next.
            lib.llama_synchronize(self._ctx)
        finally:
            self._prefilling = False
            lib.llama_set_abort_callback(self._ctx, lib.ggml_abort_callback(0), None)  # NULL
        return self.last_prefill_tokens

    def _extend_run(self, tokens: Sequence[int], seq: int) -> None:
        for start in range(0, len(tokens), self.n_batch):
            if interrupt.requested():
                raise Interrupted
            self.extend(tokens[start : start + self.n_batch], seq)

    def _image(self, media: MediaPrompt, span: ImageSpan, tokens: Sequence[int], seq: int) -> None:
        """One image of a prompt into sequence `seq` (encoded, its embeddings decoded alone)."""
        if interrupt.requested():
            raise Interrupted
        pos = self.position(seq)
        if not media.evaluate(self._ctx, span, pos, seq, self.n_batch):
            llama().llama_memory_seq_rm(self._memory, seq, pos, -1)  # what it decoded of the image
            if interrupt.requested():
                raise Interrupted  # Ctrl-C waited for the encode, then stopped the decode
            self._failed(-1, f"llama.cpp could not decode an image: {LLAMA_LOG.last_error() or 'no log'}")
        cells = tokens[span.start : span.start + span.n_tokens]
        self.positions.learn(cells[0], span.n_tokens, span.n_pos, mrope=media.vision.mrope)
        self.positions.prune(self.cells)
        self.cells[seq].extend(cells)

    def position(self, seq: int = 0, n: int | None = None) -> int:
        """The position of cell n of sequence `seq` (by default the next one's)."""
        held = self.cells[seq]
        return self.positions.at(held, len(held) if n is None else n)

    def _last_position(self, tokens: Sequence[int]) -> int:
        """What llama_memory_seq_pos_max says of a sequence whose cells hold `tokens`."""
        return self.positions.last(tokens)

    def keep_head(self, tokens: Sequence[int], seq: int = 0) -> int:
        """Drop what sequence `seq` holds past its common head with `tokens` (leaving at least the last
        token to evaluate); how many it keeps. A memory that cannot drop a tail (recurrent) is
        cleared: 0."""
        held = self.cells[seq]
        keep = outside_image(tokens, min(common_prefix(held, tokens), len(tokens) - 1))
        cut = self.position(seq, keep)
        if keep < len(held) and not llama().llama_memory_seq_rm(self._memory, seq, cut, -1):
            llama().llama_memory_seq_rm(self._memory, seq, -1, -1)
            keep = 0
        del held[keep:]
        return keep

    def shared_prefix(self, tokens: Sequence[int], seq: int = 0) -> int:
        """Tokens at the start of `tokens` whose keys and values sequence `seq` holds already."""
        return common_prefix(self.cells[seq], tokens)

    def drop_after(self, n: int, seq: int = 0) -> bool:
        """Keep the first n tokens of sequence `seq` only; False where the memory cannot drop a suffix."""
        held = self.cells[seq]
        n = outside_image(held, n)  # never inside an image: its cells go together
        if n < len(held):
            if not llama().llama_memory_seq_rm(self._memory, seq, self.position(seq, n), -1):
                return False
            del held[n:]
        return True

    def forget(self, seq: int) -> None:
        """Sequence `seq` emptied."""
        llama().llama_memory_seq_rm(self._memory, seq, -1, -1)
        self.cells[seq].clear()

    @property
    def state_streams(self) -> int:
        """The KV streams a state from state_bytes() is written for: 1 where it can be loaded into a
        context of any number of sequences (a plain KV cache), else this context's (a sliding-window
        model's two caches, a recurrent or hybrid memory: their states are kept as llama.cpp wrote them)."""
        return 1 if self.model.plain_kv else self.n_seq

    def sequence_state(self, seq: int = 0, most: int | None = None) -> Any:
        """Sequence `seq`'s cells as llama_state_seq_get_data writes them for this context, in a buffer
        of their size (set_state takes it back); None where that is nothing, more than `most` bytes, or
        not what llama.cpp said it would write."""
        lib = llama()
        size = int(lib.llama_state_seq_get_size(self._ctx, seq))
        if size <= 0 or (most is not None and size > most):
            return None
        buffer = (ctypes.c_uint8 * size)()
        return buffer if int(lib.llama_state_seq_get_data(self._ctx, buffer, size, seq)) == size else None

    def state_bytes(self, seq: int = 0) -> bytes:
        """Sequence `seq`'s KV state, as llama.cpp serializes it, for state_streams() streams: what
        load_state takes, in a context of any number of sequences where that is 1 (the disk tier)."""
        buffer = self.sequence_state(seq)
        data = bytes(buffer) if buffer is not None else b""
        return restream(data, 1) if self.n_seq > 1 and self.state_streams == 1 else data

    def load_state(self, data: bytes, tokens: Sequence[int], seq: int = 0) -> bool:
        """Replace sequence `seq`'s cells with a state (state_bytes) that holds `tokens`; False (and an
        empty sequence) where llama.cpp refuses it."""
        if self.n_seq > 1 and self.state_streams == 1:
            data = restream(data, self.n_seq)
        return self.set_state(data, tokens, seq)

    def set_state(self, data: Any, tokens: Sequence[int], seq: int = 0) -> bool:
        """Replace sequence `seq`'s cells with a state this context wrote (bytes or sequence_state's
        buffer) that holds `tokens`; False (and an empty sequence) where llama.cpp refuses it, or it
        does not end where those tokens do: never trusted."""
        self.forget(seq)
        self.reserve(len(tokens) + 1)
        if (
            not data
            or not self._set_state(data, seq)
            or llama().llama_memory_seq_pos_max(self._memory, seq) != self._last_position(tokens)
        ):
            self.forget(seq)
            return False
        self.cells[seq][:] = tokens
        return True

    def _set_state(self, data: Any, seq: int) -> bool:
        buffer = (ctypes.c_uint8 * len(data)).from_buffer_copy(data) if isinstance(data, bytes) else data
        with interrupt.deferred():
            return bool(llama().llama_state_seq_set_data(self._ctx, buffer, len(buffer), seq))

    def reset(self) -> None:
        """Forget every sequence (a new conversation; benchmarks that measure a cold prefill)."""
        llama().llama_memory_clear(self._memory, True)
        for held in self.cells:
            held.clear()

    def _failed(self, rc: int, what: str | None = None) -> None:
        for held in self.cells:
            held.clear()
        llama().llama_memory_clear(self._memory, True)
        raise EngineError(what or f"llama_decode failed ({rc}): {LLAMA_LOG.last_error() or 'no log'}")

    def check_fits(self, prompt_tokens: Sequence[int], max_tokens: int | None = None) -> None:
        """Refuse a prompt that leaves no room to answer (too_long); never truncate silently."""
        problem = self.too_long(len(prompt_tokens), max_tokens)
        if problem is not None:
            raise problem

    def too_long(self, n: int, max_tokens: int | None = None) -> PromptTooLong | None:
        """Why a prompt of n tokens does not fit a sequence (never truncated), with the --ctx that
        would (each sequence's, as --ctx is in every command), never past the trained context; None
        when it fits with room for one token of answer."""
        room = self.n_ctx_seq
        if n < room:
            return None
        suggest = -(-(n + (max_tokens or CTX_STEP)) // CTX_STEP) * CTX_STEP
        if self.model.n_ctx_train and suggest > self.model.n_ctx_train:
            return PromptTooLong(
                f"the prompt is {n:,} tokens, more than this model's trained context of "
                f"{self.model.n_ctx_train:,} allows with room for an answer; shorten it",
                tokens=n,
                context=room,
            )
        where = (
            f"but the context is {room:,}" if self.growing else f"more than a sequence's context of {room:,}"
        )
        return PromptTooLong(
            f"the prompt is {n:,} tokens{' ' if self.growing else ', '}{where}; use --ctx {suggest} or more",
            tokens=n,
            context=room,
        )
