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

import itertools
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from runner.engine.cells import common_prefix
from runner.engine.context import Context
from runner.engine.promptcache import MIN_HEAD, CacheUse, PromptCache

MIN_SAVED = 16  # a sequence losing fewer tokens than this to a new job is not kept in RAM


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

    def save(self, context: Context, seq: int, tokens: Sequence[int]) -> None:
        """Keep what sequence `seq` holds (`tokens`), unless an entry holds as much already."""
        for key, (held, _) in list(self._entries.items()):
            common = common_prefix(held, tokens)
            if common == len(tokens):  # this entry holds all of the new one
                self._entries.move_to_end(key)
                return
            if common == len(held):
                self._drop(key)  # the new entry holds all of this one
        buffer = context.sequence_state(seq, self.limit)
        if buffer is None:
            return
        size = len(buffer)
        while self._entries and self.held + size > self.limit:
            self._drop(next(iter(self._entries)))
        self._entries[next(self._ids)] = (list(tokens), buffer)
        self.held += size
        self.saved += 1

    def load(self, context: Context, key: int, seq: int) -> bool:
        """Entry `key` into sequence `seq` (whatever it held is gone): False where llama.cpp refused the
        state, or it did not end where the entry's tokens do (the entry is then dropped)."""
        tokens, buffer = self._entries[key]
        self._entries.move_to_end(key)
        if not context.set_state(buffer, tokens, seq):
            self._drop(key)  # never trusted again
            return False
        self.restored += 1
        return True

    def _drop(self, key: int) -> None:
        _, buffer = self._entries.pop(key)
        self.held -= len(buffer)


def copy_sequence(context: Context, source: int, seq: int) -> bool:
    """Sequence `source`'s cells into `seq` (whatever `seq` held is gone), through host memory.
    llama_memory_seq_cp across KV streams copies the whole stream (every cell of every layer: 47 MB
    for SmolLM2's 2,048-cell stream); this copies the source's cells only."""
    return context.set_state(context.sequence_state(source), list(context.cells[source]), seq)


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

    def find(self, context: Context, tokens: Sequence[int], most: int, beat: int) -> Found | None:
        """The tier entry holding the longest head of `tokens` (at most `most`), if longer than `beat`:
        RAM first (nothing to read), then the disk tier's heads longer still."""
        found = None
        if self.ram is not None and len(self.ram):
            key, n = self.ram.best(tokens, most)
            if key is not None and n > beat:
                found, beat = Found(n, entry=key), n
        if self.disk is not None:
            lengths = self.disk.lengths(context, tokens[: most + 1], beat)
            if lengths:
                found = Found(lengths[0], disk=True)
        return found

    def load(self, context: Context, tokens: Sequence[int], found: Found, seq: int) -> CacheUse:
        """What `found` holds into sequence `seq` (context.cells[seq] says what it then holds)."""
        if found.entry is not None and self.ram is not None:
            self.ram.load(context, found.entry, seq)
            return CacheUse()
        if found.disk and self.disk is not None:
            start = time.perf_counter()
            for n in [found.n_tokens, *self.disk.lengths(context, tokens[: found.n_tokens], 0)]:
                if self.disk.load(context, tokens[:n], seq):
                    return CacheUse(loaded_tokens=n, read_s=time.perf_counter() - start)
            return CacheUse(read_s=time.perf_counter() - start)
        return CacheUse()

    def keep(self, context: Context, seq: int, losing: int) -> None:
        """Sequence `seq` is about to lose `losing` of its tokens to a new job: kept in RAM first
        when that is MIN_SAVED or more."""
        if self.ram is not None and losing >= MIN_SAVED:
            self.ram.save(context, seq, context.cells[seq])

    def wants(self, context: Context, head: Sequence[int]) -> bool:
        """Whether a prompt's stable head is worth storing on disk: long enough, and not there yet."""
        return self.disk is not None and len(head) >= MIN_HEAD and not self.disk.holds(context, head)

    def store(self, context: Context, head: Sequence[int], seq: int) -> CacheUse:
        """Sequence `seq`, which holds exactly `head`, written to the disk tier."""
        return self.disk.store(context, head, seq) if self.disk is not None else CacheUse()
