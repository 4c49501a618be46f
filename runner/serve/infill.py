"""POST /infill, as llama-server takes it and answers it: what llama.vim and llama.vscode send for code
completion (input_prefix, input_suffix, input_extra chunks with file names, prompt, the sampling
fields; streamed or whole), answered in llama-server's own shape (content, tokens_evaluated, timings,
...). The prompt is laid out in the model's FIM tokens (runner.engine.text.fim) and goes into the
engine as every answer does (an Ask, then one Request); a model whose GGUF has no FIM tokens is a 400
naming it, before it loads. Fields llama-server takes and runner does not act on (n_indent,
t_max_prompt_ms, t_max_predict_ms, cache_prompt, samplers, id_slot) are accepted and left alone;
`response_fields` picks the whole answer's fields as llama-server does.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Annotated, Any, Optional

from pydantic import Field, StrictBool, StrictInt, StrictStr, field_validator
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from runner.engine.text.fim import Chunk, Infill
from runner.serve.backend import Ask, Backend, Outcome, check_generates
from runner.serve.openai.errors import SHAPE
from runner.serve.shared.answers import Drained, EventStream, collect, sse, streamed, submit
from runner.serve.shared.body import read_json, resolve_model
from runner.serve.shared.fields import Loose, sampling, stops
from runner.serve.shared.http import ApiError, guarded
from runner.serve.tokens import Vocab, Vocabularies, in_vocab, mixed

MAX_STOPS = 16


class ExtraChunk(Loose):
    text: StrictStr
    filename: StrictStr = "tmp"


class InfillRequest(Loose):
    model: Optional[StrictStr] = None
    input_prefix: Any = None
    input_suffix: Any = None
    input_extra: Optional[list[ExtraChunk]] = None
    prompt: StrictStr = ""
    n_predict: Annotated[Optional[StrictInt], Field(ge=-1)] = None
    max_tokens: Annotated[Optional[StrictInt], Field(ge=0)] = None  # llama-server's alias of n_predict
    temperature: Optional[float] = None
    top_k: Optional[StrictInt] = None
    top_p: Optional[float] = None
    min_p: Optional[float] = None
    repeat_penalty: Optional[float] = None
    presence_penalty: Optional[float] = None
    frequency_penalty: Optional[float] = None
    seed: Optional[StrictInt] = None
    stop: Any = None
    stream: StrictBool = False
    return_tokens: StrictBool = False
    response_fields: Optional[list[StrictStr]] = (
        None  # llama.vim's: the answer's fields it reads, "a/b" nested
    )

    @field_validator("stop")
    @classmethod
    def _stop(cls, value: Any) -> tuple[str, ...]:
        return stops(value, MAX_STOPS)

    def infill(self) -> Infill:
        for name in ("input_prefix", "input_suffix"):
            if getattr(self, name) is None:
                raise ApiError(400, f'"{name}" is required', param=name)
        extra = tuple(Chunk(c.text, c.filename) for c in self.input_extra or ())
        prefix, suffix = mixed(self.input_prefix, "input_prefix"), mixed(self.input_suffix, "input_suffix")
        return Infill(prefix, suffix, extra, self.prompt)

    @property
    def limit(self) -> int | None:
        """The answer's tokens at most (None: until it ends, or its context is full)."""
        n = self.n_predict if self.n_predict is not None else self.max_tokens
        return None if n is None or n < 0 else n


