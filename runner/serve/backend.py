"""The server's engines, each driven by one thread of its own, and what the HTTP side sees of them.

The HTTP side hands over an `Ask` (what a request asks, already validated for shape) and gets a
`Generation` back: an async iterator of ("answer" | "reasoning", text) parts, then its `Outcome`.
Everything that calls llama.cpp (the template's tokens, the sampler chain, the decode) happens in the
model's own thread: runner.engine.loop's Loop, fed by runner.serve.engine_backend as requests come and go.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from runner.engine.answer import FINISH_ERROR, FINISH_STOP, Result, Timings, timings_json
from runner.engine.logprobs import TokenLogprob
from runner.engine.text.fim import Infill
from runner.errors import CannotGenerate, RunnerError, UsageError
from runner.memory.arch import cannot_generate

if TYPE_CHECKING:
    from runner.gguf import GGUFHeader


@dataclass(frozen=True)
class Ask:
    """One request, as the HTTP side hands it over: shapes checked, values not yet (the backend checks
    ranges and raises InvalidSetting naming the field)."""

    model: str  # one of Backend.names() (the HTTP side answers 404 for any other)
    # a chat: {"role", "content", ...} rendered by the template; content a string, or a list of text and
    # images (runner.images.Image, decoded) in order: each image's marker goes where it is
    messages: list[dict[str, Any]] | None = None
    prompt: str | None = None  # a completion: the text as is, no template
    infill: Infill | None = None  # fill-in-the-middle: a prefix and a suffix, laid out in FIM tokens
    sampling: dict[str, Any] = field(default_factory=dict)  # SamplingConfig's fields: temperature, top_k, ...
    max_tokens: int | None = None  # None: until the end of the answer or of the sequence's context
    stop: tuple[str, ...] = ()
    json_schema: dict[str, Any] | None = None  # response_format json_schema / Ollama format {schema}
    json_object: bool = False  # response_format json_object / Ollama format "json"
    think: bool | str | None = None  # on/off, or a level (off|low|medium|high: reasoning.think_settings)
    reasoning_budget: int | None = None  # thinking tokens at most, then its end forced (0: none at all)
    tools: list[dict[str, Any]] | None = None  # OpenAI-shaped tool definitions, rendered by the template
    tool_choice: str | dict[str, Any] | None = None  # "auto" | "none" | "required" | {"function": {"name"}}
    keep_alive: float | None = None  # seconds the model stays loaded once idle (<0: for ever; None: as is)
    logprobs: int | None = None  # each answer token's log-probability, with this many alternatives (0-20)
    stream: bool = False  # the answer goes out as it comes: logprobs as parts too (else in the Outcome)
    echo: bool = False  # the prompt's own tokens scored too (Outcome.prompt_logprobs; completions)


@dataclass(frozen=True)
class Scored:
    """A token's log-probability as the APIs show it: its text (a split UTF-8 character's bytes
    replaced), its bytes, and the most likely tokens at its position (`top`, best first). `logprob`
    None: the prompt's first token, which nothing predicted."""

    id: int
    token: str
    bytes: bytes
    logprob: float | None
    top: tuple[Scored, ...] = ()


def scored_tokens(vocab: Any, entries: Sequence[TokenLogprob | int], prompt: bool = False) -> list[Scored]:
    """Scored tokens as the APIs show them, in the model's thread (`vocab`: its engine's token_bytes):
    a bare id is the prompt's first token, unscored. A prompt's special tokens as their text (it was
    parsed from that text: echo gives it back)."""

    def one(token: int, logprob: float | None = None, top: Sequence[tuple[int, float]] = ()) -> Scored:
        data = vocab.token_bytes(token, special=prompt)
        alternatives = tuple(one(t, lp) for t, lp in top)
        return Scored(token, data.decode("utf-8", errors="replace"), data, logprob, alternatives)

    return [one(e) if isinstance(e, int) else one(e.token, e.logprob, e.top) for e in entries]


SERVED_TIMINGS = (  # what an answer's `timings` field shows of runner.engine.answer.TIMINGS
    "prompt_tokens",
    "cached_tokens",
    "prefill_tokens",
    "completion_tokens",
    "ttft_s",
    "prefill_s",
    "decode_s",
    "total_s",
    "drafted",
    "accepted",
    "threads",
    "thread_changes",
)


