"""Embeddings: texts as unit vectors, from a second llama.cpp context on an Engine's loaded model.

The context is made for pooling, not for generating: `embeddings` on, the pooling the GGUF declares
(`{arch}.pooling_type`, read by llama.cpp), and MEAN for a model that declares none or NONE (a chat
model such as SmolLM2: per-token states are no sentence vector, and of mean, last-token and first-token
pooling, mean kept same-topic texts closest on SmolLM2). llama-server refuses /v1/embeddings for such a
model unless started with `--pooling`; runner pools as `--pooling mean` would. A reranker (RANK)
scores pairs and is refused.

A pooled sequence must sit whole in one micro-batch (llama.cpp pools each ubatch alone, and asserts
it for non-causal models), so n_ctx = n_batch = n_ubatch: that size is both the longest input and the
tokens one llama_decode takes. The KV cells are one unified pool (kv_unified), cleared before each
decode: with a stream per sequence llama.cpp cuts a batch into ubatches of equal length per sequence
and pools a longer input over its tail only (llama-server -np 2 without --kv-unified does: a text
batched with a shorter one came out at cosine 0.86 to itself alone). Each input is a sequence of its
own; as many consecutive inputs as fit the batch and MAX_SEQS go in one decode. Vectors are
L2-normalized, as OpenAI's and Ollama's /api/embed return them.

Flash attention is off here unless the engine was told to use it, where llama-server's default
("auto") turns it on: on the CPU its kernel takes another path once a batch passes ~64 tokens, and the
same text then came out up to 8e-3 apart per component (cosine 1 - 5e-4) depending on what it was
batched with; without it, within 2.1e-3 (cosine 1 - 1.3e-5): the rounding of SIMD lanes where a
sequence starts at another offset of the batch. A vector is stored and compared with vectors made in
other calls, so it should not depend on its batch-mates; that costs speed (SmolLM2: ~1.7x the time)
and puts the vectors up to 1e-2 per component from llama-server's (docs/embed.md). A reranker's
scores are compared within one call: its context keeps "auto" (runner.engine.rerank). The KV cells are
f16 whatever the engine's (they hold one batch only; a quantized V cache would need flash attention).
"""

from __future__ import annotations

import ctypes
import math
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from runner.engine.cells import add_tokens
from runner.engine.context import Context
from runner.engine.llamacpp import Placement, llama
from runner.errors import EngineError, InvalidModelFile, PromptTooLong, UsageError

if TYPE_CHECKING:
    from runner.engine.engine import Engine

EMBED_CTX = 512  # the longest input by default (llama-server's too: its n_ubatch); the logits llama.cpp
# computes beside the pooled vector make memory grow with it (SmolLM2: compute buffers 100 MiB at 512,
# 400 at 2,048, 1.7 GiB at 8,192; as much again of output buffer once a full batch ran)
MAX_SEQS = 256  # inputs in one llama_decode at most (llama.cpp's LLAMA_MAX_SEQ)
POOLING_NAMES = {0: "none", 1: "mean", 2: "cls", 3: "last", 4: "rank"}


class InputTooLong(PromptTooLong):
    """An input longer than the embedding context (never cut unless asked): which one, and its size."""

    def __init__(self, index: int, n_tokens: int, limit: int) -> None:
        super().__init__(f"input {index} is {n_tokens:,} tokens; an embedding takes at most {limit:,} here")
        self.index = index
        self.n_tokens = n_tokens
        self.limit = limit


class EmptyInput(UsageError):
    """An input with no tokens: there is nothing to pool."""

    def __init__(self, index: int) -> None:
        super().__init__(f"input {index} is empty")
        self.index = index


class IsAReranker(InvalidModelFile):
    """An embedding asked of a reranker (pooling RANK): its pooled output is a score, not a vector."""

    def __init__(self) -> None:
        super().__init__(
            "this model is a reranker (pooling 'rank'): it scores a query against documents "
            "(runner rerank, POST /v1/rerank), it does not embed"
        )


def declared_pooling(lib: Any, model: Any) -> int | None:
    """The pooling type the GGUF declares (`{arch}.pooling_type`), None where it declares none."""
    arch = _meta(lib, model, "general.architecture")
    declared = _meta(lib, model, f"{arch}.pooling_type") if arch else None
    return int(declared) if declared is not None and declared.lstrip("-").isdigit() else None


def pooling_for(lib: Any, model: Any) -> int:
    """The pooling to ask llama.cpp for: UNSPECIFIED (it reads the GGUF's own) where the model
    declares one, MEAN where it declares none or NONE; a reranker is refused."""
    kind = declared_pooling(lib, model)
    if kind is None or kind == lib.LLAMA_POOLING_TYPE_NONE:
        return int(lib.LLAMA_POOLING_TYPE_MEAN)
    if kind == lib.LLAMA_POOLING_TYPE_RANK:
        raise IsAReranker
    return int(lib.LLAMA_POOLING_TYPE_UNSPECIFIED)


def _meta(lib: Any, model: Any, key: str) -> str | None:
    buffer = ctypes.create_string_buffer(128)
    n = lib.llama_model_meta_val_str(model, key.encode(), buffer, len(buffer))
    return buffer.value.decode("utf-8", "replace") if n >= 0 else None


