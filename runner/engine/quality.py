"""How well a model predicts a text: perplexity as llama-perplexity computes it, and the KL-divergence
of its next-token distributions from a reference model's (llama-perplexity --kl-divergence).

The text's tokens are cut into chunks of `ctx` tokens (the last, shorter one dropped); each chunk is
evaluated from an empty cache (its first token the BOS where the model adds one) and scored on its
second half: the log-probability each position gives the token after it. Each chunk is one decode
(n_batch at a time, as llama-perplexity does), logits asked for its second half: the output buffer
holds ctx/2 rows of logits (48 MiB for SmolLM2 at ctx 512). The same positions evaluated in other
batch shapes (the first half apart, 64 rows a decode) came out 0.2% off llama-perplexity's figure on
the CPU: llama.cpp's kernels do not give the same logits for every split of a batch, so the split is
llama-perplexity's own, and the figure its own to the printed digit.

A reference pass keeps, for each scored position, its TOP_K most likely tokens and their
log-probabilities: bounded, and the KL-divergence summed over them is within 0.6% of the whole
vocabulary's (measured: SmolLM2 Q4_1 against its Q3_K_S; with the rest of the mass as one bucket it
was 2.2% low, the bucket being a lower bound on the tail's part; llama-perplexity itself sums the
tokens above e^-16 of a 16-bit copy).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from runner.engine.logprobs import ROWS, rows
from runner.errors import UsageError

if TYPE_CHECKING:
    from runner.engine.context import Context

TOP_K = 1024  # reference tokens kept per scored position (8 KiB each)


@dataclass
class Reference:
    """A reference model's pass over a text: per scored position, its TOP_K tokens (best first) and
    their log-probabilities, and the log-probability it gave the token that came."""

    tokens_hash: str  # the text's tokens (the vocabularies must agree)
    ctx: int
    ids: Any  # int32 (n, TOP_K)
    logp: Any  # float32 (n, TOP_K)
    nll: Any  # float64 (n,)


@dataclass(frozen=True)
class Quality:
    tokens: int  # the text's tokens
    chunks: int
    ctx: int
    scored: int  # positions scored
    perplexity: float
    perplexity_error: float  # its standard error, as llama-perplexity estimates it
    seconds: float = 0.0
    kld_mean: float | None = None  # with a reference: the mean KL-divergence from it, nats
    kld_error: float | None = None
    kld_p99: float | None = None
    same_top: float | None = None  # the share of positions where both rank the same token first
    reference_perplexity: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if v is not None}


def tokens_hash(tokens: Sequence[int]) -> str:
    import hashlib

    return hashlib.sha256(b"".join(t.to_bytes(4, "little", signed=True) for t in tokens)).hexdigest()


def vocabulary_mismatch(model: Any, reference: Any) -> str | None:
    """Why a reference (its GGUF header) cannot be compared with the model (its header), or None: the
    KL-divergence compares two distributions over one vocabulary, token by token, so the tokenizer,
    its pre-tokenizer and every token must be the same. Read from the headers, before either loads."""
    for key, what in (("tokenizer.ggml.model", "tokenizer"), ("tokenizer.ggml.pre", "pre-tokenizer")):
        if model.get(key) != reference.get(key):
            return f"its {what} is {reference.get(key)!r}, the model's {model.get(key)!r}"
    ours, theirs = model.vocab_size, reference.vocab_size
    if ours != theirs:
        return f"its vocabulary has {theirs or 0:,} tokens, the model's {ours or 0:,}"
    ours, theirs = model.get("tokenizer.ggml.tokens") or [], reference.get("tokenizer.ggml.tokens") or []
    for i, (mine, other) in enumerate(zip(ours, theirs, strict=False)):
        if mine != other:
            return f"token {i} is {other!r} in it, {mine!r} in the model"
    return None


def check_ctx(ctx: int) -> None:
    if ctx < ROWS or ctx % 2:
        raise UsageError(f"--ctx {ctx}: perplexity needs an even context of at least {ROWS}")


def chunks_of(tokens: Sequence[int], ctx: int) -> int:
    """The chunks a text gives at this context; a UsageError where fewer than two (llama-perplexity's
    own floor)."""
    check_ctx(ctx)
    if len(tokens) < 2 * ctx:
        raise UsageError(
            f"the text is {len(tokens):,} tokens; --ctx {ctx} needs at least {2 * ctx:,} (two chunks)"
        )
    return len(tokens) // ctx


def score_text(
    context: Context,
    tokens: Sequence[int],
    ctx: int,
    *,
    reference: Reference | None = None,
    keep: bool = False,
    progress: Callable[[int, int], None] | None = None,
) -> tuple[Quality, Reference | None]:
    """The text's perplexity under this engine's model, and with `reference` the KL-divergence from
    it; `keep`: this pass's own top tokens kept, to be a reference later."""
    import time

    started = time.perf_counter()
    n_chunks = chunks_of(tokens, ctx)
    total = n_chunks * (ctx - 1 - ctx // 2)
    if reference is not None and (reference.tokens_hash != tokens_hash(tokens) or reference.ctx != ctx):
        raise UsageError("the reference scored other tokens: its vocabulary or its --ctx differs")
    scores = _Scores.empty(total, compare=reference is not None, keep=keep)
    for c in range(n_chunks):
        _score_chunk(context, tokens, c, ctx, scores, reference)
        if progress is not None:
            progress(c + 1, n_chunks)
    quality = _quality(scores, len(tokens), n_chunks, ctx, time.perf_counter() - started, reference)
    kept = None
    if scores.kept_ids is not None:
        kept = Reference(tokens_hash(tokens), ctx, scores.kept_ids, scores.kept_logp, scores.nll)
    return quality, kept


@dataclass
class _Scores:
    """Per scored position: its negative log-likelihood, and with a reference its KL-divergence from
    it and whether both rank the same token first, or kept to be a reference its top tokens; `at`:
    the position the next row fills."""

    nll: Any  # float64 (n,)
    kld: Any | None = None  # float64 (n,)
    same: Any | None = None  # bool (n,)
    kept_ids: Any | None = None  # int32 (n, TOP_K)
    kept_logp: Any | None = None  # float32 (n, TOP_K)
    at: int = 0

    @classmethod
    def empty(cls, total: int, *, compare: bool, keep: bool) -> _Scores:
        import numpy as np

        return cls(
            np.zeros(total),
            np.zeros(total) if compare else None,
            np.zeros(total, dtype=bool) if compare else None,
            np.zeros((total, TOP_K), dtype=np.int32) if keep else None,
            np.zeros((total, TOP_K), dtype=np.float32) if keep else None,
        )

    def add(self, logits: Any, coming: Any, reference: Reference | None) -> None:
        """A block of rows of logits, each scoring the token that came after it (`coming`)."""
        import numpy as np

        at, m = self.at, logits.shape[0]
        shifted = logits.astype(np.float64) - logits.max(axis=1, keepdims=True)
        logp = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
        self.nll[at : at + m] = -logp[np.arange(m), coming]
        if reference is not None and self.kld is not None and self.same is not None:
            self.kld[at : at + m] = _kl(reference, logp, at)
            self.same[at : at + m] = logits.argmax(axis=1) == reference.ids[at : at + m, 0]
        if self.kept_ids is not None and self.kept_logp is not None:
            ids = np.argpartition(logp, -TOP_K, axis=1)[:, -TOP_K:]
            ids.sort(axis=1)  # ties in id order, as argmax breaks them
            order = np.argsort(-np.take_along_axis(logp, ids, axis=1), axis=1, kind="stable")
            ids = np.take_along_axis(ids, order, axis=1)
            self.kept_ids[at : at + m] = ids
            self.kept_logp[at : at + m] = np.take_along_axis(logp, ids, axis=1)
        self.at += m


def _score_chunk(
    context: Context, tokens: Sequence[int], c: int, ctx: int, scores: _Scores, reference: Reference | None
) -> None:
    """Chunk `c` evaluated from an empty cache, n_batch tokens a decode, its second half scored."""
    import numpy as np

    first = ctx // 2
    chunk = list(tokens[c * ctx : (c + 1) * ctx])
    if context.model.adds_bos:
        chunk[0] = context.model.bos
    context.forget(0)
    context.reserve(ctx)
    for begin in range(0, ctx, context.n_batch):
        piece = chunk[begin : begin + context.n_batch]
        asked = max(0, first - begin)  # logits from this index of the piece on
        context.extend(piece, 0, logits=False, rows_from=asked if asked < len(piece) else None)
        start = begin + asked  # the chunk position of the first row
        n = min(begin + len(piece), ctx - 1) - start  # rows that score a token (not the last)
        if n <= 0:
            continue
        everything = rows(context.ctx, n, context.model.n_vocab)
        for i in range(0, n, ROWS):  # the float64 copies a block at a time, not n_batch rows at once
            logits = everything[i : i + ROWS]
            first_next = c * ctx + start + i + 1
            scores.add(logits, np.asarray(tokens[first_next : first_next + logits.shape[0]]), reference)


def _quality(
    scores: _Scores, n_tokens: int, n_chunks: int, ctx: int, seconds: float, reference: Reference | None
) -> Quality:
    """The perplexity and its standard error as llama-perplexity estimates them, and with a reference
    the KL-divergence's mean, error and 99th percentile, and how often both ranked the same token first."""
    nll, total = scores.nll, len(scores.nll)
    mean = float(nll.mean())
    var = float((nll * nll).mean()) - mean * mean
    ppl = math.exp(mean)
    error = math.sqrt(var / (total - 1)) * ppl if var > 0 else 0.0
    quality = Quality(n_tokens, n_chunks, ctx, total, ppl, error, seconds)
    kld, same = scores.kld, scores.same
    if reference is None or kld is None or same is None:
        return quality
    k_mean = float(kld.mean())
    k_var = float((kld * kld).mean()) - k_mean * k_mean
    # a KL-divergence is never below 0: a model against itself gives -7e-9 of rounding (the reference's
    # log-probabilities kept as float32), printed as 0
    k_mean = max(k_mean, 0.0)
    return Quality(
        **{
            **quality.__dict__,
            "kld_mean": k_mean,
            "kld_error": math.sqrt(max(k_var, 0.0) / (total - 1)),
            "kld_p99": max(percentile(sorted(kld.tolist()), 0.99), 0.0),
            "same_top": float(same.mean()),
            "reference_perplexity": math.exp(float(reference.nll.mean())),
        }
    )


def _kl(reference: Reference, logp: Any, at: int) -> Any:
    """KL(reference || this) for rows at.., summed over the reference's top tokens."""
    import numpy as np

    n = logp.shape[0]
    p_logp = reference.logp[at : at + n].astype(np.float64)
    q_logp = np.take_along_axis(logp, reference.ids[at : at + n].astype(np.int64), axis=1)
    return (np.exp(p_logp) * (p_logp - q_logp)).sum(axis=1)


def percentile(values: Sequence[float], fraction: float) -> float:
    """llama-perplexity's: linear between the two nearest of the sorted values."""
    if fraction <= 0:
        return values[0]
    if fraction >= 1:
        return values[-1]
    p = fraction * (len(values) - 1)
    i = int(p)
    p -= i
    return (1 - p) * values[i] + p * values[min(i + 1, len(values) - 1)]