@dataclass
class Outcome:
    """How an answer ended, once its parts are all out: the engine's Result (runner.engine.answer),
    checked as its request asked (runner.engine.request.finish: tool calls read, a JSON answer held
    to its schema), and its tokens' log-probabilities as the APIs show them. The HTTP side reads the
    Result's fields through it by the names the APIs use."""

    result: Result = field(default_factory=lambda: Result("", FINISH_STOP, Timings()))
    logprobs: list[Scored] = field(default_factory=list)  # Ask.logprobs: the answer's tokens'
    prompt_logprobs: list[Scored] = field(default_factory=list)  # Ask.echo: every prompt token's

    @property
    def text(self) -> str:
        return self.result.text  # the answer (reasoning apart; tool calls read out of it)

    @property
    def reasoning(self) -> str:
        return self.result.reasoning

    @property
    def finish_reason(self) -> str:
        """ "stop" | "length" | "tool_calls" | "interrupted" | "error" | "repetition" """
        return self.result.finish_reason if self.result.error is None else FINISH_ERROR

    @property
    def error(self) -> str | None:
        return self.result.error

    @property
    def stop_sequence(self) -> str | None:
        """The stop string that ended it (None: an end token, or not a stop)."""
        return self.result.stop

    @property
    def tool_calls(self) -> list[dict[str, Any]]:
        return list(self.result.tool_calls)  # [{"name", "arguments": dict}]

    @property
    def prompt_tokens(self) -> int:
        return self.result.timings.prompt_tokens

    @property
    def cached_tokens(self) -> int:
        return self.result.timings.cached_tokens  # of the prompt, reused (not evaluated)

    @property
    def completion_tokens(self) -> int:
        return self.result.timings.completion_tokens

    @property
    def reasoning_tokens(self) -> int:
        """Of the completion's tokens, the reasoning's (OpenAI's completion_tokens_details)."""
        return self.result.timings.reasoning_tokens

    @property
    def ttft_s(self) -> float:
        return self.result.timings.ttft_s  # from the request's arrival (queue wait included)

    @property
    def prefill_s(self) -> float:
        return self.result.timings.prefill_s

    @property
    def decode_s(self) -> float:
        return self.result.timings.decode_s  # the first token to the last

    @property
    def total_s(self) -> float:
        return self.result.timings.total_s

    @property
    def context_full(self) -> bool:
        return self.result.context_full

    def timings(self) -> dict[str, Any]:
        """runner's own timings, as --json names them (the extra `timings` field of an answer)."""
        return timings_json(self.result.timings, SERVED_TIMINGS)


@dataclass(frozen=True)
class ModelInfo:
    name: str  # the name requests use (the catalog alias or the name given to `runner serve`)
    path: str
    size: int  # bytes of the GGUF file
    modified: float  # the file's mtime (Unix seconds)
    sha256: str | None  # from the catalog, when it pins one
    architecture: str  # general.architecture
    quantization: str  # e.g. "Q4_1"
    parameters: str  # e.g. "135M" ("" when unknown)
    context: int  # tokens per sequence (--ctx)
    parallel: int  # sequences at once
    template: str | None  # the chat template's source
    metadata: dict[str, Any] = field(default_factory=dict)  # the GGUF's scalar metadata (no big arrays)
    max_images: int = 0  # images a request may carry (--max-images); 0: it takes none (no projector)
    max_image_bytes: int = 0  # an image's encoded size at most (--max-image-bytes)
    sees: bool = True  # with a projector: it takes images (False: an audio projector alone)
    hears: bool = False  # with a projector: it takes audio clips (input_audio, /v1/audio/transcriptions)
    reference: str = ""  # what `runner serve` takes to serve it again: the path or alias given ("": name)

    @property
    def reranks(self) -> bool:
        """A reranking model: its GGUF declares pooling type rank (4, llama.cpp's LLAMA_POOLING_TYPE_RANK)."""
        return self.metadata.get(f"{self.architecture}.pooling_type") == 4

    @property
    def cannot_generate(self) -> str | None:
        """Why it cannot generate text, after its name (a reranker, an encoder: runner.memory.arch);
        None where it can."""
        return cannot_generate(self.architecture, self.metadata.get(f"{self.architecture}.pooling_type"))


