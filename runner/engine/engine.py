"""Load a model and run the one generation loop every command shares.

Layers, each a generator over the one below (as mlx-lm's generate.py):
  Engine.generate_step   token ids: prefill the prompt, then sample and decode one token at a time,
                         or verify several drafted at once (runner.engine.speculate)
  Engine.stream          Chunk(text, ...): UTF-8-safe detokenization, stop strings, limits, timings
  Engine.generate        the whole answer as one Result

Everything runs on llama.cpp's low-level API (runner.engine.llamacpp): sampling in
llama.cpp's native sampler chain, one token piece converted per step (no re-detokenizing of earlier
tokens), and a KV cache that keeps the prompt prefix a later request shares (chat turns), or loads a
stored one from disk (runner.engine.promptcache). A one-sequence context is allocated small and grows
as it fills (_reserve).
"""

from __future__ import annotations

import codecs
import ctypes
import os
import time
from collections.abc import Generator, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from runner import interrupt
from runner.engine.llamacpp import (
    LLAMA_LOG,
    context_params,
    default_threads,
    interrupt_callbacks,
    llama,
    model_params,
    supports_gpu_offload,
)
from runner.engine.promptcache import MIN_HEAD, CacheUse, PromptCache
from runner.engine.sampling import SamplingConfig
from runner.engine.speculate import SPEC_NONE, SpecStats, Speculator
from runner.errors import EngineError, InvalidModelFile, InvalidSetting, PromptTooLong
from runner.limits import DEFAULT_CTX

CTX_STEP = 256  # a suggested --ctx is rounded up to this
CTX_PAD = 256  # llama.cpp rounds a context up to this
START_CTX = 512  # a one-sequence context is first allocated at most this large, then grows (_reserve)

FINISH_STOP = "stop"  # end-of-generation token or a stop string
FINISH_LENGTH = "length"  # --max-tokens reached, or the context is full
FINISH_INTERRUPTED = "interrupted"  # Ctrl-C: the answer stopped within a token, what came is kept
DECODE_ABORTED = 2  # llama_decode's status when the abort callback stopped it


class _Interrupted(Exception):
    """Ctrl-C during a prefill: llama.cpp aborted the batch (the engine's own, never seen outside)."""


@dataclass(frozen=True)
class Timings:
    load_s: float = 0.0
    prompt_tokens: int = 0  # tokens in the prompt
    prefill_tokens: int = 0  # of those, tokens evaluated (the rest came from the KV cache)
    prefill_s: float = 0.0
    ttft_s: float = 0.0  # start of the request to the first generated token
    completion_tokens: int = 0
    decode_s: float = 0.0  # after the first token, to the last
    total_s: float = 0.0
    startup_s: float = 0.0  # the process's start to this request's first prefill (0: unknown)
    speculation: SpecStats = SpecStats()
    prompt_cache: CacheUse = CacheUse()  # tokens of the prompt loaded from, or written to, the disk cache

    @property
    def prefill_tokens_per_s(self) -> float:
        return self.prefill_tokens / self.prefill_s if self.prefill_s > 0 else 0.0

    @property
    def decode_tokens_per_s(self) -> float:
        steps = self.completion_tokens - 1
        return steps / self.decode_s if steps > 0 and self.decode_s > 0 else 0.0


@dataclass(frozen=True)
class Chunk:
    """A piece of the answer; finish_reason and timings are set on the last one only."""

    text: str
    finish_reason: str | None = None
    timings: Timings | None = None
    context_full: bool = False


@dataclass(frozen=True)
class Result:
    text: str
    finish_reason: str
    timings: Timings
    context_full: bool = False


