"""OpenAI's POST /v1/embeddings: unit vectors as floats or base64 float32, over the shared embedding
path (runner.serve.shared.embeddings). A text longer than the embedding context is a 400 naming it and
its tokens."""

from __future__ import annotations

import base64
import struct
from typing import Any, Literal, Optional

from pydantic import Field, StrictInt, StrictStr, field_validator
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from runner.serve.backend import Backend
from runner.serve.shared.body import read_json, resolve_model
from runner.serve.shared.embeddings import check_dimensions, check_texts, embed, texts_of
from runner.serve.shared.fields import Loose


class EmbeddingsRequest(Loose):
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


def float32_base64(vector: list[float]) -> str:
    """OpenAI's encoding_format "base64": the vector as little-endian float32, base64-encoded."""
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode("ascii")


class Embeddings:
    """The route, over one backend."""

    def __init__(self, backend: Backend, max_body: int) -> None:
        self.backend = backend
        self.max_body = max_body

    async def create(self, request: Request) -> Response:
        req = EmbeddingsRequest.model_validate(await read_json(request, self.max_body))
        model = resolve_model(self.backend, req.model)
        texts: list[str] = req.input
        check_texts(texts)
        check_dimensions(self.backend, model, req.dimensions)
        vectors, tokens = await embed(request, self.backend, model, texts, truncate=False)
        check_dimensions(self.backend, model, req.dimensions, len(vectors[0]))
        encode = float32_base64 if req.encoding_format == "base64" else None
        data = [
            {"object": "embedding", "index": i, "embedding": encode(v) if encode else v}
            for i, v in enumerate(vectors)
        ]
        usage = {"prompt_tokens": tokens, "total_tokens": tokens}
        return JSONResponse({"object": "list", "data": data, "model": model, "usage": usage})
