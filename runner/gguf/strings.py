"""Long string arrays (a vocabulary's tokens and merges) kept as their bytes: LazyStrings decodes
them on first use, lazy_strings walks the length prefixes to find where such an array ends, and
Walks remembers those ends on disk for a local file, so a start need not walk ~100k prefixes again.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence
from typing import Any, Protocol

from runner.gguf.header import U64, GGUFError, Limits
from runner.gguf.sources import FileSource

LAZY_STRINGS = 1024  # arrays of at least this many strings are decoded on first use


class Window(Protocol):
    """What the walk needs of the reader (runner.gguf.reader): its bytes of the source from start on,
    the next byte's position, its limits, fill(n) to have the n bytes at pos, and this file's walks."""

    limits: Limits
    buf: bytes
    start: int
    pos: int
    walks: Walks | None

    def fill(self, n: int) -> bool: ...


class LazyStrings(Sequence[str]):
    """A GGUF string array as its raw bytes (u64 length, then the bytes, for each), decoded on first use."""

    def __init__(self, data: bytes, n: int) -> None:
        self._data: bytes | None = data
        self._n = n
        self._items: list[str] | None = None

    def _decoded(self) -> list[str]:
        if self._items is None:
            assert self._data is not None
            data, out, i, size = self._data, [], 0, len(self._data)
            for _ in range(self._n):
                j = i + 8 + U64.unpack_from(data, i)[0] if i + 8 <= size else size + 1
                if j > size:
                    break
                out.append(data[i + 8 : j].decode("utf-8", "replace"))
                i = j
            if len(out) != self._n or i != size:  # bounds from a walk remembered for a file since changed
                raise GGUFError(
                    f"a string array of {self._n} does not fill its {size} bytes: the file changed"
                )
            self._items, self._data = out, None
        return self._items

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, index: Any) -> Any:
        return self._decoded()[index]

    def __iter__(self) -> Iterator[str]:
        return iter(self._decoded())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (LazyStrings, list, tuple)):
            return list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"LazyStrings({self._n} strings)"


def lazy_strings(reader: Window, n: int) -> LazyStrings | None:
    """The n strings at the reader's pos as LazyStrings, reading more blocks as the walk needs them (an
    array larger than a block is the rule: SmolLM2's 49k tokens take ~0.5 MB); None for fewer than
    LAZY_STRINGS, or where one string is over the limit or the file ends: the reader then reads them
    one by one, and fails with the right message."""
    if n < LAZY_STRINGS:
        return None
    unpack, limit = U64.unpack_from, reader.limits.max_string_bytes
    known = reader.walks.known(reader.pos, n, reader) if reader.walks is not None else None
    if known is not None:
        data = bytes(reader.buf[reader.pos - reader.start : known - reader.start])
        reader.pos = known
        return LazyStrings(data, n)
    start = at = last = reader.pos  # in the file: the walk's start, where it is, the last string walked
    k = 0
    while k < n:
        buf, base = reader.buf, reader.start
        i, size, mark = at - base, len(buf), -1
        while k < n and i + 8 <= size:
            length = unpack(buf, i)[0]
            if length > limit:
                return None
            if i + 8 + length > size:
                break
            mark, i, k = i, i + 8 + length, k + 1
        at = base + i
        if mark >= 0:
            last = base + mark
        if k < n:
            need = at - reader.pos + 8 + (unpack(buf, i)[0] if i + 8 <= size else 0)
            if reader.pos + need > reader.limits.max_header_bytes or not reader.fill(need):
                return None
    data = bytes(reader.buf[reader.pos - reader.start : at - reader.start])
    reader.pos = at
    if reader.walks is not None:
        reader.walks.walked(start, n, last, at)
    return LazyStrings(data, n)


class Walks:
    """Where a local file's long string arrays end, remembered on disk: finding the end of SmolLM2's
    49k tokens and 49k merges means reading ~100k length prefixes in a Python loop, ~0.05 s of every
    start. Keyed by the file's device, inode, size and modification and change times, so a file
    written again is walked again. A remembered end is still checked against the file before it is
    used (the first string fits, the last string ends exactly there) and LazyStrings checks the whole
    chain when it decodes, so a stale entry can only cost a walk or fail as a changed file, never
    give other strings. An unreadable or unwritable cache is no cache."""

    VERSION = 1

    def __init__(self, source: FileSource) -> None:
        import hashlib

        from runner.paths import cache_dir

        st = source.stat
        key = f"{Walks.VERSION}:{os.path.realpath(source.path)}:{st.st_dev}:{st.st_ino}:{st.st_size}"
        key += f":{st.st_mtime_ns}:{st.st_ctime_ns}"
        self.path = cache_dir() / "headers" / f"{hashlib.sha256(key.encode()).hexdigest()[:32]}.json"
        self.arrays: dict[int, tuple[int, int, int]] = {}  # start -> (n, last string's start, end)
        self.changed = False
        try:
            for start, n, last, end in json.loads(self.path.read_text())["arrays"]:
                self.arrays[int(start)] = (int(n), int(last), int(end))
        except (OSError, ValueError, KeyError, TypeError):
            self.arrays = {}

    def known(self, start: int, n: int, reader: Window) -> int | None:
        """The end of the n-string array at start, when remembered and the file still agrees."""
        entry = self.arrays.get(start)
        if entry is None or entry[0] != n or not start <= entry[1] <= entry[2] - 8:
            return None
        _, last, end = entry
        if end > reader.limits.max_header_bytes or not reader.fill(end - start):
            return None
        buf, base = reader.buf, reader.start
        first = U64.unpack_from(buf, start - base)[0]
        tail = U64.unpack_from(buf, last - base)[0]
        if start + 8 + first > end or last + 8 + tail != end or tail > reader.limits.max_string_bytes:
            return None
        return end

    def walked(self, start: int, n: int, last: int, end: int) -> None:
        self.arrays[start] = (n, last, end)
        self.changed = True

    def save(self) -> None:
        if not self.changed:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_suffix(f".{os.getpid()}.tmp")
            rows = [[start, *entry] for start, entry in sorted(self.arrays.items())]
            tmp.write_text(json.dumps({"arrays": rows}))
            os.replace(tmp, self.path)
        except OSError:
            pass
