"""A KV cache's cells, in plain Python: the llama_batch a step fills (add_tokens), how many tokens two
sequences share (common_prefix) and every prompt of a batch does (shared_prefix), and a sequence's
saved state rewritten for a context of another number of streams (restream). No llama.cpp call:
runner.engine.context does those.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any

STATE_HEAD = 8  # llama_state_seq_get_data's magic and the sequence id, before the memory's state
MIN_SHARED = 4  # a head held by another sequence shorter than this is not worth a copy


def restream(data: bytes, n_stream: int) -> bytes:
    """A sequence's state (a plain KV cache's: after the magic and the sequence id, the stream count,
    then each stream's cell count and, where that is not 0, its cells) rewritten for a context of
    `n_stream` streams. A sequence's cells are all in one stream, and llama.cpp reads them into the
    destination sequence's stream whichever stream they were written from, so the state is the same
    cells beside other, empty streams. b"" where the bytes are not one such state (never loaded)."""
    at = STATE_HEAD
    if len(data) < at + 8:
        return b""
    (have,) = struct.unpack_from("<I", data, at)
    counts = [struct.unpack_from("<I", data, at + 4 + 4 * i)[0] for i in range(min(have, 64))]
    lead = next((i for i, c in enumerate(counts) if c), None)
    if have < 1 or lead is None or at + 4 + 4 * have > len(data):
        return b""
    trail = have - 1 - lead
    end = len(data) - 4 * trail
    if end <= at + 4 + 4 * lead or data[end:].strip(b"\0"):
        return b""
    section = data[at + 4 + 4 * lead : end]
    return data[:at] + struct.pack("<I", n_stream) + section + b"\0" * (4 * (n_stream - 1))


def add_tokens(
    batch: Any, seq: int, tokens: Sequence[int], pos: int, *, logits: bool = True, all_logits: bool = False
) -> int:
    """Tokens of one sequence into the batch at positions from `pos`; logits for the last (True) or none
    (False), or with all_logits for every one (whatever `logits` says). Returns the row of the first
    token."""
    n = batch.n_tokens
    for i, token in enumerate(tokens):
        row = n + i
        batch.token[row] = token
        batch.pos[row] = pos + i
        batch.n_seq_id[row] = 1
        batch.seq_id[row][0] = seq
        batch.logits[row] = all_logits
    if logits and tokens:
        batch.logits[n + len(tokens) - 1] = 1
    batch.n_tokens = n + len(tokens)
    return n


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many tokens a and b start with in common."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def shared_prefix(prompts: list[list[int]]) -> int:
    """Tokens every prompt starts with, leaving each at least one of its own to evaluate."""
    if len(prompts) < 2:
        return 0
    n = min(len(p) for p in prompts) - 1
    for p in prompts[1:]:
        n = min(n, common_prefix(prompts[0], p))
    n = next((i for i, token in enumerate(prompts[0][:n]) if token < 0), n)  # text only: not an image
    return n if n >= MIN_SHARED else 0
