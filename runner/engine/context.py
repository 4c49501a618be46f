"""The llama.cpp context under an Engine and its KV cache: which tokens it holds, evaluating more
(extend, prefill), keeping a prefix and dropping the rest, its state as bytes (the prompt cache, a
context that grows), and the speculation verify step (a batch with logits at every position, sampled
in order, the rejected drafts dropped).

KVContext is the Engine's base: runner.engine.engine loads the model and the first context, then runs
the generation loop over these steps. A one-sequence context is allocated small and grows as it fills
(_reserve).
"""

from __future__ import annotations

import ctypes
import time
from collections.abc import Sequence
from typing import Any

from runner import interrupt
from runner.engine.llamacpp import LLAMA_LOG, context_params, interrupt_callbacks, llama
from runner.engine.threads import Threads, set_threads
from runner.errors import EngineError

CTX_PAD = 256  # llama.cpp rounds a context up to this
START_CTX = 512  # a one-sequence context is first allocated at most this large, then grows (_reserve)
DECODE_ABORTED = 2  # llama_decode's status when the abort callback stopped it


class Interrupted(Exception):
    """Ctrl-C during a prefill: llama.cpp aborted the batch (the engine's own, never seen outside)."""


class KVContext:
    """A llama.cpp context over a loaded model, and the tokens its KV cache holds (sequence 0)."""

    _model: Any
    _vocab: Any
    _ctx: Any
    _memory: Any
    _settings: tuple[str | None, bool | None]  # KV type, flash attention
    _allocated: int  # cells the context has now; it may grow to n_ctx
    _cached: list[int]  # the tokens whose keys and values are in the KV cache
    _verify_batch: Any  # llama_batch for [last, drafts…], made on first use
    _verify_batch_size: int
    threads: Threads  # the decode thread count, chosen again between steps (runner.engine.threads)
    n_ctx: int
    n_seq: int
    n_batch: int
    last_prefill_tokens: int

    def is_end(self, token: int) -> bool:
        """Whether the token ends generation (the model's end-of-generation tokens)."""
        return bool(llama().llama_vocab_is_eog(self._vocab, token))

    def decode(self, batch: Any, n_tokens: int) -> int:
        """One llama_decode, timed for the thread count (which may change for the next one); its status."""
        started = time.perf_counter()
        rc = int(llama().llama_decode(self._ctx, batch))
        if rc == 0:
            changed = self.threads.step(time.perf_counter() - started, n_tokens)
            if changed is not None:
                set_threads(llama(), self._ctx, changed)
        return rc

    @property
    def n_threads(self) -> int:
        """The threads the next decode runs on."""
        return self.threads.n

    @property
    def ctx(self) -> Any:
        """The llama_context (for the batch loop and a draft model's sampler)."""
        return self._ctx

    def _new_context(self, size: int) -> None:
        """(Re)create the llama.cpp context with room for `size` tokens."""
        lib = llama()
        kv_type, flash_attn = self._settings
        cparams = context_params(lib, size, self.threads.n, kv_type, flash_attn, self.n_seq)
        self._ctx = lib.llama_init_from_model(self._model, cparams)
        if not self._ctx:
            raise EngineError(
                f"llama.cpp could not create a context of {cparams.n_ctx} tokens: {LLAMA_LOG.last_error()}"
            )
        self._allocated = int(lib.llama_n_ctx(self._ctx))
        self.n_batch = int(lib.llama_n_batch(self._ctx))
        self._memory = lib.llama_get_memory(self._ctx)

    def free_context(self) -> None:
        """Free the context and its KV cache, keeping the model: `runner embed` pools in a context of
        its own (runner.engine.embed) and never generates, so this one's memory is given back."""
        with interrupt.deferred():
            if self._ctx:
                llama().llama_free(self._ctx)
                self._ctx = None
            self._cached.clear()

    def _reserve(self, tokens: int) -> None:
        """Have the context hold `tokens` cells: past its allocation (and within n_ctx), a context twice
        as large takes the KV cache's state over (llama_state_seq_get/set_data, through host memory:
        the old one is freed before the new one is made, so the peak stays within the plan's).
        A one-shot answer so starts with a 512-token context: allocating 8,192 took 0.17 s of each
        start here, 2,048 0.037 s, 512 0.010-0.015 s. A longer prompt grows it once, before its
        prefill, to the size it needs; an answer that fills it doubles it (SmolLM2: ~12 MB of state
        moved at 512 tokens)."""
        if tokens <= self._allocated or self._allocated >= self.n_ctx:
            return
        size = min(self.n_ctx, max(-(-tokens // CTX_PAD) * CTX_PAD, 2 * self._allocated))
        lib = llama()
        with interrupt.deferred():
            state = self.state_bytes() if self._cached else b""
            lib.llama_free(self._ctx)
            self._ctx = None
            self._new_context(size)
            if state and not self._set_state(state):
                self._cached.clear()
                raise EngineError("llama.cpp could not move the KV cache into a larger context")

    def extend(self, tokens: Sequence[int]) -> None:
        """Evaluate tokens after those in the KV cache (at most n_batch)."""
        self._reserve(len(self._cached) + len(tokens))
        lib = llama()
        array = (lib.llama_token * len(tokens))(*tokens)
        rc = self.decode(lib.llama_batch_get_one(array, len(tokens)), len(tokens))
        if rc == DECODE_ABORTED:  # Ctrl-C: llama.cpp kept the ubatches it finished, dropped the rest
            self._cached.extend(tokens)
            del self._cached[max(0, lib.llama_memory_seq_pos_max(self._memory, 0) + 1) :]
            raise Interrupted
        if rc != 0:
            self._failed(rc)
        self._cached.extend(tokens)

    def prefill(self, tokens: Sequence[int]) -> int:
        """Evaluate the prompt, reusing the prefix already in the KV cache; returns tokens evaluated."""
        lib = llama()
        keep = min(
            self.shared_prefix(tokens), len(tokens) - 1
        )  # the last prompt token is always evaluated, for its logits
        if keep < len(self._cached) and not lib.llama_memory_seq_rm(self._memory, -1, keep, -1):
            keep = 0  # e.g. recurrent memory cannot drop a suffix: start over
            lib.llama_memory_clear(self._memory, True)
        del self._cached[keep:]
        self._reserve(len(tokens))  # before the abort callback is set on the context
        self.last_prefill_tokens = len(tokens) - keep
        # llama.cpp asks the abort callback at every graph node: a Python call each time, ~8% of a
        # one-token decode here, nothing next to a batch. So it is set for the prefill only; a decode
        # step is checked between tokens instead.
        lib.llama_set_abort_callback(self._ctx, interrupt_callbacks()[1], None)
        try:
            for start in range(keep, len(tokens), self.n_batch):
                if interrupt.requested():
                    raise Interrupted
                self.extend(tokens[start : start + self.n_batch])
            # llama_decode returns once the work is queued: on a GPU or on workers (--rpc) it may still
            # run. Done means done, for the timings (TTFT, prefill tok/s) and for whoever comes next.
            lib.llama_synchronize(self._ctx)
        finally:
            lib.llama_set_abort_callback(self._ctx, lib.ggml_abort_callback(0), None)  # NULL
        return self.last_prefill_tokens

    def shared_prefix(self, tokens: Sequence[int]) -> int:
        """Tokens at the start of `tokens` whose keys and values the KV cache holds already."""
        return common_prefix(self._cached, tokens)

    def drop_after(self, n: int) -> bool:
        """Keep the first n cached tokens only; False where the memory cannot drop a suffix."""
        if n < len(self._cached):
            if not llama().llama_memory_seq_rm(self._memory, 0, n, -1):
                return False
            del self._cached[n:]
        return True

    def state_bytes(self) -> bytes:
        """The KV cache's state (sequence 0), as llama.cpp serializes it."""
        lib = llama()
        size = lib.llama_state_seq_get_size(self._ctx, 0)
        buffer = (ctypes.c_uint8 * size)()
        n = lib.llama_state_seq_get_data(self._ctx, buffer, size, 0)
        return ctypes.string_at(buffer, n)

    def load_state(self, data: bytes, tokens: Sequence[int]) -> bool:
        """Replace the KV cache with a state from state_bytes() that holds `tokens`; False (and an
        empty cache) where llama.cpp refuses it."""
        self.reset()
        self._reserve(len(tokens) + 1)
        if not self._set_state(data) or llama().llama_memory_seq_pos_max(self._memory, 0) != len(tokens) - 1:
            self.reset()  # refused, or not the tokens it claims: never trusted
            return False
        self._cached = list(tokens)
        return True

    def _set_state(self, data: bytes) -> bool:
        buffer = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
        with interrupt.deferred():
            return bool(llama().llama_state_seq_set_data(self._ctx, buffer, len(data), 0))

    @property
    def n_cached(self) -> int:
        """Tokens whose keys and values are in the KV cache now (how full the context is)."""
        return len(self._cached)

    def reset(self) -> None:
        """Forget the KV cache (a new conversation; benchmarks that measure a cold prefill)."""
        llama().llama_memory_clear(self._memory, True)
        self._cached.clear()

    def _verify(self, sampler: Any, last: int, drafts: Sequence[int]) -> list[int]:
        """Evaluate [last, drafts…] in one batch and sample each position in order: the drafts the
        target's own samples agree with, then its sample where they part (or after the last draft).
        The rejected drafts leave the KV cache."""
        lib = llama()
        n = len(drafts) + 1
        if self._verify_batch is None or self._verify_batch_size < n:
            if self._verify_batch is not None:
                lib.llama_batch_free(self._verify_batch)
            self._verify_batch_size = max(n, 64)
            self._verify_batch = lib.llama_batch_init(self._verify_batch_size, 0, 1)
        b = self._verify_batch
        base = len(self._cached)
        self._reserve(base + n)
        for i, token in enumerate([last, *drafts]):
            b.token[i] = token
            b.pos[i] = base + i
            b.n_seq_id[i] = 1
            b.seq_id[i][0] = 0
            b.logits[i] = 1
        b.n_tokens = n
        rc = self.decode(b, n)
        if rc != 0:
            self._failed(rc)
        self._cached.append(last)
        kept: list[int] = []
        for i in range(n):
            token = lib.llama_sampler_sample(sampler, self._ctx, i)
            kept.append(token)
            if i == len(drafts) or token != drafts[i] or self.is_end(token):
                break
            self._cached.append(token)  # a kept draft: its keys and values stay
        if not lib.llama_memory_seq_rm(self._memory, 0, len(self._cached), -1):
            self._failed(-1, "llama.cpp could not drop the rejected draft tokens")
        return kept

    def _failed(self, rc: int, what: str | None = None) -> None:
        self._cached.clear()
        lib = llama()
        lib.llama_memory_clear(self._memory, True)
        raise EngineError(what or f"llama_decode failed ({rc}): {LLAMA_LOG.last_error() or 'no log'}")


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many tokens a and b start with in common."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n
