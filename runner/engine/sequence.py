"""One answer inside the loop: what it asks (Job) and where it stands (Slot), and the step function
every command shares: take a token -> its text, split into reasoning and answer, and whether and why
the answer ends (end-of-generation token, stop string, max tokens, context full).

Nothing here calls llama_decode: runner.engine.loop batches every slot's tokens into one step and
hands each slot the tokens it sampled.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from runner.engine.answer import (
    FINISH_ERROR,
    FINISH_INTERRUPTED,
    FINISH_LENGTH,
    FINISH_REPEAT,
    FINISH_STOP,
    LOOP_PERIOD_MAX,
    LOOP_SPAN,
    Result,
    TextAssembler,
    Timings,
    looping,
)
from runner.engine.logprobs import TokenLogprob
from runner.engine.promptcache import CacheUse
from runner.engine.speculate import SpecCosts, SpecStats, Speculator
from runner.engine.text.reasoning import ANSWER, Splitter
from runner.engine.text.sampling import SamplingConfig

if TYPE_CHECKING:
    from runner.engine.guide import Guide
    from runner.engine.vision import MediaPrompt

LOOP_CHECK_EVERY = 16  # tokens between two looks for a loop (each costs ~0.1 ms)
LOOP_TAIL = 3 * LOOP_PERIOD_MAX  # the answer's tokens a look reads: three turns of the longest loop


class Vocab(Protocol):
    """What taking a token needs of the engine (runner.engine.engine.Engine is one)."""

    def is_end(self, token: int) -> bool: ...

    def token_bytes(self, token: int, *, special: bool = False) -> bytes: ...


@dataclass
class Job:
    """One answer asked of the loop: the prompt's tokens and how to answer it."""

    index: int  # the caller's: a batch's answers come back in any order, each with its index
    tokens: list[int]
    sampling: SamplingConfig
    max_tokens: int | None = None
    stop: tuple[str, ...] = ()
    grammar: str | None = None  # GBNF, root rule "root" (runner.engine.text.constrain): llama.cpp's sampler
    guide: str | None = None  # an llguidance grammar (a JSON Schema's): masks (runner.engine.guide)
    sampler: Any = None  # a chain built beforehand (Engine.sampler): the loop owns and frees it
    reasoning: str | None = None  # the template's reasoning style ("think" | "channels"), split out
    in_reasoning: bool = False  # the template opened a <think> block: the answer starts in it
    reasoning_budget: int | None = None  # reasoning tokens at most: then its end is forced (Slot.closer)
    markers: frozenset[str] = frozenset()  # control tokens shown as text: its tools' call format's marks
    calls: bool = False  # the request has tools: a gpt-oss message to functions.NAME stays in the answer
    head: int = 0  # the prompt's stable head: kept in the prefix store's disk tier (run, chat)
    reuse_chunks: int = 0  # cached runs this long or longer moved into place (runner.engine.reuse); 0: none
    ignore_end: bool = False  # end-of-generation tokens are tokens like any (benchmarks' tg128)
    stop_loops: bool = False  # an answer going round in a loop ends (FINISH_REPEAT): no limit was given
    logprobs: int | None = None  # each answer token's log-probability, with this many alternatives
    echo: bool = False  # the prompt's own log-probabilities: evaluated whole, logits at every position
    media: MediaPrompt | None = None  # the prompt's images: evaluated alone
    on_piece: Callable[[str, str], None] | None = None  # (kind, text) as they come, in the loop's thread
    on_token: Callable[[int], None] | None = None  # every token sampled, end-of-generation included
    on_logprobs: Callable[[list[TokenLogprob]], None] | None = None  # before the answer piece they made
    arrived: float | None = None  # perf_counter when it was asked (the server: TTFT counts the wait)
    cancelled: bool = False  # set from any thread (a client went away): ended at the next step

    @property
    def special(self) -> bool:
        """Render control tokens as text: gpt-oss's channel markers are control tokens. (Other
        formats' call marks are rendered one by one: `markers`.)"""
        return self.reasoning == "channels"


