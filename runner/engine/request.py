"""The one door into the engine: a `Request` (what one answer asks), the one place it becomes the
loop's `Job`, and `finish`, where every answer is checked as its request asked.

Every command and every API builds a Request, as vLLM's CLI, offline API and server all build one
`SamplingParams`: `runner run` and `chat` (through Engine.stream), a batch's rows (`--each-line`,
`--input`, `bench`), and each request `runner serve` answers. The prompt is the one the model sees
(runner.engine.prompt renders messages, or takes raw text, with their images); the rest says how to
answer it. Nothing here calls llama.cpp: the sampler chain a job needs is built by the engine.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from runner.engine.answer import FINISH_ERROR, FINISH_INTERRUPTED, FINISH_TOOL_CALLS, Result
from runner.engine.logprobs import TokenLogprob
from runner.engine.sequence import Job
from runner.engine.text.constrain import Constraint
from runner.engine.text.sampling import SamplingConfig
from runner.engine.text.toolcalls import GENERIC, markers
from runner.engine.text.tools import parse_tool_calls

if TYPE_CHECKING:
    from runner.engine.vision import MediaPrompt


@dataclass(frozen=True)
class Prompt:
    """What the model is given: the tokens, the text they came from, how its answer may think, and
    how it writes a call."""

    tokens: list[int]
    text: str
    reasoning_style: str | None = None  # runner.engine.text.reasoning.style_of the template
    opens_reasoning: bool = False  # the template opened a <think> block: the answer starts in it
    media: MediaPrompt | None = None  # its images: tokens holds their positions
    tool_format: str = GENERIC  # runner.engine.text.toolcalls.format_of the template: its calls' format
    think_budget: int | None = None  # a --think level's reasoning budget, where its template has no switch


@dataclass(frozen=True)
class Request:
    """One answer asked of the engine, the same from every door: the prompt, how to sample, when to
    stop, what shape the answer must have, and what to report beside its text."""

    prompt: Prompt
    sampling: SamplingConfig
    max_tokens: int | None = None  # None: until the model ends, or its sequence's context is full
    stop: tuple[str, ...] = ()
    shape: Constraint | None = None  # JSON, a schema or a grammar, compiled (runner.engine.text.constrain)
    tools: tuple[dict[str, Any], ...] = ()  # OpenAI-shaped definitions whose calls `finish` reads back
    forced_call: bool = False  # tool_choice required or a name: the whole answer is one call's JSON
    logprobs: int | None = None  # each answer token's log-probability, with this many alternatives
    echo: bool = False  # the prompt's own tokens scored too
    head: int = 0  # the prompt's stable head, kept in the prefix store's disk tier (run, chat)
    stop_loops: bool | None = None  # an answer going round in a loop ends; None: where no limit is given
    ignore_end: bool = False  # end-of-generation tokens are tokens like any (benchmarks' tg128)
    reasoning_budget: int | None = None  # thinking tokens at most, then its end forced (--reasoning-budget)
    reuse_chunks: int = 0  # cached runs this long moved into place, not evaluated (fill-in-the-middle)

    @property
    def grammar(self) -> str | None:
        """GBNF for llama.cpp's grammar sampler (a --grammar file), None for a schema's or JSON's guide."""
        return self.shape.grammar if self.shape is not None else None

    @property
    def guide(self) -> str | None:
        """llguidance's grammar (JSON, a schema, a forced call), applied as a mask before each sample."""
        return self.shape.guide if self.shape is not None else None


def to_job(
    request: Request,
    index: int = 0,
    *,
    sampler: Any = None,
    on_piece: Callable[[str, str], None] | None = None,
    on_token: Callable[[int], None] | None = None,
    on_logprobs: Callable[[list[TokenLogprob]], None] | None = None,
    arrived: float | None = None,
) -> Job:
    """The loop's job for a request: the one place a Job is made. `sampler`: a chain built beforehand
    (Engine.sampler: a grammar llama.cpp refuses fails there, not in the loop); the hooks are the
    caller's (its thread: the loop's); `arrived`: when it was asked (a server's TTFT counts the wait)."""
    stop_loops = request.stop_loops
    if stop_loops is None:
        stop_loops = request.max_tokens is None and not request.ignore_end
    calls = bool(request.tools)  # its format's marks shown, gpt-oss's calls kept: only with tools
    return Job(
        index,
        list(request.prompt.tokens),
        request.sampling,
        max_tokens=request.max_tokens,
        stop=request.stop,
        grammar=request.grammar,
        guide=request.guide,
        sampler=sampler,
        reasoning=request.prompt.reasoning_style,
        in_reasoning=request.prompt.opens_reasoning,
        reasoning_budget=request.prompt.think_budget
        if request.reasoning_budget is None
        else request.reasoning_budget,
        markers=markers(request.prompt.tool_format) if calls else frozenset(),
        calls=calls,
        head=request.head if request.prompt.media is None else 0,
        reuse_chunks=request.reuse_chunks if request.prompt.media is None else 0,
        ignore_end=request.ignore_end,
        stop_loops=stop_loops,
        logprobs=request.logprobs,
        echo=request.echo,
        media=request.prompt.media,
        on_piece=on_piece,
        on_token=on_token,
        on_logprobs=on_logprobs,
        arrived=arrived,
    )


def finish(request: Request, result: Result) -> Result:
    """The answer as its request asked for it, checked once for every door: a JSON answer parsed and
    held to its schema (`invalid` says how it fails; what an edge does with that is its own), and the
    tool calls read out of it (finish_reason "tool_calls", the text around them kept). An answer that
    failed or was interrupted is passed on as it is. Calls are read in the prompt's tool_format
    (runner.engine.text.toolcalls): every command and API reads every family's calls here."""
    if result.error is not None or result.finish_reason in (FINISH_ERROR, FINISH_INTERRUPTED):
        return result
    if request.shape is not None:
        problem = request.shape.problem(result.text, result.finish_reason)
        if problem is not None:
            return replace(result, invalid=problem)
    if request.tools:
        calls, rest = parse_tool_calls(
            result.text, list(request.tools), request.prompt.tool_format, whole_json=request.forced_call
        )
        if calls:
            return replace(result, text=rest, tool_calls=tuple(calls), finish_reason=FINISH_TOOL_CALLS)
        if rest != result.text:  # no call, the format's own marks gone (functionary's "all", ...)
            return replace(result, text=rest)
    return result


def bare(
    tokens: Sequence[int],
    sampling: SamplingConfig,
    *,
    grammar: str | None = None,
    guide: str | None = None,
    media: MediaPrompt | None = None,
    **fields: Any,
) -> Request:
    """A request for bare tokens (benchmarks, tests): `fields` are the Request's (max_tokens, stop,
    logprobs ...), `grammar` GBNF or `guide` an llguidance grammar to hold every token to, `media`
    the tokens' images."""
    held = grammar is not None or guide is not None
    shape = Constraint("grammar", grammar, guide=guide) if held else None
    if "stop" in fields:
        fields["stop"] = tuple(fields["stop"])
    return Request(Prompt(list(tokens), "", media=media), sampling, shape=shape, **fields)