def model_info(
    name: str, header: GGUFHeader, path: Path, context: int, parallel: int, *, reference: str | None = None
) -> ModelInfo:
    """What the API's model lists say of a model, from its header (and, once loaded, its context):
    its scalar metadata (no tokenizer arrays, no value over 1,024 characters), its file's size and
    time, the catalog's sha256 where it pins one. `reference`: as ModelInfo's (None: the name)."""
    from runner.hub.catalog import load_catalog
    from runner.hub.quants import quant_of

    stat = path.stat()
    metadata = {
        k: v
        for k, v in header.metadata.items()
        if isinstance(v, (str, int, float, bool)) and len(str(v)) <= 1024 and not k.startswith("tokenizer.")
    }
    template = header.get("tokenizer.chat_template")
    entry = load_catalog().get(name)
    return ModelInfo(
        name=name,
        path=str(path),
        size=stat.st_size,
        modified=stat.st_mtime,
        sha256=getattr(entry, "sha256", None),
        architecture=header.architecture or "",
        quantization=quant_of(path.name) or "",
        parameters=str(header.get("general.size_label") or ""),
        context=context,
        parallel=parallel,
        template=template if isinstance(template, str) else None,
        metadata=metadata,
        reference=reference or name,
    )


class BadField(UsageError):
    """A request's field has a value the engine cannot take: 400, naming the field (`param`)."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param


def check_generates(info: ModelInfo) -> None:
    """BadField "model" (400) for a model asked to generate that cannot (a reranker, an encoder), in
    runner.errors.CannotGenerate's words: checked before it loads, where its tokens would mean nothing."""
    why = info.cannot_generate
    if why is not None:
        raise BadField("model", str(CannotGenerate(info.name, why)))


class TooLong(BadField):
    """The prompt does not fit a sequence's context (never truncated): 400 with the counts."""

    def __init__(self, message: str, prompt_tokens: int, context: int) -> None:
        super().__init__("messages", message)
        self.prompt_tokens = prompt_tokens
        self.context = context


class QueueFull(RunnerError):
    """--queue requests already wait: 429 with Retry-After."""

    def __init__(self, message: str, retry_after: int = 1) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class Generation(Protocol):
    """One answer in progress. `async for kind, text in generation` yields its parts as they come
    (kind "answer" or "reasoning"; "logprobs", a list of Scored, before the answer part those tokens
    made, where the Ask asked for them streamed and the answer is not held for tool calls); then
    `outcome` says how it ended. `cancel()` (the client went
    away) frees its sequence at the engine's next step; iteration then ends with finish_reason
    "interrupted". The server stopping ends it the same way."""

    prompt_tokens: int  # known once submit() returned: the prompt fits
    outcome: Outcome  # complete once iteration ended

    def __aiter__(self) -> AsyncIterator[tuple[str, Any]]: ...

    def cancel(self) -> None: ...

    async def wait(self) -> None: ...  # until `outcome` is complete (the answer ended, however)


class Backend(Protocol):
    """The served models. submit() raises BadField / TooLong (400; check_generates' for a model that
    cannot generate), QueueFull (429); embed() raises
    runner.engine.embed's InputTooLong / EmptyInput (400), QueueFull (429); rerank() raises
    runner.engine.rerank's PairTooLong / NotAReranker and EmptyInput (400), QueueFull (429); a model name
    not in names() is the HTTP side's 404 and never reaches it."""

    def names(self) -> list[str]: ...

    def info(self, name: str) -> ModelInfo: ...

    def ready(self) -> bool: ...  # every loaded model's engine thread alive: /health 200 (503 if not)

    def loaded(self) -> list[str]: ...  # the models loaded now (the others load on demand)

    def memory(self, name: str) -> int: ...  # a loaded model's planned bytes, every device (0: not loaded)

    async def submit(self, ask: Ask) -> Generation: ...

    async def load(
        self, name: str, keep_alive: float | None = None
    ) -> float: ...  # loaded now if it was not (Ask.keep_alive's meaning): the seconds waited for its load

    async def unload(
        self, name: str
    ) -> bool: ...  # gone now if idle, else once its answers end; False: kept while served (named at start)

    async def count_tokens(self, ask: Ask) -> int: ...  # the prompt's tokens as submit would evaluate it

    async def embed(
        self, model: str, texts: list[str], *, truncate: bool
    ) -> tuple[list[list[float]], int]: ...  # unit vectors in order, prompt tokens (runner.engine.embed)

    async def rerank(
        self, model: str, query: str, documents: list[str], *, truncate: bool
    ) -> tuple[list[float], int]: ...  # scores in document order, the pairs' tokens (runner.engine.rerank)

    def counters(
        self, name: str
    ) -> dict[str, int]: ...  # prompt_tokens, prefill_tokens, cached_tokens, requests
