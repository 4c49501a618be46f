"""POST /v1/rerank (and /rerank, /v1/reranking, as llama-server names them): the Jina and Cohere
rerank API over Backend.rerank, each (query, document) pair scored in the model's own thread
(runner.engine.rerank), for a reranking model only.

The body: `model`, `query`, `documents` (strings, or objects with a string `text`; 1 to
MAX_DOCUMENTS of them), `top_n` (the most relevant N), `return_documents` (each result carries its
`document` as {"text"}; false unless asked, as Cohere's default). The answer: `results`, most relevant
first, each its `index` in `documents` and its `relevance_score` (llama.cpp's raw score, as
llama-server's), and `usage` (the pairs' tokens). Bad input is a 400 naming its field; a model that
is not a reranker, a 400 naming it; no model named: the first served reranker.
"""

from __future__ import annotations

import time
from typing import Any, Optional

from pydantic import Field, StrictBool, StrictInt, StrictStr, field_validator
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from runner.engine.embed import POOLING_NAMES, EmptyInput
from runner.engine.rerank import MAX_DOCUMENTS, NotAReranker, PairTooLong, QueryTooLong
from runner.serve.backend import Backend
from runner.serve.shared.body import read_json, resolve_model
from runner.serve.shared.fields import Loose
from runner.serve.shared.http import ApiError, traffic


class RerankRequest(Loose):
    model: Optional[StrictStr] = None
    query: StrictStr = Field(min_length=1)
    documents: Any = Field(default=None, validate_default=True)
    top_n: Optional[StrictInt] = Field(default=None, ge=1)
    return_documents: Optional[StrictBool] = None

    @field_validator("documents")
    @classmethod
    def _documents(cls, value: Any) -> list[str]:
        """The documents' texts: a list of 1 to MAX_DOCUMENTS strings or {"text": string} objects."""
        if value is None:
            raise ValueError("required")
        if not isinstance(value, list):
            raise ValueError('must be a list of strings or of objects with a string "text"')
        if not value:
            raise ValueError("must not be empty")
        if len(value) > MAX_DOCUMENTS:
            raise ValueError(f"at most {MAX_DOCUMENTS:,} documents a request (got {len(value):,})")
        texts = []
        for i, item in enumerate(value):
            text = item.get("text") if isinstance(item, dict) else item
            if not isinstance(text, str):
                raise ValueError(f'item {i} must be a string or an object with a string "text"')
            texts.append(text)
        return texts


def rerank_model(backend: Backend, name: str | None) -> str:
    """The model a rerank request names, or the first served reranker; a 400 if it is not one."""
    if name is None:
        name = next((n for n in backend.names() if backend.info(n).reranks), None)
    model = resolve_model(backend, name)
    info = backend.info(model)
    if not info.reranks:
        pooling = info.metadata.get(f"{info.architecture}.pooling_type")
        kind = POOLING_NAMES.get(pooling, "none") if isinstance(pooling, int) else "none"
        raise ApiError(400, str(NotAReranker(model, kind)), param="model", code="model_not_reranker")
    return model


class Rerank:
    """The route, over one backend."""

    def __init__(self, backend: Backend, max_body: int) -> None:
        self.backend = backend
        self.max_body = max_body

    async def create(self, request: Request) -> Response:
        req = RerankRequest.model_validate(await read_json(request, self.max_body))
        model = rerank_model(self.backend, req.model)
        texts: list[str] = req.documents
        for i, text in enumerate(texts):
            if not text:
                raise ApiError(400, f"documents[{i}] is empty", param=f"documents[{i}]")
        try:
            scores, tokens = await self.backend.rerank(model, req.query, texts, truncate=False)
        except PairTooLong as exc:
            where = f"documents[{exc.index}]"
            raise ApiError(
                400,
                f"{where}: the query and this document make {exc.n_tokens:,} tokens together, more than "
                f"the {exc.limit:,} a rerank pair takes here",
                param=where,
                code="context_length_exceeded",
            ) from None
        except QueryTooLong as exc:
            raise ApiError(400, str(exc), param="query", code="context_length_exceeded") from None
        except EmptyInput as exc:
            where = f"documents[{exc.index}]"
            raise ApiError(400, f"{where} has no tokens", param=where) from None
        except NotAReranker as exc:
            raise ApiError(400, str(exc), param="model", code="model_not_reranker") from None
        note = traffic(request)
        note.prompt_tokens, note.completion_tokens = tokens, 0
        note.ttft_s = time.perf_counter() - note.start
        order = sorted(range(len(scores)), key=lambda i: -scores[i])[: req.top_n]
        results: list[dict[str, Any]] = []
        for i in order:
            result: dict[str, Any] = {"index": i, "relevance_score": scores[i]}
            if req.return_documents:
                result["document"] = {"text": texts[i]}
            results.append(result)
        usage = {"prompt_tokens": tokens, "total_tokens": tokens}
        return JSONResponse({"model": model, "object": "list", "results": results, "usage": usage})