class Engine:
    """One loaded model and its context."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        n_ctx: int | None = None,
        n_threads: int | None = None,
        n_gpu_layers: int | None = None,
        kv_type: str | None = None,
        use_gpu: bool = True,
        flash_attn: bool | None = None,
        n_seq: int = 1,
        debug: bool = False,
    ) -> None:
        LLAMA_LOG.echo = debug
        self.flash_attn = flash_attn  # None: llama.cpp's "auto"
        self.n_seq = (
            n_seq  # sequences the context holds at once (runner.engine.batch), n_ctx split among them
        )
        self.path = Path(path)
        start = time.perf_counter()
        try:
            with interrupt.deferred():  # a Ctrl-C stops the load (progress callback), then raises here
                self._load(n_ctx, n_threads, n_gpu_layers, kv_type, use_gpu, flash_attn)
        except KeyboardInterrupt:
            self.close()  # whatever the load had allocated when it stopped
            raise
        self.load_s = time.perf_counter() - start

    def _load(
        self,
        n_ctx: int | None,
        n_threads: int | None,
        n_gpu_layers: int | None,
        kv_type: str | None,
        use_gpu: bool,
        flash_attn: bool | None,
    ) -> None:
        lib = llama()
        if n_gpu_layers is None:  # no plan (benchmarks, tests): every layer the build can offload
            n_gpu_layers = -1 if supports_gpu_offload() else 0
        self.n_gpu_layers = n_gpu_layers if use_gpu else 0
        mparams, self._no_devices = model_params(lib, n_gpu_layers, use_gpu)
        path = os.fsencode(self.path)
        with LLAMA_LOG.muted() as muted:  # the load's ~1,200 log lines, without taking the GIL
            self._model = lib.llama_model_load_from_file(path, mparams)
        if not self._model and muted and not interrupt.requested():
            self._model = lib.llama_model_load_from_file(path, mparams)  # again, for llama.cpp's reason
        if not self._model:
            if interrupt.requested():  # the progress callback stopped it
                return  # deferred() raises KeyboardInterrupt as the block ends
            reason = LLAMA_LOG.model_error()
            if reason is not None:  # the file's fault: bad input, not a failure of runner
                raise InvalidModelFile(f"llama.cpp cannot load {self.path}: {reason}")
            raise EngineError(f"llama.cpp could not load {self.path}: {LLAMA_LOG.last_error()}")
        self.n_ctx_train = int(lib.llama_model_n_ctx_train(self._model))
        self._vocab = lib.llama_model_get_vocab(self._model)

        threads = n_threads or default_threads()
        self._settings = (threads, kv_type, flash_attn)
        asked = n_ctx or min(DEFAULT_CTX, self.n_ctx_train or DEFAULT_CTX)
        # one sequence: the context is allocated small and grows as it fills (_reserve); n_ctx is the
        # size it may grow to, as llama.cpp would have made it (a multiple of 256)
        growing = self.n_seq == 1
        self.n_ctx = -(-asked // CTX_PAD) * CTX_PAD if growing else asked
        self._ctx = None
        try:
            self._new_context(min(self.n_ctx, START_CTX) if growing else asked)
        except EngineError:
            lib.llama_model_free(self._model)
            self._model = None
            raise
        if not growing:
            self.n_ctx = self._allocated
        self.n_threads = threads
        self.kv_type = kv_type or "f16"
        self.n_vocab = int(lib.llama_vocab_n_tokens(self._vocab))
        self._cached: list[int] = []  # the tokens whose keys and values are in the KV cache
        self.last_prefill_tokens = 0  # prompt tokens the last prefill evaluated (the rest were cached)
        self._piece = ctypes.create_string_buffer(256)
        self.speculator: Speculator | None = None  # runner.engine.speculate; None: one token a step
        self._verify_batch: Any = None  # llama_batch for [last, drafts…], made on first use
        self._verify_batch_size = 0

    def _new_context(self, size: int) -> None:
        """(Re)create the llama.cpp context with room for `size` tokens."""
        lib = llama()
        threads, kv_type, flash_attn = self._settings
        cparams = context_params(lib, size, threads, kv_type, flash_attn, self.n_seq)
        self._ctx = lib.llama_init_from_model(self._model, cparams)
        if not self._ctx:
            raise EngineError(
                f"llama.cpp could not create a context of {cparams.n_ctx} tokens: {LLAMA_LOG.last_error()}"
            )
        self._allocated = int(lib.llama_n_ctx(self._ctx))
        self.n_batch = int(lib.llama_n_batch(self._ctx))
        self._memory = lib.llama_get_memory(self._ctx)

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

    def speculate(self, mode: str, draft: Engine | None = None, fixed: int | None = None) -> bool:
        """Turn speculative decoding on (runner.engine.speculate): "ngram", or a draft model's engine
        (this engine owns it from now on). False where this model's memory cannot drop a rejected
        suffix (recurrent and hybrid models) or the context holds several sequences: plain decoding.
        `fixed`: always draft that many tokens where there is a draft, never adapt (tests, benchmarks)."""
        from runner.engine.speculate import SPEC_DRAFT, ModelDrafter, NgramDrafter

        lib = llama()
        if self.speculator is not None:
            self.speculator.close()
            self.speculator = None
        drops_suffix = not (
            lib.llama_model_is_recurrent(self._model) or lib.llama_model_is_hybrid(self._model)
        )
        if mode == SPEC_NONE or self.n_seq > 1 or not drops_suffix:
            if draft is not None:
                draft.close()
            return mode == SPEC_NONE
        if mode == SPEC_DRAFT and draft is not None:
            drafter: ModelDrafter | NgramDrafter = ModelDrafter(draft)
        else:
            drafter = NgramDrafter(is_end=self.is_end)
        self.speculator = Speculator(drafter, fixed)
        return True

    # -- tokens ---------------------------------------------------------------------------------

    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = True) -> list[int]:
        lib = llama()
        if lib.llama_vocab_type(self._vocab) == lib.LLAMA_VOCAB_TYPE_NONE:  # llama.cpp would abort
            raise InvalidModelFile(
                f"{self.path} has no tokenizer (tokenizer.ggml.model 'none'): it cannot read text"
            )
        data = text.encode("utf-8")
        capacity = len(data) + 8
        tokens = (lib.llama_token * capacity)()
        n = lib.llama_tokenize(self._vocab, data, len(data), tokens, capacity, add_special, parse_special)
        if n < 0:  # never happens with one token per byte plus specials, but the API allows it
            capacity = -n
            tokens = (lib.llama_token * capacity)()
            n = lib.llama_tokenize(self._vocab, data, len(data), tokens, capacity, add_special, parse_special)
        return list(tokens[:n])

    def token_bytes(self, token: int, *, special: bool = False) -> bytes:
        lib = llama()
        n = lib.llama_token_to_piece(self._vocab, token, self._piece, len(self._piece), 0, special)
        if n < 0:
            self._piece = ctypes.create_string_buffer(-n)
            n = lib.llama_token_to_piece(self._vocab, token, self._piece, len(self._piece), 0, special)
        return self._piece.raw[:n]

    def token_text(self, token: int) -> str:
        """The vocabulary's own text for a token, special ones included (e.g. '<|im_start|>')."""
        return bytes(llama().llama_vocab_get_text(self._vocab, token) or b"").decode("utf-8", "replace")

    @property
    def bos_text(self) -> str:
        lib = llama()
        bos = lib.llama_vocab_bos(self._vocab)
        return self.token_text(bos) if bos >= 0 else ""

    @property
    def eos_text(self) -> str:
        lib = llama()
        eos = lib.llama_vocab_eos(self._vocab)
        return self.token_text(eos) if eos >= 0 else ""

    @property
    def adds_bos(self) -> bool:
        return bool(llama().llama_vocab_get_add_bos(self._vocab))

    def check_fits(self, prompt_tokens: Sequence[int], max_tokens: int | None = None) -> None:
        """Refuse a prompt that leaves no room to answer; never truncate silently."""
        n = len(prompt_tokens)
        if n < self.n_ctx:
            return
        needed = n + (max_tokens or CTX_STEP)
        suggest = -(-needed // CTX_STEP) * CTX_STEP
        if self.n_ctx_train and suggest > self.n_ctx_train:
            raise PromptTooLong(
                f"the prompt is {n:,} tokens, more than this model's trained context of {self.n_ctx_train:,} "
                "allows with room for an answer; shorten it"
            )
        raise PromptTooLong(
            f"the prompt is {n:,} tokens but the context is {self.n_ctx:,}; use --ctx {suggest} or more"
        )

    # -- the loop -------------------------------------------------------------------------------

    def _sampler(self, cfg: SamplingConfig, history: Sequence[int] = (), grammar: str | None = None) -> Any:
        """The native sampler chain: a grammar first (when given), penalties (which have seen
        `history`, as llama-cli's do), then greedy or top-k, top-p, min-p, temperature and a draw."""
        lib = llama()
        chain = lib.llama_sampler_chain_init(lib.llama_sampler_chain_default_params())
        add = lib.llama_sampler_chain_add
        if grammar is not None:
            constrain = lib.llama_sampler_init_grammar(self._vocab, grammar.encode(), b"root")
            if not constrain:
                lib.llama_sampler_free(chain)
                raise InvalidSetting(
                    f"llama.cpp cannot parse the grammar: {LLAMA_LOG.last_error() or 'no log'}"
                )
            add(chain, constrain)
        if cfg.penalties:
            last_n = cfg.repeat_last_n if cfg.repeat_last_n > 0 else self.n_ctx
            penalties = lib.llama_sampler_init_penalties(
                self.n_vocab, last_n, cfg.repeat_penalty, cfg.frequency_penalty, cfg.presence_penalty
            )
            for token in history[-last_n:]:  # the penalties alone: a grammar must not see the prompt
                lib.llama_sampler_accept(penalties, token)
            add(chain, penalties)
        if cfg.greedy:
            add(chain, lib.llama_sampler_init_greedy())
            return chain
        if cfg.top_k > 0:
            add(chain, lib.llama_sampler_init_top_k(cfg.top_k))
        add(chain, lib.llama_sampler_init_top_p(cfg.top_p, 1))
        add(chain, lib.llama_sampler_init_min_p(cfg.min_p, 1))
        add(chain, lib.llama_sampler_init_temp(cfg.temperature))
        seed = lib.LLAMA_DEFAULT_SEED if cfg.seed is None else cfg.seed
        add(chain, lib.llama_sampler_init_dist(seed))
        return chain

    def extend(self, tokens: Sequence[int]) -> None:
        """Evaluate tokens after those in the KV cache (at most n_batch)."""
        self._reserve(len(self._cached) + len(tokens))
        lib = llama()
        array = (lib.llama_token * len(tokens))(*tokens)
        rc = lib.llama_decode(self._ctx, lib.llama_batch_get_one(array, len(tokens)))
        if rc == DECODE_ABORTED:  # Ctrl-C: llama.cpp kept the ubatches it finished, dropped the rest
            self._cached.extend(tokens)
            del self._cached[max(0, lib.llama_memory_seq_pos_max(self._memory, 0) + 1) :]
            raise _Interrupted
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
                    raise _Interrupted
                self.extend(tokens[start : start + self.n_batch])
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

    def generate_step(
        self,
        prompt_tokens: Sequence[int],
        sampling: SamplingConfig,
        grammar: str | None = None,
        max_tokens: int | None = None,
    ) -> Generator[int, None, None]:
        """Token ids, forever: the caller stops at an end-of-generation token or its limits
        (max_tokens only bounds how far a speculative draft looks ahead)."""
        lib = llama()
        sampler = self._sampler(sampling, prompt_tokens, grammar)
        spec = self.speculator
        if spec is not None:
            spec.begin()
        try:
            self.prefill(prompt_tokens)
            history = list(prompt_tokens)  # the prompt and every token yielded
            token_array = (lib.llama_token * 1)()
            batch = lib.llama_batch_get_one(token_array, 1)
            token = lib.llama_sampler_sample(sampler, self._ctx, -1)  # also accepts it into the chain
            while True:
                yield token
                history.append(token)
                drafts: list[int] = []
                if spec is not None:
                    # drafts past --max-tokens or the context would be verified for nothing
                    left = max_tokens - (len(history) - len(prompt_tokens)) if max_tokens else self.n_ctx
                    room = min(left - 1, self.n_ctx - len(self._cached) - 2, self.n_batch - 1)
                    started = time.perf_counter()
                    drafts = spec.draft(history, room)
                    drafted_s = time.perf_counter() - started
                if drafts:
                    kept = self._verify(sampler, token, drafts)
                    assert spec is not None
                    spec.verified(len(drafts), len(kept) - 1, time.perf_counter() - started, drafted_s)
                    for token in kept[:-1]:
                        yield token
                        history.append(token)
                    token = kept[-1]
                    continue
                # decode_one_token: the caller resumes us only when it wants the next one
                started = time.perf_counter()
                self._reserve(len(self._cached) + 1)
                token_array[0] = token
                rc = lib.llama_decode(self._ctx, batch)  # no abort callback here: checked between tokens
                if rc != 0:
                    self._failed(rc)
                self._cached.append(token)
                token = lib.llama_sampler_sample(sampler, self._ctx, -1)
                if spec is not None:
                    spec.plain_step(time.perf_counter() - started)
        finally:
            lib.llama_sampler_free(sampler)

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
        rc = lib.llama_decode(self._ctx, b)
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

    def is_end(self, token: int) -> bool:
        return bool(llama().llama_vocab_is_eog(self._vocab, token))

    def stream(
        self,
        prompt_tokens: Sequence[int],
        sampling: SamplingConfig,
        *,
        max_tokens: int | None = None,
        stop: Sequence[str] = (),
        special: bool = False,
        grammar: str | None = None,
        prompt_cache: PromptCache | None = None,
        head: int = 0,
    ) -> Iterator[Chunk]:
        """The answer as text pieces, UTF-8 safe, with stop strings held back until they cannot match.

        Ctrl-C (runner.interrupt) ends it within one token, or mid-prefill, with finish_reason
        "interrupted": what was generated is kept, and the interrupt counts as reported (the flag is
        cleared). `special` renders control tokens as text (a parser of gpt-oss's channels needs them).
        `grammar` (GBNF, root rule "root") constrains every token (runner.engine.constrain).
        `prompt_cache`: the longest stored head of the prompt is loaded from it; where none is and
        the prompt's stable `head` tokens are at least MIN_HEAD, they are evaluated and stored first.
        """
        self.check_fits(prompt_tokens)
        with interrupt.deferred():
            yield from self._stream(
                prompt_tokens, sampling, max_tokens, stop, special, grammar, prompt_cache, head
            )

    def _stream(
        self,
        prompt_tokens: Sequence[int],
        sampling: SamplingConfig,
        max_tokens: int | None,
        stop: Sequence[str],
        special: bool,
        grammar: str | None = None,
        prompt_cache: PromptCache | None = None,
        head: int = 0,
    ) -> Iterator[Chunk]:
        start = time.perf_counter()
        startup = since_process_start()
        cache_use = CacheUse()
        if prompt_cache is not None:
            cache_use = self._use_cache(prompt_cache, prompt_tokens, head)
        evaluated = 0
        text = _TextAssembler(stop)
        finish, context_full = FINISH_LENGTH, False
        n_out, first_at = 0, None
        steps = self.generate_step(prompt_tokens, sampling, grammar, max_tokens)
        try:
            for token in steps:
                if first_at is None:
                    first_at = time.perf_counter()
                    evaluated = self.last_prefill_tokens
                if self.is_end(token):
                    finish = FINISH_STOP
                    break
                n_out += 1
                piece, stopped = text.push(self.token_bytes(token, special=special))
                if piece:
                    yield Chunk(piece)
                if stopped:
                    finish = FINISH_STOP
                    break
                if interrupt.requested():  # checked between tokens: the answer stops within one
                    finish = FINISH_INTERRUPTED
                    break
                if max_tokens is not None and n_out >= max_tokens:
                    break
                if len(prompt_tokens) + n_out >= self.n_ctx:
                    context_full = True
                    break
        except _Interrupted:
            finish = FINISH_INTERRUPTED
            evaluated = evaluated or self.last_prefill_tokens
        finally:
            steps.close()
        if finish == FINISH_INTERRUPTED:
            interrupt.clear()  # reported by the finish reason
        tail = "" if text.stopped else text.flush()
        end = time.perf_counter()
        first = first_at or end
        timings = Timings(
            load_s=self.load_s,
            prompt_tokens=len(prompt_tokens),
            prefill_tokens=evaluated,
            prefill_s=first - start,
            ttft_s=first - start,
            completion_tokens=n_out,
            decode_s=end - first,
            total_s=end - start,
            startup_s=startup,
            speculation=self.speculator.stats() if self.speculator is not None else SpecStats(),
            prompt_cache=cache_use,
        )
        yield Chunk(tail, finish_reason=finish, timings=timings, context_full=context_full)

    def _use_cache(self, cache: PromptCache, prompt: Sequence[int], head: int) -> CacheUse:
        """Load the longest stored head of the prompt; then, where the stable head is longer than what
        came from disk and not stored yet, evaluate it alone and store it (the prompt's own prefill
        goes on from there)."""
        used = cache.restore(self, prompt)
        head = min(head, len(prompt) - 1)
        if head < MIN_HEAD or head <= used.loaded_tokens or cache.holds(self, prompt[:head]):
            return used
        try:
            if not self.drop_after(head):  # the state stored must be the head's alone
                return used
            self.prefill(prompt[:head])
        except _Interrupted:
            return used  # the prompt's own prefill sees the interrupt next
        stored = cache.store(self, prompt[:head])
        return replace(used, stored_tokens=stored.stored_tokens, write_s=stored.write_s)

    def generate(self, prompt_tokens: Sequence[int], sampling: SamplingConfig, **kwargs: Any) -> Result:
        parts: list[str] = []
        for chunk in self.stream(prompt_tokens, sampling, **kwargs):
            parts.append(chunk.text)
            last = chunk
        assert last.finish_reason is not None and last.timings is not None
        return Result("".join(parts), last.finish_reason, last.timings, last.context_full)

    @property
    def n_cached(self) -> int:
        """Tokens whose keys and values are in the KV cache now (how full the context is)."""
        return len(self._cached)

    def reset(self) -> None:
        """Forget the KV cache (a new conversation; benchmarks that measure a cold prefill)."""
        llama().llama_memory_clear(self._memory, True)
        self._cached.clear()

    def close(self) -> None:
        lib = llama()
        with interrupt.deferred():  # llama_free logs through a ctypes callback: no KeyboardInterrupt there
            speculator = getattr(self, "speculator", None)
            if speculator is not None:
                speculator.close()  # a draft model's engine
                self.speculator = None
            if getattr(self, "_verify_batch", None) is not None:
                lib.llama_batch_free(self._verify_batch)
                self._verify_batch = None
            if getattr(self, "_ctx", None):
                lib.llama_free(self._ctx)
                self._ctx = None
            if getattr(self, "_model", None):
                lib.llama_model_free(self._model)
                self._model = None

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many tokens a and b start with in common."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def since_process_start() -> float:
    """Seconds since this process started, to one clock tick (10 ms); 0.0 where unknown.

    On Linux from the kernel's clock since boot alone: the process's start in ticks (/proc/self/stat)
    against CLOCK_BOOTTIME. psutil's create_time() adds the boot time as /proc/stat gives it, in whole
    seconds, so time.time() minus it runs long by the boot time's lost fraction: up to 1 s, 0.19 s on
    the machine that found it (every start-up figure it gave was that much too long). Elsewhere psutil.
    """
    try:
        with open("/proc/self/stat", "rb") as f:
            stat = f.read()
        started = int(stat[stat.rindex(b")") + 2 :].split()[19]) / os.sysconf("SC_CLK_TCK")
        return max(0.0, time.clock_gettime(time.CLOCK_BOOTTIME) - started)
    except (OSError, ValueError, IndexError, AttributeError):  # not Linux
        pass
    try:
        import psutil

        return max(0.0, time.time() - psutil.Process().create_time())
    except Exception:  # noqa: BLE001 - a figure for --verbose, never a failure
        return 0.0


@dataclass
class _TextAssembler:
    """Bytes in, text out: holds a split UTF-8 character and any tail that may begin a stop string."""

    stop: Sequence[str]
    pending: str = ""
    stopped: bool = False
    _decoder: Any = field(default_factory=lambda: codecs.getincrementaldecoder("utf-8")(errors="replace"))

    def push(self, data: bytes) -> tuple[str, bool]:
        self.pending += self._decoder.decode(data)
        if not self.stop:
            out, self.pending = self.pending, ""
            return out, False
        hits = [i for i in (self.pending.find(s) for s in self.stop if s) if i >= 0]
        if hits:
            self.stopped = True
            out, self.pending = self.pending[: min(hits)], ""
            return out, True
        hold = max((_overlap(self.pending, s) for s in self.stop), default=0)
        cut = len(self.pending) - hold
        out, self.pending = self.pending[:cut], self.pending[cut:]
        return out, False

    def flush(self) -> str:
        """What is held back; bytes of a character the model never finished are dropped, not mangled."""
        out, self.pending = self.pending, ""
        self._decoder.reset()
        return out


def _overlap(text: str, stop: str) -> int:
    """Length of the longest suffix of text that is a proper prefix of stop."""
    for n in range(min(len(text), len(stop) - 1), 0, -1):
        if text.endswith(stop[:n]):
            return n
    return 0
