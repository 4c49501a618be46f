"""Embeddings over HTTP: OpenAI's POST /v1/embeddings and Ollama's POST /api/embed, over
Backend.embed (each text pooled in the model's own thread, runner.engine.embed).

Both return unit vectors (L2), as OpenAI and Ollama's /api/embed do. At most MAX_INPUTS texts a
request, each a non-empty string; token-id inputs are not served. A text longer than the embedding
context is a 400 naming it and its tokens (OpenAI), or cut to the context (Ollama's `truncate`, true
by default, as Ollama has it). A model's vectors have one size: `dimensions` is a 400 unless it is it.
"""

from __future__ import annotations

import base64
import struct
import time
from typing import Any, Literal, Optional

from pydantic import Field, StrictBool, StrictInt, StrictStr, field_validator
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from runner.engine.embed import EmptyInput, InputTooLong
from runner.serve.backend import Backend
from runner.serve.common import ApiError, Loose, read_json, resolve_model, traffic

MAX_INPUTS = 256  # texts a request: one batch's worth of sequences (runner.engine.embed.MAX_SEQS)


def texts_of(value: Any) -> list[str]:
    """`input` as a list of strings: a string, or a list of at most MAX_INPUTS strings."""
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(item, str) for item in items):
        raise ValueError("must be a string or a list of strings (token ids are not served)")
    if len(items) > MAX_INPUTS:
        raise ValueError(f"at most {MAX_INPUTS} texts a request (got {len(items)})")
    return items


class OpenAIEmbeddings(Loose):
    model: Optional[StrictStr] = None
    input: Any = Field(default=None, validate_default=True)
    encoding_format: Optional[Literal["float", "base64"]] = None
    dimensions: Optional[StrictInt] = Field(default=None, ge=1)
    user: Optional[StrictStr] = None  # accepted, without meaning here

    @field_validator("input")
    @classmethod
    def _input(cls, value: Any) -> list[str]:
        if value is None:
            raise ValueError("required")
        texts = texts_of(value)
        if not texts:
            raise ValueError("must not be empty")
        return texts


class OllamaEmbed(Loose):
    model: Optional[StrictStr] = None
    input: Any = Field(default=None, validate_default=True)
    truncate: Optional[StrictBool] = None  # Ollama's default: true
    dimensions: Optional[StrictInt] = Field(default=None, ge=1)
    options: Optional[dict[str, Any]] = None  # accepted: the served model's settings stay
    keep_alive: Any = None

    @field_validator("input")
    @classmethod
    def _input(cls, value: Any) -> list[str]:
        if value is None:
            raise ValueError("required")
        return [] if value == "" else texts_of(value)  # "" alone: Ollama's way to load the model


def _check_texts(texts: list[str]) -> None:
    for i, text in enumerate(texts):
        if not text:
            where = f"input[{i}]" if len(texts) > 1 else "input"
            raise ApiError(400, f"{where} is empty", param=where)


def _check_dimensions(backend: Backend, model: str, asked: int | None, got: int | None = None) -> None:
    """`dimensions` is the model's size or a 400: its vectors cannot be shortened (no Matryoshka
    training known). Checked from the GGUF before any work where it says, else from the vectors."""
    if asked is None:
        return
    info = backend.info(model)
    size = got or info.metadata.get(f"{info.architecture}.embedding_length")
    if isinstance(size, int) and asked != size:
        raise ApiError(
            400,
            f"dimensions: {model}'s vectors have {size} dimensions and cannot be shortened to {asked}",
            param="dimensions",
        )


async def _embed(
    request: Request, backend: Backend, model: str, texts: list[str], truncate: bool
) -> tuple[list[list[float]], int]:
    """The vectors and prompt tokens; a text too long (or with no tokens) is a 400 naming it."""
    many = len(texts) > 1
    try:
        vectors, tokens = await backend.embed(model, texts, truncate=truncate)
    except InputTooLong as exc:
        where = f"input[{exc.index}]" if many else "input"
        raise ApiError(
            400,
            f"{where} is {exc.n_tokens:,} tokens, more than the {exc.limit:,} an embedding takes here",
            param=where,
            code="context_length_exceeded",
        ) from None
    except EmptyInput as exc:
        where = f"input[{exc.index}]" if many else "input"
        raise ApiError(400, f"{where} has no tokens", param=where) from None
    note = traffic(request)
    note.prompt_tokens, note.completion_tokens = tokens, 0
    note.ttft_s = time.perf_counter() - note.start
    return vectors, tokens


def float32_base64(vector: list[float]) -> str:
    """OpenAI's encoding_format "base64": the vector as little-endian float32, base64-encoded."""
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode("ascii")


class Embeddings:
    """The routes, over one backend."""

    def __init__(self, backend: Backend, max_body: int) -> None:
        self.backend = backend
        self.max_body = max_body

    async def openai(self, request: Request) -> Response:
        req = OpenAIEmbeddings.model_validate(await read_json(request, self.max_body))
        model = resolve_model(self.backend, req.model)
        texts: list[str] = req.input
        _check_texts(texts)
        _check_dimensions(self.backend, model, req.dimensions)
        vectors, tokens = await _embed(request, self.backend, model, texts, truncate=False)
        _check_dimensions(self.backend, model, req.dimensions, len(vectors[0]))
        encode = float32_base64 if req.encoding_format == "base64" else None
        data = [
            {"object": "embedding", "index": i, "embedding": encode(v) if encode else v}
            for i, v in enumerate(vectors)
        ]
        usage = {"prompt_tokens": tokens, "total_tokens": tokens}
        return JSONResponse({"object": "list", "data": data, "model": model, "usage": usage})

    async def ollama(self, request: Request) -> Response:
        start = time.perf_counter()
        req = OllamaEmbed.model_validate(await read_json(request, self.max_body))
        model = resolve_model(self.backend, req.model)
        texts: list[str] = req.input
        _check_texts(texts)
        _check_dimensions(self.backend, model, req.dimensions)
        vectors: list[list[float]] = []
        tokens = 0
        if texts:
            truncate = req.truncate is not False
            vectors, tokens = await _embed(request, self.backend, model, texts, truncate=truncate)
            _check_dimensions(self.backend, model, req.dimensions, len(vectors[0]))
        return JSONResponse(
            {
                "model": model,
                "embeddings": vectors,
                "total_duration": int((time.perf_counter() - start) * 1e9),
                "load_duration": 0,
                "prompt_eval_count": tokens,
            }
        )


def routes(backend: Backend, max_body: int) -> list[Route]:
    api = Embeddings(backend, max_body)
    return [
        Route("/v1/embeddings", api.openai, methods=["POST"]),
        Route("/api/embed", api.ollama, methods=["POST"]),
    ]