@dataclass
class Slot:
    """A job in its sequence: its sampler, text assembly, reasoning split, speculation and counts."""

    seq: int
    job: Job
    sampler: Any
    speculator: Speculator | None
    start: float  # when its sequence took it
    guide: Guide | None = None  # the job's schema, as a mask before each sample
    argmax: bool = False  # greedy alone: the loop takes the logits' argmax (Loop's argmax)
    pos: int = 0  # the next token's position (the tokens its cells hold, less what images saved)
    fewer: int = 0  # positions fewer than cells: an M-RoPE model's images (runner.engine.positions)
    last: int = 0  # the token sampled last, not yet in the cells
    n_out: int = 0
    prefill: int = 0  # prompt tokens evaluated for it (the rest were held, copied or restored)
    cache_use: CacheUse = CacheUse()
    first_at: float | None = None
    history: list[int] = field(default_factory=list)  # prompt and answer tokens (drafts read it)
    pending: list[int] = field(default_factory=list)  # this step's tokens: into the cells once decoded
    drafts: list[int] = field(default_factory=list)  # this step's drafts, verified after the decode
    row: int = 0  # the batch row of its first token in this step
    verify_s: tuple[float, float] = (0.0, 0.0)  # this step's verify: (its share, drafting), seconds
    context_full: bool = False
    threads_mark: tuple[Counter[int], int] | None = None  # the thread counts as it began (Threads.mark)
    scored: TokenLogprob | None = None  # the token just sampled, scored (job.logprobs), not yet taken
    scored_held: list[TokenLogprob] = field(default_factory=list)  # taken, their text not yet out
    logprobs: list[TokenLogprob] = field(default_factory=list)  # the answer's tokens', in order
    prompt_logprobs: list[TokenLogprob] = field(default_factory=list)  # job.echo: the prompt's
    reasoned: int = 0  # the answer's tokens that were reasoning
    closer: list[int] = field(default_factory=list)  # what ends its reasoning (job.reasoning_budget)
    forcing: list[int] = field(default_factory=list)  # the closer's tokens still to come, not sampled
    text: TextAssembler = field(init=False)
    splitter: Splitter = field(init=False)
    parts: dict[str, list[str]] = field(default_factory=lambda: {"answer": [], "reasoning": []})

    def __post_init__(self) -> None:
        self.text = TextAssembler(self.job.stop)
        self.splitter = Splitter(self.job.reasoning, self.job.in_reasoning, calls=self.job.calls)

    def take(self, token: int, vocab: Vocab, room: int) -> str | None:
        """One sampled token: its text out; the finish reason once the answer is over, else None.
        `room`: the cells the sequence may fill."""
        if self.first_at is None:
            self.first_at = time.perf_counter()
        job = self.job
        if job.on_token is not None:
            job.on_token(token)
        scored, self.scored = self.scored, None
        if not job.ignore_end and vocab.is_end(token):
            return FINISH_STOP
        self.n_out += 1
        self.history.append(token)
        answering = scored is not None and self.splitter.answering()
        thinks = job.reasoning is not None
        header = thinks and self.splitter.in_header()  # channels: a header's tokens are no thinking
        text, stopped = self.text.push(_piece(vocab, token, job))
        parts = self.splitter.push(text) if text else []
        if thinks and not (header or self.splitter.in_header() or self.splitter.answering()):
            self.reasoned += 1
            budget = job.reasoning_budget if job.grammar is None and job.guide is None else None
            if budget is not None and self.reasoned >= budget and self.closer:
                self.forcing, self.closer = self.closer, []  # the budget spent: its end comes next
        # an answer token (not a reasoning's, a marker's, the blank lines after </think>): its entry
        # goes out with the answer text it makes (held back with it, for a stop string)
        if scored is not None and answering and (self.splitter.answering(settled=True) or not text):
            self.scored_held.append(scored)
        self._out(parts)
        if stopped:
            return FINISH_STOP
        if job.max_tokens is not None and self.n_out >= job.max_tokens:
            return FINISH_LENGTH
        if job.stop_loops and self._looping():
            return FINISH_REPEAT
        if self.pos + self.fewer + 1 >= room:  # the context is counted in cells
            self.context_full = True
            return FINISH_LENGTH
        self.last = token
        return None

    def _looping(self) -> bool:
        """The answer ends in a loop (looked for every LOOP_CHECK_EVERY tokens, from LOOP_SPAN on)."""
        if self.n_out < LOOP_SPAN or self.n_out % LOOP_CHECK_EVERY:
            return False
        return looping(self.history[-min(self.n_out, LOOP_TAIL) :]) > 0

    def emit(self, text: str, *, final: bool = False) -> None:
        parts = self.splitter.push(text) if text else []
        if final:
            parts += self.splitter.flush()
        self._out(parts)

    def _out(self, parts: list[tuple[str, str]]) -> None:
        on_piece = self.job.on_piece
        for kind, part in parts:
            self.parts[kind].append(part)
            if self.scored_held and kind == ANSWER:
                self._scored_out()
            if on_piece is not None:
                on_piece(kind, part)

    def _scored_out(self) -> None:
        """The answer tokens whose text is coming out (a reasoning's are not listed: OpenAI's logprobs
        are the content's)."""
        scored, self.scored_held = self.scored_held, []
        self.logprobs += scored
        if self.job.on_logprobs is not None:
            self.job.on_logprobs(scored)

    def result(self, reason: str, *, flush: bool, extra: dict[str, Any], error: str | None = None) -> Result:
        """The answer as it ends: what is held back written out (unless `flush` is off: a client that
        went away), the timings from its arrival (or its sequence taking it) to now."""
        if flush and not self.text.stopped:
            self.emit(self.text.flush(), final=True)
        elif flush:
            self.emit("", final=True)
        if self.scored_held and not self.text.stopped:  # tokens of no text (a stop string's: dropped)
            self._scored_out()
        now = time.perf_counter()
        first = self.first_at or now
        began = self.job.arrived or self.start
        timings = Timings(
            prompt_tokens=len(self.job.tokens),
            prefill_tokens=self.prefill,
            prefill_s=first - self.start,
            ttft_s=first - began,
            completion_tokens=self.n_out,
            reasoning_tokens=self.reasoned,
            decode_s=now - first,
            total_s=now - began,
            speculation=self.speculator.stats() if self.speculator is not None else SpecStats(),
            prompt_cache=self.cache_use,
            **extra,
        )
        return Result(
            "".join(self.parts[ANSWER]),
            reason,
            timings,
            context_full=self.context_full,
            reasoning="".join(self.parts["reasoning"]),
            stop=self.text.matched if reason == FINISH_STOP else None,
            error=error,
            index=self.job.index,
            logprobs=tuple(self.logprobs),
            prompt_logprobs=tuple(self.prompt_logprobs),
        )


