"""Many prompts known at the start, answered together: `runner run --each-line`, `--input` and the
batched row of `runner bench`, through the one loop (runner.engine.loop) every command shares.

The context holds `n_seq` sequences, each in its own stream of n_ctx / n_seq cells; the loop
decodes one token of every active sequence, and the prompts of new ones, in one llama_decode, and a
sequence that finishes frees its slot for the next job at once. run_batch also evaluates the prompts'
shared head (system prompt, template) once, before the first job, so every job copies it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from runner import interrupt
from runner.engine.answer import Result
from runner.engine.cells import shared_prefix
from runner.engine.loop import Loop, LoopStats
from runner.engine.prefix import PrefixStore
from runner.engine.request import Request, finish, to_job

if TYPE_CHECKING:
    from runner.engine.engine import Engine

__all__ = ["Result", "run_batch", "shared_prefix"]


def run_batch(
    engine: Engine,
    requests: Sequence[Request],
    on_done: Callable[[Result], None],
    *,
    parallel: int | None = None,
    share_prefix: bool = True,
    store: PrefixStore | None = None,
    on_token: Callable[[int, int], None] | None = None,
) -> LoopStats:
    """Answer every request, up to `parallel` (default: every sequence the context holds) at a time;
    on_done as each ends, its Result's index the request's place in `requests`, checked as it asked
    (request.finish).

    Ctrl-C (runner.interrupt) stops between steps: the answers already done were passed on; the
    rest are not. A request too long for a sequence's share of the context is done at once with an error.
    `on_token`: (index, token) for every token sampled, end-of-generation included (benchmarks).
    """
    start = time.perf_counter()

    def sampled(i: int) -> Callable[[int], None] | None:
        return (lambda token: on_token(i, token)) if on_token is not None else None

    jobs = [to_job(request, i, on_token=sampled(i)) for i, request in enumerate(requests)]

    def done(result: Result) -> None:
        on_done(finish(requests[result.index], result))

    context = engine.context
    with interrupt.deferred():
        context.reset()  # the KV cache cleared, the record of it too
        loop = Loop(engine, done, parallel=parallel or context.n_seq, reuse=share_prefix, store=store)
        try:
            fitting = []
            for job in jobs:
                problem = context.too_long(len(job.tokens), job.max_tokens)
                if problem is not None:
                    loop.fail(job, str(problem))
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
            context.reset()
            loop.stats.prompts = len(jobs)
            loop.stats.wall_s = time.perf_counter() - start
    return loop.stats
