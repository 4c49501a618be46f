"""An Engine: one loaded model (runner.engine.model: weights, vocabulary, sampler chains), its context
(runner.engine.context: the KV cache and the steps over it), speculation, and the one loop every
command's answers go through (runner.engine.loop), here for one answer at a time:

  Engine.stream          Chunk(text, kind, ...): the answer (reasoning apart) as it comes, the last
                         chunk carrying the Result: a batch of one in the engine's own loop
  Engine.answer          the whole answer to a Request as one Result
  Engine.generate        the same for bare tokens (benchmarks, tests)
  Engine.generate_step   the token ids the loop samples (benchmarks)

Everything runs on llama.cpp's low-level API (runner.engine.llamacpp): sampling in llama.cpp's native
sampler chain, one token piece converted per step, and a KV cache that keeps the prompt prefix a later
request shares (chat turns), or loads a stored one (runner.engine.prefix). What an answer carries
(Chunk, Result, Timings) is runner.engine.answer's.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from runner import interrupt, phases
from runner.engine.answer import FINISH_INTERRUPTED, Chunk, Result, since_process_start
from runner.engine.context import CTX_STEP, Context
from runner.engine.llamacpp import ANYWHERE, LLAMA_LOG, Placement, default_threads
from runner.engine.loop import Loop
from runner.engine.model import Model
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
from runner.errors import UsageError

if TYPE_CHECKING:
    from runner.engine.vision import Vision

__all__ = ["CTX_STEP", "Engine"]


class Engine:
    """One loaded model (runner.engine.model), its context (runner.engine.context), speculation and
    the one loop an answer goes through."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        n_ctx: int | None = None,
        n_threads: int | None = None,
        n_seq: int = 1,
        placement: Placement = ANYWHERE,
        debug: bool = False,
    ) -> None:
        """Load the model at `path` where `placement` says, and a context of n_ctx for n_seq sequences
        (runner.engine.context; n_ctx None: the trained context, at most DEFAULT_CTX), decoding on
        n_threads (None: chosen and followed, runner.engine.threads)."""
        LLAMA_LOG.echo = debug
        self.path = Path(path)
        self.speculation: Speculation | None = None  # runner.engine.speculate; None: one token a step
        self.spec_costs: SpecCosts | None = None  # what steps cost, measured, shared by the sequences
        self._own_loop: Loop | None = None  # stream()'s, kept from answer to answer
        self.vision: Vision | None = None  # a projector attached (attach_projector)
        busy_before = competing_others()  # read again after the load: a moment's task is not a load
        start = time.perf_counter()
        model = context = None
        try:
            with interrupt.deferred():  # a Ctrl-C stops the load (progress callback), then raises here
                model = Model(path, placement)
                if model.loaded:
                    most = n_threads or default_threads()
                    busy = [n for n in (busy_before, competing_others()) if n is not None]
                    first = free_threads(most, min(busy)) if busy else most
                    threads = Threads(most, fixed=n_threads is not None, start=first, look=True)
                    context = Context(model, n_ctx, n_seq, threads, placement)
        except BaseException:  # Ctrl-C, SIGTERM or SIGHUP (interrupt.Stopped), or a failed load
            for part in (context, model):  # whatever the load had allocated when it stopped
                if part is not None:
                    part.close()
            raise
        assert model is not None and context is not None  # else deferred() raised as its block ended
        self.model, self.context = model, context
        self.load_s = time.perf_counter() - start

    def attach_projector(self, projector: Path) -> None:
        """Images in this model's prompts, through a vision projector (runner.engine.vision), on the GPU
        only where the plan put layers there. The file is checked before libmtmd opens it."""
        from runner.engine.vision import Vision

        model, context = self.model, self.context
        on_gpu, threads = model.n_gpu_layers != 0, context.threads.most
        self.vision = Vision(
            projector, model.handle, use_gpu=on_gpu, n_threads=threads, flash_attn=context.flash_attn
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
        self._end_speculation()
        if mode == SPEC_NONE or not self.model.drops_suffix:
            if draft is not None:
                draft.close()
            return mode == SPEC_NONE
        use = draft if mode == SPEC_DRAFT else None
        if draft is not None and use is None:
            draft.close()
        self.speculation = Speculation(SPEC_DRAFT if use is not None else mode, use, fixed)
        self.spec_costs = SpecCosts()
        return True

    def _end_speculation(self) -> None:
        if self._own_loop is not None:
            self._own_loop.close()  # its speculators (a draft model's sampler)
            self._own_loop = None
        if self.speculation is not None and self.speculation.draft is not None:
            self.speculation.draft.close()
        self.speculation = None
        self.spec_costs = None

    def sampler(self, request: Request) -> Any:
        """The request's native sampler chain (runner.engine.model.Model.sampler), its penalties over
        the context's size at most; InvalidSetting where llama.cpp cannot parse its grammar."""
        tokens = request.prompt.tokens
        return self.model.sampler(request.sampling, tokens, request.grammar, window=self.context.n_ctx)

    # -- the loop -------------------------------------------------------------------------------
    # Every answer goes through runner.engine.loop; run and chat are a batch of one, in the engine's
    # own loop (kept, so its speculators and their measured costs carry over from answer to answer).

    def new_speculator(self, seq: int) -> Speculator:
        """Sequence `seq`'s speculator for the engine's setting (speculate()), its costs shared."""
        setting = self.speculation
        assert setting is not None and self.spec_costs is not None
        if setting.draft is not None:
            drafter: ModelDrafter | NgramDrafter = ModelDrafter(setting.draft.context, seq)
        else:
            drafter = NgramDrafter(is_end=self.model.is_end)
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
        self.context.check_fits(request.prompt.tokens)
        sampler = self.sampler(request)  # a grammar llama.cpp refuses: here
        head = request.head if prompt_cache is not None else 0
        job = to_job(replace(request, head=head), sampler=sampler, on_token=on_token)
        with interrupt.deferred():
            yield from self._stream(job, request, prompt_cache)

    def _stream(self, job: Job, request: Request, prompt_cache: PromptCache | None) -> Iterator[Chunk]:
        phases.mark("prompt")
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
        threads = self.context.threads
        threads.begin()
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
            threads=threads.used(),
            thread_changes=threads.changes,
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
        """Free what the engine holds: speculation (a draft model's engine), the projector, the context,
        then the model."""
        with interrupt.deferred():  # llama_free logs through a ctypes callback: no KeyboardInterrupt there
            self._end_speculation()
            if self.vision is not None:
                self.vision.close()
                self.vision = None
            self.context.close()
            self.model.close()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()