def _piece(vocab: Vocab, token: int, job: Job) -> bytes:
    """A token's text as the job shows it: a control token is nothing, unless the job renders them
    all (gpt-oss) or it is one of the job's markers (a call's [TOOL_CALLS], <|python_tag|> ...), as
    llama-server renders a format's preserved tokens."""
    piece = vocab.token_bytes(token, special=job.special)
    if job.markers and not job.special:
        shown = vocab.token_bytes(token, special=True)
        if shown != piece and shown.decode("utf-8", "replace") in job.markers:
            return shown
    return piece


def failed(job: Job, error: str) -> Result:
    """A job that could not run (its prompt too long, its grammar refused): no text, the reason."""
    return Result("", FINISH_ERROR, Timings(prompt_tokens=len(job.tokens)), error=error, index=job.index)


def dropped(job: Job) -> Result:
    """A job cancelled before its sequence took it (its client went away, the loop restarted)."""
    return Result("", FINISH_INTERRUPTED, Timings(prompt_tokens=len(job.tokens)), index=job.index)


# -- speculation within a step: the loop's --------------------------------------------------------


def draft(active: list[Slot], room: int, n_ctx_seq: int) -> int:
    """Each active sequence's drafts for this step, within the batch's `room`; how many in all."""
    if room <= 0:
        return 0
    total = 0
    for slot in active:
        spec = slot.speculator
        if spec is None or slot.forcing:  # the forced tokens are known: nothing to draft
            continue
        job = slot.job
        left = job.max_tokens - slot.n_out if job.max_tokens else n_ctx_seq
        most = min(left - 1, n_ctx_seq - slot.pos - slot.fewer - 2, room - total)
        started = time.perf_counter()
        slot.drafts = spec.draft(slot.history, most, len(active))
        slot.verify_s = (0.0, time.perf_counter() - started)  # (step share, drafting) set in share_cost
        total += len(slot.drafts)
    return total


def share_cost(costs: SpecCosts, slots: list[Slot], drafted: int, seconds: float, *, parallel: bool) -> None:
    """What a step with no new prompt in it cost, for the speculators: a plain step (nothing drafted),
    or a verify step whose extra cost each drafting sequence shares by its drafts (`parallel`: the
    loop holds more than one sequence)."""
    if not drafted:
        costs.plain_step(seconds)
        return
    if parallel:
        costs.verify_step(drafted, seconds)
    plain = costs.step_s or seconds
    extra = max(0.0, seconds - plain)
    for slot in slots:
        if slot.drafts:
            share = plain + extra * len(slot.drafts) / drafted if parallel else seconds
            slot.verify_s = (share + slot.verify_s[1], slot.verify_s[1])
