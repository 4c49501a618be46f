"""The embedding and rerank requests a model's thread holds: taken in (tokens checked), then pooled
one llama_decode at a time between the batch loop's steps, the inputs of every waiting request packed
into it in arrival order. Everything here runs in the model's thread (runner.serve.engine_backend),
on a second context over the same model, made at the first request: runner.engine.embed's, or for a
reranker runner.engine.rerank's (a model is one or the other: the other kind of request is refused).
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass, field

from runner.engine.embed import EMBED_CTX, Embedder, IsAReranker
from runner.engine.engine import Engine
from runner.engine.rerank import NotAReranker, Reranker
from runner.errors import RunnerError


@dataclass
class EmbedRequest:
    """An embedding request: its texts, then (in the model's thread) their tokens and vectors. With a
    `query`, a rerank request: the texts are documents, each paired with it, and each "vector" is the
    pair's n_cls_out values (the score first)."""

    texts: list[str]
    truncate: bool
    done: asyncio.Future[tuple[list[list[float]], int]]  # (vectors, prompt tokens), on the event loop
    query: str | None = None
    inputs: list[list[int]] = field(default_factory=list)
    vectors: list[list[float]] = field(default_factory=list)
    cancelled: bool = False  # the client went away: its inputs leave the next batch

    @property
    def tokens(self) -> int:
        return sum(len(tokens) for tokens in self.inputs)


class EmbedQueue:
    """The waiting embedding requests of one model, and the context that pools them."""

    def __init__(self, engine: Engine, context: int, longest: int | None = None, name: str = "") -> None:
        """longest: the longest text in tokens (EMBED_CTX by default), at most the model's trained
        context and `context` (a sequence's, the served --ctx). name: the served model's."""
        self.engine = engine
        self.name = name
        self.longest = min(longest or EMBED_CTX, context, engine.model.n_ctx_train or EMBED_CTX)
        self.embedder: Embedder | None = None
        self.waiting: deque[EmbedRequest] = deque()

    def take(self, request: EmbedRequest) -> None:
        """Tokenize and check the texts (InputTooLong, EmptyInput, PairTooLong: the request's 400 at
        once; NotAReranker, IsAReranker: the wrong kind of request for this model), then it waits its
        turn."""
        if request.query is not None:
            if self.embedder is not None and not isinstance(self.embedder, Reranker):
                raise NotAReranker(self.name, self.embedder.pooling)
            reranker = self.embedder = self.embedder or Reranker(self.engine, self.longest, name=self.name)
            request.inputs = reranker.pairs(request.query, request.texts, truncate=request.truncate)
        else:
            if isinstance(self.embedder, Reranker):
                raise IsAReranker
            embedder = self.embedder = self.embedder or Embedder(self.engine, self.longest)
            tokens = [embedder.tokenize(text) for text in request.texts]
            request.inputs = embedder.check(tokens, truncate=request.truncate)
        self.waiting.append(request)

    def step(self) -> list[tuple[EmbedRequest, RunnerError | None]]:
        """One llama_decode of the next inputs in arrival order, as many as it takes; the requests
        that ended (all their vectors, cancelled, or in a decode that failed) with their error."""
        embedder = self.embedder
        assert embedder is not None
        inputs: list[list[int]] = []
        owners: list[EmbedRequest] = []
        tokens = 0
        for request in self.waiting:
            if request.cancelled:
                continue
            for one in request.inputs[len(request.vectors) :]:
                if inputs and (tokens + len(one) > embedder.n_ctx or len(inputs) >= embedder.n_seq):
                    break
                inputs.append(one)
                owners.append(request)
                tokens += len(one)
            else:
                continue
            break
        error: RunnerError | None = None
        if inputs:
            try:
                for request, vector in zip(owners, embedder.decode(inputs), strict=True):
                    request.vectors.append(vector)
            except RunnerError as exc:  # llama_decode failed: these requests end, the others go on
                error = exc
        ended = []
        for request in list(self.waiting):
            failed = error is not None and request in owners
            if request.cancelled or failed or len(request.vectors) == len(request.inputs):
                self.waiting.remove(request)
                ended.append((request, error if failed else None))
        return ended

    def drop(self) -> list[EmbedRequest]:
        """Every waiting request, taken out (the server is stopping)."""
        dropped, self.waiting = list(self.waiting), deque()
        return dropped

    def close(self) -> None:
        if self.embedder is not None:
            self.embedder.close()
            self.embedder = None
