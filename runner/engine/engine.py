"""Load a model; what it knows (tokens, pieces, its sampler chains, speculation); and the one loop
every command's answers go through (runner.engine.loop), here for one answer at a time:

  Engine.stream          Chunk(text, kind, ...): the answer (reasoning apart) as it comes, the last
                         chunk carrying the Result: a batch of one in the engine's own loop
  Engine.generate        the whole answer as one Result
  Engine.generate_step   the token ids the loop samples (benchmarks)

Everything runs on llama.cpp's low-level API (runner.engine.llamacpp): sampling in llama.cpp's native
sampler chain, one token piece converted per step, and a KV cache that keeps the prompt prefix a later
request shares (chat turns), or loads a stored one (runner.engine.prefix). The context and its KV
cache (evaluating, dropping, growing, a sequence's state) are runner.engine.context's KVContext, the
Engine's base; what an answer carries (Chunk, Result, Timings) is runner.engine.answer's.
"""

from __future__ import annotations

import ctypes
import os
import time
from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from runner import interrupt
from runner.engine.answer import FINISH_INTERRUPTED, Chunk, Result, since_process_start
from runner.engine.context import CTX_PAD, CTX_STEP, START_CTX, KVContext
from runner.engine.llamacpp import (
    LLAMA_LOG,
    default_threads,
    llama,
    model_params,
    supports_gpu_offload,
    workers_in_use,
)
from runner.engine.loop import Loop
from runner.engine.positions import Positions
from runner.engine.prefix import PrefixStore
from runner.engine.promptcache import PromptCache
from runner.engine.request import Request, bare, finish, to_job
from runner.engine.sequence import Job
from runner.engine.speculate import (
    SPEC_DRAFT,
    SPEC_NONE,
    ModelDrafter,
    NgramDrafter,
    SpecCosts,
    Speculation,
    Speculator,
)
from runner.engine.text.sampling import SamplingConfig
from runner.engine.threads import Threads, competing_others, free_threads
from runner.errors import EngineError, InvalidModelFile, InvalidSetting, UsageError
from runner.limits import DEFAULT_CTX

if TYPE_CHECKING:
    from runner.engine.guide import Guide, Guides
    from runner.engine.vision import Vision

