"""Kept prompt heads: the one prefix store every command looks up, in two tiers keyed by tokens.

  RAM   StateCache: sequences' KV states kept in host memory once their sequence goes to another
        prompt (a chat client coming back after other clients took its sequence, the same prompt sent
        again). llama-server keeps one too (--cache-ram).
  disk  runner.engine.promptcache.PromptCache: the evaluated heads of prompts (a long system prompt,
        a document on stdin, a conversation) that runner run, chat and other processes stored.

A job's sequence first reuses what its own cells hold, then the longest head held by another sequence
(copied), then by the RAM tier, then by the disk tier: whichever holds the most of the prompt wins, so
a chat also restores a head another process evaluated. Both tiers evict the least recently used entry
first past their byte limit, and an entry that another one extends is dropped.
"""

from __future__ import annotations

import ctypes
import itertools
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from runner.engine.context import common_prefix
from runner.engine.llamacpp import llama
from runner.engine.promptcache import MIN_HEAD, Cacheable, CacheUse, PromptCache

MIN_SAVED = 16  # a sequence losing fewer tokens than this to a new job is not kept in RAM


class Sequences(Cacheable, Protocol):
    """What the store needs of an engine (runner.engine.engine.Engine is one): its sequences' tokens,
    its context and memory, and a sequence emptied."""

    cells: list[list[int]]

    @property
    def ctx(self) -> Any: ...

    @property
    def memory(self) -> Any: ...

    def forget(self, seq: int) -> None: ...

    def last_position(self, tokens: Sequence[int]) -> int: ...