class InfillApi:
    def __init__(self, backend: Backend, max_body: int, vocabularies: Vocabularies) -> None:
        self.backend = backend
        self.max_body = max_body
        self.vocabularies = vocabularies

    async def infill(self, request: Request) -> Response:
        req = InfillRequest.model_validate(await read_json(request, self.max_body))
        model = resolve_model(self.backend, req.model)
        info = self.backend.info(model)
        check_generates(info)
        infill = req.infill()

        def laid_out(vocab: Vocab) -> list[int]:
            for name in ("input_prefix", "input_suffix"):
                in_vocab(getattr(infill, name.removeprefix("input_")), vocab.model.n_vocab, name)
            return vocab.infill(infill, info.context, model)

        tokens = await self.vocabularies.run(model, laid_out)
        prompt = await self.vocabularies.run(model, lambda vocab: vocab.text(tokens))
        if req.limit == 0:  # the prompt alone: what it is and how long, nothing generated
            return JSONResponse(final(model, "", Outcome(), prompt, len(tokens), []))
        knobs = sampling(
            temperature=req.temperature,
            top_k=req.top_k,
            top_p=req.top_p,
            min_p=req.min_p,
            repeat_penalty=req.repeat_penalty,
            presence_penalty=req.presence_penalty,
            frequency_penalty=req.frequency_penalty,
            seed=req.seed,
        )
        logprobs = 0 if req.return_tokens and not req.stream else None  # the answer's token ids
        ask = Ask(model=model, infill=infill, sampling=knobs, max_tokens=req.limit, stop=req.stop or (),
                  logprobs=logprobs, stream=req.stream)  # fmt: skip
        generation = await submit(self.backend, ask, "input_prefix")
        if req.stream:
            chunks = streamed(request, [generation], _chunks(model, prompt), SHAPE.in_stream)
            return EventStream(chunks, "text/event-stream")
        (outcome,) = await collect(request, [generation])
        ids = [scored.id for scored in outcome.logprobs]
        answer = final(model, outcome.text, outcome, prompt, generation.prompt_tokens, ids)
        return JSONResponse(picked(answer, req.response_fields) if req.response_fields else answer)


def _chunks(model: str, prompt: str) -> Any:
    async def chunks(answers: list[Drained]) -> AsyncGenerator[str, None]:
        (answer,) = answers
        n = 0
        async for kind, text in answer:
            if kind != "answer" or not text:
                continue
            n += 1
            yield sse(
                {
                    "index": 0,
                    "content": text,
                    "tokens": [],
                    "stop": False,
                    "id_slot": -1,
                    "tokens_predicted": n,
                    "tokens_evaluated": answer.prompt_tokens,
                }
            )
        yield sse(final(model, "", answer.outcome, prompt, answer.prompt_tokens, []))

    return chunks


STOP_TYPES = {"stop": "eos", "length": "limit"}


def final(
    model: str, content: str, outcome: Outcome, prompt: str, prompt_tokens: int, ids: list[int]
) -> dict[str, Any]:
    """llama-server's final answer to /infill (and /completion): the text, its counts and timings."""
    word = outcome.stop_sequence or ""
    stop_type = "word" if word else STOP_TYPES.get(outcome.finish_reason, "none")
    generated = outcome.completion_tokens
    return {
        "index": 0,
        "content": content,
        "tokens": ids,
        "id_slot": -1,
        "stop": True,
        "model": model,
        "tokens_predicted": generated,
        "tokens_evaluated": prompt_tokens,
        "prompt": prompt,
        "has_new_line": "\n" in content,
        "truncated": False,
        "stop_type": stop_type,
        "stopping_word": word,
        "tokens_cached": prompt_tokens + generated,
        "timings": timings(outcome),
    }


def picked(answer: dict[str, Any], paths: list[str]) -> dict[str, Any]:
    """Only the fields asked for, each under its path ("timings/prompt_n"), as llama-server's
    json_get_nested_values picks them; a path the answer lacks is left out."""
    out: dict[str, Any] = {}
    for path in paths:
        value: Any = answer
        for key in path.split("/"):
            if not isinstance(value, dict) or key not in value:
                break
            value = value[key]
        else:
            out[path] = value
    return out


def timings(outcome: Outcome) -> dict[str, float]:
    """llama-server's `timings`: the prompt's tokens evaluated and reused, and both phases' speeds."""
    prompt_n = outcome.prompt_tokens - outcome.cached_tokens
    prompt_ms = outcome.prefill_s * 1000
    predicted_n = outcome.completion_tokens
    predicted_ms = outcome.decode_s * 1000
    return {
        "cache_n": outcome.cached_tokens,
        "prompt_n": prompt_n,
        "prompt_ms": prompt_ms,
        "prompt_per_token_ms": prompt_ms / prompt_n if prompt_n else 0.0,
        "prompt_per_second": prompt_n / outcome.prefill_s if outcome.prefill_s > 0 else 0.0,
        "predicted_n": predicted_n,
        "predicted_ms": predicted_ms,
        "predicted_per_token_ms": predicted_ms / predicted_n if predicted_n else 0.0,
        "predicted_per_second": predicted_n / outcome.decode_s if outcome.decode_s > 0 else 0.0,
    }


def routes(backend: Backend, max_body: int, vocabularies: Vocabularies) -> list[Route]:
    api = InfillApi(backend, max_body, vocabularies)
    return [Route("/infill", guarded(api.infill, SHAPE), methods=["POST"])]
