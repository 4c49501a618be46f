"""Reranking: a query scored against each document by a reranking model, on a context of its own.

A reranker is a model whose GGUF declares pooling type RANK (the bge-reranker and jina-reranker
GGUFs; a BERT-style cross-encoder with a classification head, or a causal one such as
Qwen3-Reranker that the pinned llama.cpp pools at its last token). Its context is runner.engine.embed's
(`embeddings` on, n_ctx = n_batch = n_ubatch, one unified pool of cells cleared before each decode),
with pooling RANK: llama.cpp applies the classification head to each sequence's pooled state, and
the score is the first of the `llama_model_n_cls_out` values `llama_get_embeddings_seq` gives (the
rest of the row is not written), a raw logit, as llama-server's /v1/rerank returns it.

Each (query, document) pair is one sequence, built as llama-server builds it (format_prompt_rerank in
tools/server/server-common.cpp): the model's `rerank` chat template with {query} and {document} put
in (specials parsed, none added), or else `[BOS] query [EOS] [SEP] document [EOS]`, each special only
where the vocabulary says to add it (EOS falling back to SEP where there is none), the texts
tokenized without specials. A pair must sit whole in one micro-batch: llama.cpp asserts it, and the
assertion ends the process, so every pair is measured before anything is decoded, and one too long
is refused naming its document, or with `truncate` has its document cut (its head kept) to fit.

Flash attention is llama-server's default, "auto" (on, on the CPU), unless `runner serve --flash-attn`
said otherwise; runner.engine.embed's context keeps it off. A pair's score then moves with what shares its
batch (1.5e-3 on the test reranker, in llama-server too), but it is llama-server's to the bit for a
pair alone, and that model scores in a third of the time (a larger one in about the same: docs/rerank.md).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from runner.engine.embed import POOLING_NAMES, Embedder, EmptyInput, declared_pooling, plan_batches
from runner.engine.llamacpp import llama
from runner.errors import PromptTooLong, UsageError

if TYPE_CHECKING:
    from runner.engine.engine import Engine

MAX_DOCUMENTS = 1000  # documents one rerank takes (Cohere's advice per request); more: refused, named
LLAMA_TOKEN_NULL = -1


class NotAReranker(UsageError):
    """A model asked to rerank that is not a reranker (its pooling is not RANK): which one, and its
    pooling."""

    def __init__(self, model: str, pooling: str) -> None:
        super().__init__(
            f"{model} is not a reranking model (its pooling is '{pooling}'; a reranker's is 'rank', "
            "as the bge-reranker and jina-reranker GGUFs declare it)"
        )
        self.model = model


class PairTooLong(PromptTooLong):
    """A (query, document) pair longer than the rerank context (never cut unless asked)."""

    def __init__(self, index: int, n_tokens: int, limit: int) -> None:
        super().__init__(
            f"document {index}: the query and this document make {n_tokens:,} tokens together; a rerank "
            f"pair takes at most {limit:,} here",
            tokens=n_tokens,
            context=limit,
        )
        self.index = index
        self.n_tokens = n_tokens
        self.limit = limit


class QueryTooLong(PromptTooLong):
    """A query that leaves no room for any document in a pair, so that truncating cannot help."""

    def __init__(self, n_tokens: int, limit: int) -> None:
        super().__init__(
            f"the query is {n_tokens:,} tokens: with the pair's special tokens it leaves no room for a "
            f"document in the {limit:,} a rerank pair takes here",
            tokens=n_tokens,
            context=limit,
        )
        self.n_tokens = n_tokens
        self.limit = limit


def check_count(n: int, bound: int = MAX_DOCUMENTS) -> None:
    """At least one document and at most `bound`."""
    if n == 0:
        raise UsageError("no documents to rerank")
    if n > bound:
        raise UsageError(f"{n:,} documents: a rerank takes at most {bound:,}; split them")


def reranker_pooling(lib: Any, model: Any) -> str:
    """The pooling the model declares, by name ("none" where it declares none)."""
    kind = declared_pooling(lib, model)
    return "none" if kind is None else POOLING_NAMES.get(kind, str(kind))


class Reranker(Embedder):
    """A rerank context on an Engine's model (pooling RANK). Every call from the thread that owns the
    engine; `standalone` as runner.engine.embed.Embedder's. NotAReranker for a model that is not one."""

    def __init__(
        self, engine: Engine, n_ctx: int | None = None, *, standalone: bool = False, name: str | None = None
    ) -> None:
        lib = llama()
        pooling = reranker_pooling(lib, engine.model.handle)
        if pooling != "rank":
            raise NotAReranker(name or engine.path.name, pooling)
        super().__init__(engine, n_ctx, standalone=standalone)
        self.n_cls_out = max(1, int(lib.llama_model_n_cls_out(engine.model.handle)))
        template = lib.llama_model_chat_template(engine.model.handle, b"rerank")
        self.template = template.decode("utf-8", "replace") if template else None
        vocab = engine.model.vocab
        eos = int(lib.llama_vocab_eos(vocab))
        self._bos = [int(lib.llama_vocab_bos(vocab))] if lib.llama_vocab_get_add_bos(vocab) else []
        self._eos = [eos if eos != LLAMA_TOKEN_NULL else int(lib.llama_vocab_sep(vocab))]
        if not lib.llama_vocab_get_add_eos(vocab):
            self._eos = []
        self._sep = [int(lib.llama_vocab_sep(vocab))] if lib.llama_vocab_get_add_sep(vocab) else []

    def _pooling(self, lib: Any) -> int:
        return int(lib.LLAMA_POOLING_TYPE_RANK)

    def _flash_attn(self, engine: Engine) -> bool | None:
        """The engine's: llama.cpp's "auto" (on, on the CPU) unless --flash-attn said otherwise."""
        return engine.context.flash_attn

    def pair(self, query: str, document: str) -> list[int]:
        """The pair's tokens, as llama-server builds them."""
        if self.template is not None:
            text = self.template.replace("{query}", query).replace("{document}", document)
            return self.engine.model.tokenize(text, add_special=False, parse_special=True)
        q = self.engine.model.tokenize(query, add_special=False, parse_special=False)
        d = self.engine.model.tokenize(document, add_special=False, parse_special=False)
        return self._joined(q, d)

    def _joined(self, query: list[int], document: list[int]) -> list[int]:
        return [*self._bos, *query, *self._eos, *self._sep, *document, *self._eos]

    def pairs(self, query: str, documents: Sequence[str], *, truncate: bool = False) -> list[list[int]]:
        """Every pair's tokens, checked before any is decoded: EmptyInput for an empty query (-1) or
        document (its index); PairTooLong naming the first pair over n_ctx, or with `truncate` that
        document's head kept to fit (QueryTooLong where the query leaves no room)."""
        if not query:
            raise UsageError("the query is empty")
        out = []
        for i, document in enumerate(documents):
            if not document:
                raise EmptyInput(i)
            tokens = self.pair(query, document)
            if len(tokens) > self.n_ctx:
                if not truncate:
                    raise PairTooLong(i, len(tokens), self.n_ctx)
                tokens = self._cut(query, document, tokens)
            out.append(tokens)
        return out

    def _cut(self, query: str, document: str, tokens: list[int]) -> list[int]:
        """The pair with its document's head kept: as many of its tokens as leave the pair n_ctx."""
        if self.template is None:
            q = self.engine.model.tokenize(query, add_special=False, parse_special=False)
            d = self.engine.model.tokenize(document, add_special=False, parse_special=False)
            room = self.n_ctx - len(self._joined(q, []))
            if room < 1:
                raise QueryTooLong(len(q), self.n_ctx)
            return self._joined(q, d[:room])
        # a template: the document's text cut to a head of its tokens, put in again, until it fits
        d = self.engine.model.tokenize(document, add_special=False, parse_special=False)
        keep = len(d) - (len(tokens) - self.n_ctx)
        while keep >= 1:
            head = b"".join(self.engine.model.token_bytes(t) for t in d[:keep]).decode("utf-8", "ignore")
            tokens = self.pair(query, head.strip())
            if len(tokens) <= self.n_ctx:
                return tokens
            keep -= len(tokens) - self.n_ctx
        raise QueryTooLong(len(self.engine.model.tokenize(query, add_special=False)), self.n_ctx)

    def decode(self, inputs: Sequence[Sequence[int]]) -> list[list[float]]:
        """One llama_decode of pairs that fit it: each pair's n_cls_out values (the score first)."""
        return [list(pooled[: self.n_cls_out]) for pooled in self.pooled(inputs)]

    def stream_scores(self, pairs: Sequence[Sequence[int]]) -> Iterator[list[float]]:
        """The pairs' scores one llama_decode at a time, in order (the pairs checked: `pairs`)."""
        for batch in plan_batches([len(p) for p in pairs], self.n_ctx, self.n_seq):
            yield [values[0] for values in self.decode([pairs[i] for i in batch])]

    def scores(self, query: str, documents: Sequence[str], *, truncate: bool = False) -> list[float]:
        """Each document's score against the query, in document order."""
        pairs = self.pairs(query, documents, truncate=truncate)
        return [score for batch in self.stream_scores(pairs) for score in batch]

    def __enter__(self) -> Reranker:
        return self
