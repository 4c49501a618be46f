"""Embeddings as both APIs serve them (OpenAI's POST /v1/embeddings, Ollama's /api/embed and its older
/api/embeddings) over Backend.embed: each text pooled in the model's own thread (runner.engine.embed),
unit vectors (L2).

At most MAX_INPUTS texts a request, each a non-empty string; token-id inputs are not served. A model's
vectors have one size: `dimensions` is a 400 unless it is it.
"""

from __future__ import annotations

import time
from typing import Any

from starlette.requests import Request

from runner.engine.embed import EmptyInput, InputTooLong
from runner.serve.backend import Backend
from runner.serve.shared.http import ApiError, traffic

MAX_INPUTS = 256  # texts a request: one batch's worth of sequences (runner.engine.embed.MAX_SEQS)


def texts_of(value: Any) -> list[str]:
    """`input` as a list of strings: a string, or a list of at most MAX_INPUTS strings."""
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(item, str) for item in items):
        raise ValueError("must be a string or a list of strings (token ids are not served)")
    if len(items) > MAX_INPUTS:
        raise ValueError(f"at most {MAX_INPUTS} texts a request (got {len(items)})")
    return items


def check_texts(texts: list[str]) -> None:
    for i, text in enumerate(texts):
        if not text:
            where = f"input[{i}]" if len(texts) > 1 else "input"
            raise ApiError(400, f"{where} is empty", param=where)


def check_dimensions(backend: Backend, model: str, asked: int | None, got: int | None = None) -> None:
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


async def embed(
    request: Request, backend: Backend, model: str, texts: list[str], truncate: bool, field: str = "input"
) -> tuple[list[list[float]], int]:
    """The vectors and prompt tokens; a text too long (or with no tokens) is a 400 naming it (`field`:
    the request's name for the texts)."""
    many = len(texts) > 1
    if backend.info(model).reranks:
        raise ApiError(
            400,
            f"{model} is a reranking model: it scores documents against a query (POST /v1/rerank), "
            "it does not embed",
            param="model",
        )
    try:
        vectors, tokens = await backend.embed(model, texts, truncate=truncate)
    except InputTooLong as exc:
        where = f"{field}[{exc.index}]" if many else field
        raise ApiError(
            400,
            f"{where} is {exc.n_tokens:,} tokens, more than the {exc.limit:,} an embedding takes here",
            param=where,
            code="context_length_exceeded",
        ) from None
    except EmptyInput as exc:
        where = f"{field}[{exc.index}]" if many else field
        raise ApiError(400, f"{where} has no tokens", param=where) from None
    note = traffic(request)
    note.prompt_tokens, note.completion_tokens = tokens, 0
    note.ttft_s = time.perf_counter() - note.start
    return vectors, tokens
