"""A prompt cache on disk: the evaluated KV state of a prompt's stable head, loaded instead of prefilled.

Shell loops call runner again and again with the same head (a long system prompt, a document on
stdin) and a different question. The head's state (llama_state_seq_get_data, written by runner) is
kept in one file per head, named by what it must match:

    {identity}-{n_tokens}-{tokens}.kv   identity: the model file (path, size, mtime), the KV cache type,
                                        flash attention, GPU offload, the llama.cpp library file;
                                        tokens: a hash of the head's token ids

so a different model, quant, cache type or llama.cpp build never matches. A file is
MAGIC, a version, a JSON header (identity, token hash, payload size and BLAKE2b checksum), then the
payload; all of it is checked before llama.cpp reads a byte, and a file that fails (truncated,
corrupt, foreign) is deleted, never loaded. Writes go to a temporary file renamed into place, so two
processes writing one entry at once leave one whole file and a reader never sees half of one. Reads
refresh a file's mtime; past the size limit the least recently used files go (LRU).

Any error of the cache's folder (unwritable, full) turns the cache off for the call with one
warning: the answer never depends on it.
"""

from __future__ import annotations

import array
import contextlib
import hashlib
import json
import os
import struct
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from runner import limits

if TYPE_CHECKING:
    from runner.engine.context import Context

MAGIC = b"RUNNERKV"
VERSION = 1
_HEAD = struct.Struct("<8sII")  # magic, version, JSON length
# Heads shorter than this are not stored. Measured (scripts/bench_speed.py, SmolLM2, 2 cores): loading
# a stored head takes 6 ms at 32 tokens, 9 ms at 64, 28 ms at 256, 59 ms at 1,024, against prefills of
# 0.2, 0.4, 1.5 and 6.0 s, so any head pays once it is used again; the floor keeps the few-token heads
# of plain one-shot prompts (a template's system line) from writing an entry per call for ~0.1 s.
MIN_HEAD = 64
DEFAULT_LIMIT = 2_000_000_000  # bytes on disk (--prompt-cache-size): 2 GB, as runner prints sizes


@dataclass(frozen=True)
class CacheUse:
    """What the cache did for one prompt."""

    loaded_tokens: int = 0  # tokens whose state came from disk
    stored_tokens: int = 0  # tokens whose state was written (a cold head)
    write_s: float = 0.0
    read_s: float = 0.0


def folder() -> Path:
    from runner.paths import cache_dir

    return cache_dir() / "prompts"


def parse_size(text: str) -> int:
    """--prompt-cache-size (runner.limits.parse_size)."""
    return limits.parse_size(text, "--prompt-cache-size")


def _token_hash(tokens: Sequence[int]) -> str:
    try:
        data = array.array("i", tokens).tobytes()
    except OverflowError:  # an image's pseudo-tokens (runner.engine.vision): 64-bit; never stored
        data = array.array("q", tokens).tobytes()
    return hashlib.blake2b(data, digest_size=16).hexdigest()


def text_head(tokens: Sequence[int]) -> int:
    """How many of the tokens come before the first image's positions (negative pseudo-tokens: see
    runner.engine.vision). Only such a head is kept on disk: an image's state depends on the projector
    that encoded it, which the identity does not name."""
    return next((i for i, t in enumerate(tokens) if t < 0), len(tokens))


