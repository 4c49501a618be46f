"""Runs of a sequence's cached tokens shifted to where a new prompt needs them, instead of evaluated
again: llama-server's `--cache-reuse N` (tools/server/server-context.cpp), step for step.

An editor's fill-in-the-middle prompt keeps only the prefix's last tokens (runner.engine.text.fim), so
each keystroke moves its start: the common head with the last prompt is a few tokens, yet most of the
prefix is still in the cells, a few positions further on. After the common head, every run of at least
`least` tokens that the cells hold in the order the new prompt wants them is moved into place
(llama_memory_seq_add: the keys re-rotated, nothing evaluated); the cells skipped are dropped.
Only a memory that can shift (a plain KV cache) and a prompt without images take part.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from runner.engine.cells import common_prefix
from runner.engine.llamacpp import llama

if TYPE_CHECKING:
    from runner.engine.context import Context

Move = tuple[int, int, int]  # (from cell, to cell, tokens): a run of cached cells moved to its new place


def chunk_moves(
    cached: Sequence[int], tokens: Sequence[int], n_past: int, least: int
) -> tuple[int, list[Move]]:
    """llama-server's reuse plan: after the common head (`n_past` tokens), walk the cache; a run that
    matches the prompt where it stands now, of `least` tokens or more, is moved there, else the walk
    skips one cached cell. The tokens held once the moves are done, and the moves."""
    head_c = head_p = n_past
    moves: list[Move] = []
    while head_c < len(cached) and head_p < len(tokens):
        n = 0
        while (
            head_c + n < len(cached) and head_p + n < len(tokens) and cached[head_c + n] == tokens[head_p + n]
        ):
            n += 1
        if n >= least:
            moves.append((head_c, head_p, n))
            head_c += n
            head_p += n
        else:
            head_c += 1
    return head_p, moves


def reusable(cached: Sequence[int], tokens: Sequence[int], least: int, most: int) -> int:
    """The tokens of `tokens` a sequence holding `cached` would keep, its runs moved (at most `most`)."""
    head = min(common_prefix(cached, tokens), most)
    if least <= 0 or not _plain(cached) or not _plain(tokens):
        return head
    return min(chunk_moves(cached, tokens, head, least)[0], most)


def reuse_chunks(context: Context, tokens: Sequence[int], seq: int, least: int, most: int) -> int:
    """Sequence `seq` made to hold the longest start of `tokens` its cells can give, runs of `least`
    tokens or more moved into place; what it holds past that dropped. How many it holds (at most
    `most`). Nothing moves where the memory cannot shift or images take part (the common head only)."""
    held = context.cells[seq]
    lib, memory = llama(), context.memory
    n_past = min(common_prefix(held, tokens), most)
    if least <= 0 or not _plain(held) or not _plain(tokens) or not lib.llama_memory_can_shift(memory):
        return n_past
    end, moves = chunk_moves(held, tokens, n_past, least)
    for head_c, head_p, n in moves:
        lib.llama_memory_seq_rm(memory, seq, head_p, head_c)
        lib.llama_memory_seq_add(memory, seq, head_c, head_c + n, head_p - head_c)
    keep = min(end, most)
    if moves:
        lib.llama_memory_seq_rm(memory, seq, keep, -1)
        held[:] = list(tokens[:keep])
    return keep


def _plain(tokens: Sequence[int]) -> bool:
    """No image in them (an image's cells are negative pseudo-tokens)."""
    return all(t >= 0 for t in tokens)
