"""Token log-probabilities from a row of logits: the sampled token's and the most likely ones', as
llama-server computes them (a softmax over the whole vocabulary of the row the sampler read, before
temperature and the other samplers; after a schema's mask, which set the refused tokens to -inf, so
those are never listed as alternatives).

Only the sequences that ask pay for it (runner.engine.loop reads a row for those alone); the prompt's
own log-probabilities (`echo`) come from an evaluation with logits at every position, in chunks of
at most ROWS rows so llama.cpp's output buffer stays within ROWS rows of logits (runner.memory counts
it for a server). The server's greedy pick reads the same row (argmax).
"""

from __future__ import annotations

import ctypes
import functools
import math
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

MAX_TOP = 20  # the most alternatives a token may list (OpenAI's top_logprobs limit)
ROWS = 64  # the most rows of logits one evaluation of a scored prompt asks for
FLOOR = -3.4028234663852886e38  # a probability of 0: float's lowest, not -inf (JSON has no -inf)

if TYPE_CHECKING:
    from runner.engine.context import Context


@dataclass(frozen=True)
class TokenLogprob:
    """One token's log-probability, with the `top` most likely tokens at its position (best first)."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


VIEWS = 64  # numpy views over llama.cpp's rows kept (a server's sequences each read their own)
_views: dict[tuple[int, int], Any] = {}  # (address, n_vocab): a view, made once per row's address


def row(ctx: Any, index: int, n_vocab: int) -> Any:
    """Batch row `index`'s logits (-1: the last) as a numpy array over llama.cpp's own buffer. The
    view of an address seen before is reused: after a decode the interpreter's caches are cold, and
    making one (a ctypes array, then numpy's) cost ~10 µs of the ~60 a server's greedy pick took.
    A view is only read where llama.cpp has just given its address as a row's."""
    address = _logits_ith()(ctx, index)
    view = _views.get((address, n_vocab))
    if view is None:
        import numpy as np

        if len(_views) >= VIEWS:
            _views.clear()
        view = np.frombuffer(_row_type(n_vocab).from_address(address), dtype=np.float32)
        _views[(address, n_vocab)] = view
    return view


@functools.cache
def _logits_ith() -> Any:
    """llama_get_logits_ith returning the address as an int (no ctypes pointer object to cast)."""
    from runner.engine.llamacpp import llama

    function = llama()._lib["llama_get_logits_ith"]  # a function object of its own: theirs stays as it is
    function.argtypes = [ctypes.c_void_p, ctypes.c_int32]
    function.restype = ctypes.c_void_p
    return function


def argmax(ctx: Any, index: int, n_vocab: int) -> int | None:
    """Row `index`'s token as llama.cpp's greedy sampler picks it, the first of its largest logits,
    without the sampler's copy of the whole row into its candidates (~4 µs against ~35 at 49k
    tokens). None where that logit is NaN: llama.cpp's greedy passes over NaN."""
    logits = row(ctx, index, n_vocab)
    token = int(logits.argmax())
    return None if logits[token] != logits[token] else token


@functools.cache
def _row_type(n_vocab: int) -> Any:
    return ctypes.c_float * n_vocab


_scratch = threading.local()  # a row's worth of float32 per thread (each model has its own)


def log_sum_exp(logits: Any) -> float:
    """log(sum(exp(logits))) of a float32 row: the exponentials in float32 (a schema's -inf gives 0)
    in a buffer kept for the thread, summed in float64. ~0.06 ms for a 49k vocabulary, against 0.35
    ms for the whole row's log-probabilities in float64."""
    import numpy as np

    buffer = getattr(_scratch, "buffer", None)
    if buffer is None or buffer.shape != logits.shape:
        buffer = _scratch.buffer = np.empty(logits.shape, dtype=np.float32)
    top = float(logits.max())
    np.subtract(logits, np.float32(top), out=buffer)
    np.exp(buffer, out=buffer)
    return top + math.log(float(buffer.sum(dtype=np.float64)))


def read(logits: Any, token: int, n_top: int) -> TokenLogprob:
    """`token`'s log-probability in this row of logits and the row's `n_top` most likely tokens. A
    token a schema masked (-inf: it could not be picked) is no alternative: fewer are listed where the
    schema leaves fewer than `n_top` (llama-server would list them at float's lowest, -3.4e38)."""
    import numpy as np

    lse = log_sum_exp(logits)
    best: tuple[tuple[int, float], ...] = ()
    if n_top > 0:
        ids = np.argpartition(logits, -n_top)[-n_top:]
        ids = ids[np.lexsort((ids, -logits[ids]))]  # most likely first, ties by id
        best = tuple((int(i), _finite(float(logits[i]) - lse)) for i in ids if logits[i] != -np.inf)
    return TokenLogprob(int(token), _finite(float(logits[token]) - lse), best)


def _finite(value: float) -> float:
    return float(value) if value > FLOOR else FLOOR


def rows(ctx: Any, n: int, n_vocab: int) -> Any:
    """The last evaluation's n rows of logits (every output it asked for), as an (n, n_vocab) array."""
    import numpy as np

    from runner.engine.llamacpp import llama

    pointer = llama().llama_get_logits(ctx)
    flat = ctypes.cast(pointer, ctypes.POINTER(ctypes.c_float))
    return np.ctypeslib.as_array(flat, shape=(n * n_vocab,)).reshape(n, n_vocab)


def score_prompt(context: Context, tokens: Sequence[int], seq: int, n_top: int) -> list[TokenLogprob]:
    """The prompt evaluated whole into sequence `seq` (what it held dropped), ROWS tokens a decode
    with logits at each: every token's log-probability after the first, as the tokens before it
    predicted it, with `n_top` alternatives each."""
    context.forget(seq)
    context.reserve(len(tokens))
    out: list[TokenLogprob] = []
    for start in range(0, len(tokens), ROWS):
        chunk = tokens[start : start + ROWS]
        context.extend(chunk, seq, all_logits=True)
        logits = rows(context.ctx, len(chunk), context.model.n_vocab)
        for i in range(len(chunk)):
            if start + i + 1 < len(tokens):
                out.append(read(logits[i], tokens[start + i + 1], n_top))
    return out