class PromptCache:
    def __init__(self, path: Path, limit: int, warn: Callable[[str], None]) -> None:
        self.path = path
        self.limit = limit
        self._warn = warn
        self.off = limit <= 0

    def _failed(self, what: str, exc: OSError) -> None:
        if not self.off:
            self._warn(f"the prompt cache is off for this call: {what} {self.path}: {exc.strerror or exc}")
        self.off = True

    @staticmethod
    def identity(context: Context) -> str:
        from runner.engine.llamacpp import library_file

        model = context.model.path.resolve()
        lib = library_file()
        facts = {
            "model": [str(model), *_stat(model)],
            "kv": context.kv_type,
            "flash_attn": context.flash_attn,
            "gpu": context.model.n_gpu_layers != 0,
            "streams": context.state_streams,  # 1: loads into a context of any number of sequences
            "llama.cpp": [str(lib), *_stat(lib)] if lib else None,
            "format": VERSION,
        }
        return hashlib.blake2b(json.dumps(facts, sort_keys=True).encode(), digest_size=8).hexdigest()

    def _file(self, identity: str, tokens: Sequence[int]) -> Path:
        return self.path / f"{identity}-{len(tokens)}-{_token_hash(tokens)}.kv"

    # -- reading ------------------------------------------------------------------------------------

    def holds(self, context: Context, tokens: Sequence[int]) -> bool:
        """Whether an entry for exactly these tokens is stored (not whether it is sound)."""
        return not self.off and self._file(self.identity(context), tokens).is_file()

    def restore(self, context: Context, prompt: Sequence[int], seq: int = 0) -> CacheUse:
        """Load into sequence `seq` the longest stored head of `prompt` that is longer than what the
        sequence already shares with it (and leaves at least the last prompt token to evaluate)."""
        start = time.perf_counter()
        shared = context.shared_prefix(prompt, seq)
        for n in self.lengths(context, prompt, shared):
            if self.load(context, prompt[:n], seq):
                return CacheUse(loaded_tokens=n, read_s=time.perf_counter() - start)
        return CacheUse(read_s=time.perf_counter() - start)

    def lengths(self, context: Context, prompt: Sequence[int], beat: int) -> list[int]:
        """The lengths of the stored heads of `prompt` longer than `beat` (and shorter than the
        prompt), longest first: what load() may find."""
        if self.off:
            return []
        identity = self.identity(context)
        try:
            names = {p.name for p in self.path.glob(f"{identity}-*.kv")} if self.path.is_dir() else set()
        except OSError as exc:
            self._failed("cannot read", exc)
            return []
        lengths = sorted({int(n.split("-")[1]) for n in names if n.count("-") == 2}, reverse=True)
        text = text_head(prompt)
        return [
            n
            for n in lengths
            if beat < n < len(prompt) and n <= text and self._file(identity, prompt[:n]).name in names
        ]

    def load(self, context: Context, tokens: Sequence[int], seq: int = 0) -> bool:
        """The stored state of exactly `tokens` into sequence `seq`; False (and the file deleted) where
        it fails a check or llama.cpp refuses it."""
        identity = self.identity(context)
        file = self._file(identity, tokens)
        payload = self._read(file, identity, tokens)
        if payload is not None and context.load_state(payload, tokens, seq):
            with contextlib.suppress(OSError):
                os.utime(file)  # recently used
            return True
        _discard(file)  # it failed a check, or llama.cpp refused it: never again
        return False

    def _read(self, file: Path, identity: str, tokens: Sequence[int]) -> bytes | None:
        try:
            data = file.read_bytes()
        except OSError:
            return None
        if len(data) < _HEAD.size:
            return None
        magic, version, size = _HEAD.unpack_from(data)
        if magic != MAGIC or version != VERSION or _HEAD.size + size > len(data):
            return None
        try:
            meta = json.loads(data[_HEAD.size : _HEAD.size + size])
        except ValueError:
            return None
        payload = data[_HEAD.size + size :]
        ok = (
            isinstance(meta, dict)
            and meta.get("identity") == identity
            and meta.get("tokens") == _token_hash(tokens)
            and meta.get("n_tokens") == len(tokens)
            and meta.get("payload_bytes") == len(payload)
            and meta.get("payload_blake2b") == hashlib.blake2b(payload).hexdigest()
        )
        return payload if ok else None

    # -- writing ------------------------------------------------------------------------------------

    def store(self, context: Context, tokens: Sequence[int], seq: int = 0) -> CacheUse:
        """Write the state of sequence `seq`, which holds exactly `tokens`; evict past the limit. Not
        where they hold an image (text_head)."""
        if self.off or text_head(tokens) < len(tokens):
            return CacheUse()
        start = time.perf_counter()
        identity = self.identity(context)
        payload = context.state_bytes(seq)
        meta = json.dumps(
            {
                "identity": identity,
                "n_tokens": len(tokens),
                "tokens": _token_hash(tokens),
                "payload_bytes": len(payload),
                "payload_blake2b": hashlib.blake2b(payload).hexdigest(),
                "model": str(context.model.path),
            }
        ).encode()
        if _HEAD.size + len(meta) + len(payload) > self.limit:
            return CacheUse()  # larger than the whole cache: not worth evicting everything for
        file = self._file(identity, tokens)
        temp = file.with_name(f".{file.name}.{os.getpid()}.{time.monotonic_ns()}.tmp")
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            with open(temp, "wb") as out:
                out.write(_HEAD.pack(MAGIC, VERSION, len(meta)))
                out.write(meta)
                out.write(payload)
            os.replace(temp, file)  # whole, or not there: a reader never sees half a file
        except OSError as exc:
            _discard(temp)
            self._failed("cannot write to", exc)
            return CacheUse()
        self.evict()
        return CacheUse(stored_tokens=len(tokens), write_s=time.perf_counter() - start)

    def evict(self) -> None:
        """Remove the least recently used entries until the cache is within its limit."""
        entries = []
        for f in _entries(self.path):
            with contextlib.suppress(OSError):
                st = f.stat()
                entries.append((st.st_mtime, st.st_size, f))
        total = sum(size for _, size, _ in entries)
        for _, size, f in sorted(entries, key=lambda e: e[0]):
            if total <= self.limit:
                break
            _discard(f)
            total -= size


def usage(path: Path) -> tuple[int, int]:
    """(entries, bytes) of the cache at path."""
    files = list(_entries(path))
    return len(files), sum(_size(f) for f in files)


def clear(path: Path) -> tuple[int, int]:
    """Remove every entry; returns what was removed, as usage() counts it."""
    removed = usage(path)
    for f in _entries(path):
        _discard(f)
    if path.is_dir():
        for stale in path.glob(".*.tmp"):  # a write that a killed process never finished
            _discard(stale)
    return removed


def _entries(path: Path) -> list[Path]:
    try:
        return list(path.glob("*.kv")) if path.is_dir() else []
    except OSError:
        return []


def _size(f: Path) -> int:
    try:
        return f.stat().st_size
    except OSError:
        return 0


def _stat(path: Path) -> tuple[int, int]:
    try:
        st = path.stat()
    except OSError:
        return (0, 0)
    return (st.st_size, st.st_mtime_ns)


def _discard(f: Path) -> None:
    with contextlib.suppress(OSError):
        f.unlink()