def plan_batches(lengths: Sequence[int], n_batch: int, n_seq: int) -> list[range]:
    """Consecutive inputs per llama_decode: as many as fit n_batch tokens and n_seq sequences
    (each length at most n_batch), so the vectors come back in input order, one batch at a time."""
    batches, start, tokens = [], 0, 0
    for i, n in enumerate(lengths):
        if i > start and (tokens + n > n_batch or i - start >= n_seq):
            batches.append(range(start, i))
            start, tokens = i, 0
        tokens += n
    if start < len(lengths):
        batches.append(range(start, len(lengths)))
    return batches


def normalized(vector: list[float]) -> list[float]:
    """The vector at unit length (L2); a zero vector stays zero, as llama.cpp's common_embd_normalize."""
    norm = math.hypot(*vector)
    return [x / norm for x in vector] if norm > 0 else vector


class Embedder:
    """An embedding context on an Engine's model. Every call from the thread that owns the engine.

    `standalone` (runner embed): the engine generates nothing beside it, so Ctrl-C (runner.interrupt)
    stops a decode through llama.cpp's abort callback, as a prefill does, and the thread count follows
    this context's own steps (runner.engine.threads). Else (the server's model thread, which has no
    Ctrl-C of its own) it follows the count the engine's batch loop chooses."""

    def __init__(self, engine: Engine, n_ctx: int | None = None, *, standalone: bool = False) -> None:
        lib = llama()
        self.engine = engine
        self.standalone = standalone
        asked = n_ctx or min(EMBED_CTX, engine.model.n_ctx_train or EMBED_CTX)
        n_seq = min(MAX_SEQS, int(lib.llama_max_parallel_sequences()))
        placement = Placement(kv_type=None, flash_attn=self._flash_attn(engine))  # f16 scratch cells
        self.context = Context(
            engine.model, asked, n_seq, engine.context.threads, placement, pooling=self._pooling(lib)
        )
        ctx = self.context.ctx
        self.n_ctx = min(int(lib.llama_n_batch(ctx)), int(lib.llama_n_ubatch(ctx)))
        self.n_seq = int(lib.llama_n_seq_max(ctx))
        self.n_embd = int(lib.llama_model_n_embd_out(engine.model.handle))
        self.pooling = POOLING_NAMES.get(int(lib.llama_pooling_type(ctx)), "?")

    def _pooling(self, lib: Any) -> int:
        """The context's pooling type (runner.engine.rerank's context asks for RANK)."""
        return pooling_for(lib, self.engine.model.handle)

    def _flash_attn(self, engine: Engine) -> bool | None:
        """Flash attention for this context: off unless the engine was told to use it (the module's
        docstring says why; runner.engine.rerank's context keeps llama-server's "auto")."""
        return engine.context.flash_attn or False

    def tokenize(self, text: str) -> list[int]:
        """A text's tokens as llama-server's embedding endpoint takes them (specials added and parsed)."""
        return self.engine.model.tokenize(text)

    def check(self, token_lists: Sequence[Sequence[int]], *, truncate: bool = False) -> list[list[int]]:
        """The inputs as they will be embedded: each cut to n_ctx where `truncate` (the head kept, as
        Ollama cuts), else InputTooLong naming the first too long; EmptyInput for one with no tokens."""
        out = []
        for i, tokens in enumerate(token_lists):
            if not tokens:
                raise EmptyInput(i)
            if len(tokens) > self.n_ctx:
                if not truncate:
                    raise InputTooLong(i, len(tokens), self.n_ctx)
                tokens = tokens[: self.n_ctx]
            out.append(list(tokens))
        return out

    def embed(self, token_lists: Sequence[Sequence[int]], *, truncate: bool = False) -> list[list[float]]:
        """Every input's unit vector, in order."""
        return [vector for batch in self.stream(token_lists, truncate=truncate) for vector in batch]

    def stream(
        self, token_lists: Sequence[Sequence[int]], *, truncate: bool = False
    ) -> Iterator[list[list[float]]]:
        """The vectors one llama_decode at a time, in input order (all inputs checked first)."""
        inputs = self.check(token_lists, truncate=truncate)
        for batch in plan_batches([len(t) for t in inputs], self.n_ctx, self.n_seq):
            yield self.decode([inputs[i] for i in batch])

    def decode(self, inputs: Sequence[Sequence[int]]) -> list[list[float]]:
        """One llama_decode of inputs that fit it (checked, at most n_ctx tokens and n_seq of them):
        each input's unit vector."""
        return [normalized(pooled[: self.n_embd]) for pooled in self.pooled(inputs)]

    def pooled(self, inputs: Sequence[Sequence[int]]) -> list[Any]:
        """One llama_decode of inputs that fit it, each its own sequence from position 0, every token
        an output, as pooling needs: llama.cpp's pooled output of each (float pointers, valid until
        the next decode)."""
        lib = llama()
        total = sum(len(t) for t in inputs)
        if not inputs or total > self.n_ctx or len(inputs) > self.n_seq or not all(inputs):
            raise EngineError(f"{len(inputs)} inputs of {total} tokens do not fit one embedding batch")
        batch = self.context.batch_for(total)
        for seq, tokens in enumerate(inputs):
            add_tokens(batch, seq, tokens, 0, all_logits=True)
        self.context.pool(batch, steer=self.standalone)
        outputs = []
        for seq in range(len(inputs)):
            pooled = lib.llama_get_embeddings_seq(self.context.ctx, seq)
            if not pooled:
                raise EngineError(f"llama.cpp gave no pooled embedding for sequence {seq}")
            outputs.append(pooled)
        return outputs

    def close(self) -> None:
        self.context.close()

    def __enter__(self) -> Embedder:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()