__all__ = ["CTX_STEP", "Engine"]


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
        self.cells = [[] for _ in range(n_seq)]  # per sequence: the tokens its KV cells hold
        self.positions = Positions()
        self._batch: Any = None  # the llama_batch every evaluation fills (KVContext.batch_for)
        self._batch_size = 0
        self.speculation: Speculation | None = None  # runner.engine.speculate; None: one token a step
        self.spec_costs: SpecCosts | None = None  # what steps cost, measured, shared by the sequences
        self._own_loop: Loop | None = None  # stream()'s, kept from answer to answer
        self._guides: Guides | None = None  # llguidance's, on the first schema
        self.vision: Vision | None = None  # a projector attached (attach_projector)
        self.n_seq = n_seq  # sequences the context holds at once (runner.engine.loop), n_ctx split among them
        self.path = Path(path)
        self._busy_before = competing_others()  # read again after the load: a moment's task is not a load
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
        busy = [n for n in (self._busy_before, competing_others()) if n is not None]
        start = free_threads(most, min(busy)) if busy else most
        self.threads = Threads(most, fixed=n_threads is not None, start=start, look=True)
        self._settings = (kv_type, flash_attn)
        asked = n_ctx or min(DEFAULT_CTX, self.n_ctx_train or DEFAULT_CTX)
        # one sequence: the context is allocated small and grows as it fills (reserve); n_ctx is the
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
        self.last_prefill_tokens = 0  # prompt tokens the last prefill evaluated (the rest were cached)
        self._piece = ctypes.create_string_buffer(256)

    def attach_projector(self, projector: Path) -> None:
        """Images in this model's prompts, through a vision projector (runner.engine.vision), on the GPU
        only where the plan put layers there. The file is checked before libmtmd opens it."""
        from runner.engine.vision import Vision

        on_gpu, threads = self.n_gpu_layers != 0, self.threads.most
        self.vision = Vision(
            projector, self._model, use_gpu=on_gpu, n_threads=threads, flash_attn=self.flash_attn
        )

    def markers(self, n: int) -> str:
        """The markers of n images, for a prompt's text (each where its image goes); UsageError where
        no projector is attached."""
        if not n:
            return ""
        if self.vision is None:
            raise UsageError(f"{self.path.name} takes no images without its projector: give --mmproj")
        return self.vision.marker * n

    def speculate(self, mode: str, draft: Engine | None = None, fixed: int | None = None) -> bool:
        """Turn speculative decoding on (runner.engine.speculate) for every sequence: "ngram", or a
        draft model's engine (holding as many sequences; this engine owns it from now on). False where
        this model's memory cannot drop a rejected suffix (recurrent and hybrid models): plain decoding.
        `fixed`: always draft that many tokens where there is a draft, never adapt (tests, benchmarks)."""
        lib = llama()
        self._end_speculation()
        drops_suffix = not (
            lib.llama_model_is_recurrent(self._model) or lib.llama_model_is_hybrid(self._model)
        )
        if mode == SPEC_NONE or not drops_suffix:
            if draft is not None:
                draft.close()
            return mode == SPEC_NONE
        use = draft if mode == SPEC_DRAFT else None
        if draft is not None and use is None:
            draft.close()
        self.speculation = Speculation(SPEC_DRAFT if use is not None else mode, use, fixed)
        self.spec_costs = SpecCosts()
        return True

    @property
    def speculator(self) -> Speculation | None:
        """The speculation setting (None: one token a step)."""
        return self.speculation

    def _end_speculation(self) -> None:
        if self._own_loop is not None:
            self._own_loop.close()  # its speculators (a draft model's sampler)
            self._own_loop = None
        if self.speculation is not None and self.speculation.draft is not None:
            self.speculation.draft.close()
        self.speculation = None
        self.spec_costs = None

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
    def bos(self) -> int:
        """The beginning-of-sequence token (-1: none)."""
        return int(llama().llama_vocab_bos(self._vocab))

    @property
    def bos_text(self) -> str:
        return self.token_text(self.bos) if self.bos >= 0 else ""

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
        problem = self.too_long(len(prompt_tokens), max_tokens)
        if problem is not None:
            raise problem

    # -- sampling --------------------------------------------------------------------------------

    def sampler(self, cfg: SamplingConfig, history: Sequence[int] = (), grammar: str | None = None) -> Any:
        """The native sampler chain: a grammar first (when given), penalties (which have seen
        `history`, as llama-cli's do), then greedy or top-k, top-p, min-p, temperature and a draw.
        The caller owns it: a Job takes it (the loop frees it), else llama_sampler_free.
        InvalidSetting (field "grammar") where llama.cpp cannot parse the grammar."""
        lib = llama()
        chain = lib.llama_sampler_chain_init(lib.llama_sampler_chain_default_params())
        add = lib.llama_sampler_chain_add
        if grammar is not None:
            constrain = lib.llama_sampler_init_grammar(self._vocab, grammar.encode(), b"root")
            if not constrain:
                lib.llama_sampler_free(chain)
                problem = f"llama.cpp cannot parse the grammar: {LLAMA_LOG.last_error() or 'no log'}"
                raise InvalidSetting(problem, field="grammar", problem=problem)
            add(chain, constrain)
        if cfg.penalties:
            last_n = cfg.repeat_last_n if cfg.repeat_last_n > 0 else self.n_ctx
            penalties = lib.llama_sampler_init_penalties(
                self.n_vocab, last_n, cfg.repeat_penalty, cfg.frequency_penalty, cfg.presence_penalty
            )
            # the penalties alone: a grammar must not see the prompt; an image's positions are no tokens
            for token in [t for t in history if t >= 0][-last_n:]:
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

    def check_grammar(self, grammar: str) -> None:
        """InvalidSetting where llama.cpp cannot parse the grammar; what the check built is freed."""
        llama().llama_sampler_free(self.sampler(SamplingConfig(temperature=0), (), grammar))

    def guide(self, grammar: str) -> Guide:
        """A fresh llguidance matcher for `grammar` (runner.engine.guide): the tokenizer it needs
        built from this model's vocabulary on first use, each grammar compiled once and kept."""
        if self._guides is None:
            from runner.engine.guide import Guides

            lib = llama()
            ends = [t for t in range(self.n_vocab) if lib.llama_vocab_is_eog(self._vocab, t)]
            self._guides = Guides(self._vocab, self.n_vocab, ends)
        return self._guides.guide(grammar)

    # -- the loop -------------------------------------------------------------------------------
    # Every answer goes through runner.engine.loop; run and chat are a batch of one, in the engine's
    # own loop (kept, so its speculators and their measured costs carry over from answer to answer).

    def new_speculator(self, seq: int) -> Speculator:
        """Sequence `seq`'s speculator for the engine's setting (speculate()), its costs shared."""
        setting = self.speculation
        assert setting is not None and self.spec_costs is not None
        if setting.draft is not None:
            drafter: ModelDrafter | NgramDrafter = ModelDrafter(setting.draft, seq)
        else:
            drafter = NgramDrafter(is_end=self.is_end)
        return Speculator(drafter, setting.fixed, self.spec_costs)

    def loop(self, on_done: Callable[[Result], None], **kwargs: Any) -> Loop:
        """A loop over this engine's sequences (runner.engine.loop): the server's, a batch's."""
        return Loop(self, on_done, **kwargs)

    def stream(
        self,
        request: Request,
        *,
        prompt_cache: PromptCache | None = None,
        on_token: Callable[[int], None] | None = None,
    ) -> Iterator[Chunk]:
        """One answer as text pieces (kind "answer" or "reasoning", split by the prompt's reasoning
        style), UTF-8 safe, stop strings held back until they cannot match; the last chunk carries the
        Result, checked as the request asked (runner.engine.request.finish). A batch of one through the
        one loop, in sequence 0.

        Ctrl-C (runner.interrupt) ends it within one token, or mid-prefill, with finish_reason
        "interrupted": what was generated is kept, and the interrupt counts as reported (the flag is
        cleared). `prompt_cache`: the prefix store's disk tier: the longest stored head of the prompt is
        loaded from it; where none is and the request's stable `head` is at least MIN_HEAD tokens, it is
        evaluated and stored first. `on_token`: every token sampled, end-of-generation included.
        """
        tokens = request.prompt.tokens
        self.check_fits(tokens)
        sampler = self.sampler(request.sampling, tokens, request.grammar)  # a grammar llama.cpp refuses: here
        head = request.head if prompt_cache is not None else 0
        job = to_job(replace(request, head=head), sampler=sampler, on_token=on_token)
        with interrupt.deferred():
            yield from self._stream(job, request, prompt_cache)

    def _stream(self, job: Job, request: Request, prompt_cache: PromptCache | None) -> Iterator[Chunk]:
        start = time.perf_counter()
        startup = since_process_start()
        out: list[Chunk] = []
        done: list[Result] = []
        job.on_piece = lambda kind, text: out.append(Chunk(text, kind))
        loop = self._own_loop
        if loop is None:
            loop = self._own_loop = Loop(self, done.append, parallel=1)
        loop.on_done = done.append
        loop.store = PrefixStore(disk=prompt_cache)
        self.threads.begin()
        try:
            loop.add(job)
            while loop.busy():
                loop.step()
                if out:
                    yield from out
                    out.clear()
                if interrupt.requested():  # checked between tokens: the answer stops within one
                    loop.interrupt()
        finally:
            loop.interrupt()  # the caller stopped reading: the answer ends here (its result unused)
            loop.store = None
        result = done[0]
        if result.error is not None:  # refused as it was added (an empty prompt)
            raise UsageError(result.error)
        if result.finish_reason == FINISH_INTERRUPTED:
            interrupt.clear()  # reported by the finish reason
        timings = replace(
            result.timings,
            startup_s=startup,
            total_s=time.perf_counter() - start,
            threads=self.threads.used(),
            thread_changes=self.threads.changes,
        )
        yield from out
        yield Chunk("", result=finish(request, replace(result, timings=timings)))

    def generate_step(
        self, prompt_tokens: Sequence[int], sampling: SamplingConfig, grammar: str | None = None
    ) -> Generator[int, None, None]:
        """Token ids as the loop samples them, end-of-generation tokens too, until the caller stops or
        the context is full (benchmarks: tg128 decodes whatever comes). Ctrl-C raises
        KeyboardInterrupt in the caller: there is no answer to keep."""
        tokens: list[int] = []
        request = bare(prompt_tokens, sampling, grammar=grammar, ignore_end=True)
        for chunk in self.stream(request, on_token=tokens.append):
            yield from tokens
            tokens.clear()
            if chunk.finish_reason == FINISH_INTERRUPTED:
                raise KeyboardInterrupt  # no answer to keep: Ctrl-C stops the caller (a benchmark)
        yield from tokens

    def answer(self, request: Request, prompt_cache: PromptCache | None = None) -> Result:
        """The whole answer to a request (reasoning apart)."""
        last = None
        for chunk in self.stream(request, prompt_cache=prompt_cache):
            last = chunk
        assert last is not None and last.result is not None
        return last.result

    def generate(self, prompt_tokens: Sequence[int], sampling: SamplingConfig, **fields: Any) -> Result:
        """The whole answer to bare tokens (benchmarks, tests): `fields` as runner.engine.request.bare
        takes them, and `prompt_cache`."""
        prompt_cache = fields.pop("prompt_cache", None)
        return self.answer(bare(prompt_tokens, sampling, **fields), prompt_cache)

    def close(self) -> None:
        lib = llama()
        with interrupt.deferred():  # llama_free logs through a ctypes callback: no KeyboardInterrupt there
            if hasattr(self, "speculation"):
                self._end_speculation()  # a draft model's engine
            vision = getattr(self, "vision", None)
            if vision is not None:
                vision.close()
                self.vision = None
            if getattr(self, "_batch", None) is not None:
                lib.llama_batch_free(self._batch)
                self._batch = None
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
