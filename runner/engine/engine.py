"""Load a model and run the one generation loop every command shares.

Layers, each a generator over the one below (as mlx-lm's generate.py):
  Engine.generate_step   token ids: prefill the prompt, then sample and decode one token at a time,
                         or verify several drafted at once (runner.engine.speculate)
  Engine.stream          Chunk(text, ...): UTF-8-safe detokenization, stop strings, limits, timings
  Engine.generate        the whole answer as one Result

Everything runs on llama.cpp's low-level API (runner.engine.llamacpp): sampling in
llama.cpp's native sampler chain, one token piece converted per step (no re-detokenizing of earlier
tokens), and a KV cache that keeps the prompt prefix a later request shares (chat turns), or loads a
stored one from disk (runner.engine.promptcache). The context and its KV cache (evaluating, dropping,
growing, the verify step) are runner.engine.context's KVContext, the Engine's base; what an answer
carries (Chunk, Result, Timings, the text assembly) is runner.engine.answer's.
"""

from __future__ import annotations

import ctypes
import os
import time
from collections.abc import Generator, Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from runner import interrupt
from runner.engine.answer import (
    FINISH_INTERRUPTED,
    FINISH_LENGTH,
    FINISH_STOP,
    Chunk,
    Result,
    TextAssembler,
    Timings,
    since_process_start,
)
from runner.engine.context import CTX_PAD, START_CTX, Interrupted, KVContext
from runner.engine.llamacpp import (
    LLAMA_LOG,
    default_threads,
    llama,
    model_params,
    supports_gpu_offload,
    workers_in_use,
)
from runner.engine.promptcache import MIN_HEAD, CacheUse, PromptCache
from runner.engine.sampling import SamplingConfig
from runner.engine.speculate import SPEC_NONE, SpecStats, Speculator
from runner.engine.threads import Threads, free_threads, runnable_others
from runner.errors import EngineError, InvalidModelFile, InvalidSetting, PromptTooLong
from runner.limits import DEFAULT_CTX

CTX_STEP = 256  # a suggested --ctx is rounded up to this


class Engine(KVContext):
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
        self._busy_before = runnable_others()  # read again after the load: a moment's task is not a load
        start = time.perf_counter()
        try:
            with interrupt.deferred():  # a Ctrl-C stops the load (progress callback), then raises here
                self._load(n_ctx, n_threads, n_gpu_layers, kv_type, use_gpu, flash_attn)
        except BaseException:  # Ctrl-C, SIGTERM or SIGHUP (interrupt.Stopped), or a failed load
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
            n_gpu_layers = -1 if supports_gpu_offload() or workers_in_use() else 0
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

        most = n_threads or default_threads()
        busy = [n for n in (self._busy_before, runnable_others()) if n is not None]
        start = free_threads(most, min(busy)) if busy else most
        self.threads = Threads(most, fixed=n_threads is not None, start=start)
        self._settings = (kv_type, flash_attn)
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
        self.kv_type = kv_type or "f16"
        self.n_vocab = int(lib.llama_vocab_n_tokens(self._vocab))
        self._cached: list[int] = []  # the tokens whose keys and values are in the KV cache
        self.last_prefill_tokens = 0  # prompt tokens the last prefill evaluated (the rest were cached)
        self._piece = ctypes.create_string_buffer(256)
        self.speculator: Speculator | None = None  # runner.engine.speculate; None: one token a step
        self._verify_batch: Any = None  # llama_batch for [last, drafts…], made on first use
        self._verify_batch_size = 0

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
                rc = self.decode(batch, 1)  # no abort callback here: checked between tokens
                if rc != 0:
                    self._failed(rc)
                self._cached.append(token)
                token = lib.llama_sampler_sample(sampler, self._ctx, -1)
                if spec is not None:
                    spec.plain_step(time.perf_counter() - started)
        finally:
            lib.llama_sampler_free(sampler)

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
        self.threads.begin()
        cache_use = CacheUse()
        if prompt_cache is not None:
            cache_use = self._use_cache(prompt_cache, prompt_tokens, head)
        evaluated = 0
        text = TextAssembler(stop)
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
        except Interrupted:
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
            threads=self.threads.used(),
            thread_changes=self.threads.changes,
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
        except Interrupted:
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