class StateCache:
    """The RAM tier: each entry is llama_state_seq_get_data's bytes (the sequence's own cells only)
    and the tokens they hold; an entry another one extends is dropped; past `limit` bytes the least
    recently used go first. Used from the loop's thread only."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0  # bytes
        self.saved = 0  # entries ever kept
        self.restored = 0  # entries ever loaded into a sequence
        self._entries: OrderedDict[int, tuple[list[int], Any]] = OrderedDict()
        self._ids = itertools.count()

    def __len__(self) -> int:
        return len(self._entries)

    def best(self, tokens: Sequence[int], most: int) -> tuple[int | None, int]:
        """The entry sharing the longest head with `tokens` (at most `most`), and that length."""
        found, n = None, 0
        for key, (held, _) in self._entries.items():
            k = min(common_prefix(held, tokens), most)
            if k > n:
                found, n = key, k
        return found, n

    def save(self, ctx: Any, seq: int, tokens: Sequence[int]) -> None:
        """Keep what sequence `seq` holds (`tokens`), unless an entry holds as much already."""
        for key, (held, _) in list(self._entries.items()):
            common = common_prefix(held, tokens)
            if common == len(tokens):  # this entry holds all of the new one
                self._entries.move_to_end(key)
                return
            if common == len(held):
                self._drop(key)  # the new entry holds all of this one
        buffer = sequence_state(ctx, seq, self.limit)
        if buffer is None:
            return
        size = len(buffer)
        while self._entries and self.held + size > self.limit:
            self._drop(next(iter(self._entries)))
        self._entries[next(self._ids)] = (list(tokens), buffer)
        self.held += size
        self.saved += 1

    def load(self, engine: Sequences, key: int, seq: int) -> list[int]:
        """Entry `key` into sequence `seq` (whatever it held is gone); the tokens it now holds
        (none where llama.cpp refused the state, or it did not end where the entry's tokens do)."""
        tokens, buffer = self._entries[key]
        self._entries.move_to_end(key)
        lib = llama()
        memory = engine.memory
        ok = lib.llama_state_seq_set_data(engine.ctx, buffer, len(buffer), seq)
        if not ok or int(lib.llama_memory_seq_pos_max(memory, seq)) != engine.last_position(tokens):
            lib.llama_memory_seq_rm(memory, seq, -1, -1)
            self._drop(key)  # never trusted again
            return []
        self.restored += 1
        return list(tokens)

    def _drop(self, key: int) -> None:
        _, buffer = self._entries.pop(key)
        self.held -= len(buffer)


def sequence_state(ctx: Any, seq: int, most: int | None = None) -> Any:
    """Sequence `seq`'s cells as llama_state_seq_get_data writes them, in a buffer of their size;
    None where that is nothing, more than `most` bytes, or not what llama.cpp said it would write."""
    lib = llama()
    size = int(lib.llama_state_seq_get_size(ctx, seq))
    if size <= 0 or (most is not None and size > most):
        return None
    buffer = (ctypes.c_uint8 * size)()
    return buffer if int(lib.llama_state_seq_get_data(ctx, buffer, size, seq)) == size else None


def copy_sequence(engine: Sequences, source: int, seq: int) -> bool:
    """Sequence `source`'s cells into `seq` (whatever `seq` held is gone), through host memory.
    llama_memory_seq_cp across KV streams copies the whole stream (every cell of every layer: 47 MB
    for SmolLM2's 2,048-cell stream); this copies the source's cells only."""
    lib = llama()
    buffer = sequence_state(engine.ctx, source)
    if buffer is not None and lib.llama_state_seq_set_data(engine.ctx, buffer, len(buffer), seq):
        engine.cells[seq][:] = engine.cells[source]
        return True
    engine.forget(seq)
    return False


@dataclass(frozen=True)
class Found:
    """Where a longer head of a prompt is: another sequence, a RAM entry, or the disk tier."""

    n_tokens: int  # how many of the prompt's tokens it holds
    source: int | None = None  # a sequence
    entry: int | None = None  # a RAM entry
    disk: bool = False


class PrefixStore:
    """The two tiers, either one optional: run and chat keep heads on disk, the server in RAM and on
    disk (read), a batch of lines in neither (its shared head is evaluated once and copied)."""

    def __init__(self, ram: StateCache | None = None, disk: PromptCache | None = None) -> None:
        self.ram = ram
        self.disk = disk

    def find(self, engine: Sequences, tokens: Sequence[int], most: int, beat: int) -> Found | None:
        """The tier entry holding the longest head of `tokens` (at most `most`), if longer than `beat`:
        RAM first (nothing to read), then the disk tier's heads longer still."""
        found = None
        if self.ram is not None and len(self.ram):
            key, n = self.ram.best(tokens, most)
            if key is not None and n > beat:
                found, beat = Found(n, entry=key), n
        if self.disk is not None:
            lengths = self.disk.lengths(engine, tokens[: most + 1], beat)
            if lengths:
                found = Found(lengths[0], disk=True)
        return found

    def load(self, engine: Sequences, tokens: Sequence[int], found: Found, seq: int) -> CacheUse:
        """What `found` holds into sequence `seq` (engine.cells[seq] says what it then holds)."""
        if found.entry is not None and self.ram is not None:
            engine.cells[seq][:] = self.ram.load(engine, found.entry, seq)
            return CacheUse()
        if found.disk and self.disk is not None:
            start = time.perf_counter()
            for n in [found.n_tokens, *self.disk.lengths(engine, tokens[: found.n_tokens], 0)]:
                if self.disk.load(engine, tokens[:n], seq):
                    return CacheUse(loaded_tokens=n, read_s=time.perf_counter() - start)
            return CacheUse(read_s=time.perf_counter() - start)
        return CacheUse()

    def keep(self, engine: Sequences, seq: int, losing: int) -> None:
        """Sequence `seq` is about to lose `losing` of its tokens to a new job: kept in RAM first
        when that is MIN_SAVED or more."""
        if self.ram is not None and losing >= MIN_SAVED:
            self.ram.save(engine.ctx, seq, engine.cells[seq])

    def wants(self, engine: Sequences, head: Sequence[int]) -> bool:
        """Whether a prompt's stable head is worth storing on disk: long enough, and not there yet."""
        return self.disk is not None and len(head) >= MIN_HEAD and not self.disk.holds(engine, head)

    def store(self, engine: Sequences, head: Sequence[int], seq: int) -> CacheUse:
        """Sequence `seq`, which holds exactly `head`, written to the disk tier."""
        return self.disk.store(engine, head, seq) if self.disk is not None else CacheUse()
