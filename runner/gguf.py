"""Bounded GGUF header reader: metadata and tensor infos, never the tensor data.

Reads a local file (FileSource) or a remote one through HTTP range requests (HTTPSource),
so a 40 GB model is judged from the few MB of its header. The checks mirror
gguf_init_from_reader() in the pinned llama.cpp (ggml/src/gguf.cpp): a header accepted
here is one that gguf.cpp accepts too.

Allocation bound: every count is checked against Limits, and against the bytes left in
the source when its size is known, before anything is built from it; lists grow only as
their bytes are read. So parsing costs at most ~12 bytes of memory per header byte
actually present (worst case: arrays of 32-bit ints, each a Python int), plus one 1 MiB
read block and HTTPSource's cache of what it fetched (under twice the header). With
DEFAULT_LIMITS (64 MiB of header) that is under 1 GiB for a hostile file. A real header
costs less (10 MB for SmolLM2's 1.8 MB; the largest vocabularies make ~15 MB headers),
and a corrupt count in a small file costs nothing.
"""

from __future__ import annotations

import json
import os
import re
import stat
import struct
import sys
from array import array
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import accumulate
from math import prod
from operator import mul
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, Protocol
from urllib.parse import urlsplit

from runner import retry
from runner.errors import DownloadError, InvalidModelFile, ModelNotFound

if TYPE_CHECKING:
    import httpx2

GGUF_MAGIC = b"GGUF"
ALIGNMENT_KEY = "general.alignment"
DEFAULT_ALIGNMENT = 32  # GGUF_DEFAULT_ALIGNMENT
MAX_NAME = 64  # GGML_MAX_NAME: a tensor name has at most 63 bytes
READ_BLOCK = 1 << 20
INT64_MAX = (1 << 63) - 1
UINT64_MAX = (1 << 64) - 1

# The ggml types the pinned engine reads (ggml.h, and gguf-py's GGML_QUANT_SIZES of the
# same commit): id -> (name, elements per block, bytes per block). Kept here rather than
# taken from the gguf package, whose import pulls in numpy (~0.2 s) and lags the engine.
# fmt: off
GGML_TYPES: dict[int, tuple[str, int, int]] = {
    0: ("F32", 1, 4),         1: ("F16", 1, 2),         2: ("Q4_0", 32, 18),      3: ("Q4_1", 32, 20),
    6: ("Q5_0", 32, 22),      7: ("Q5_1", 32, 24),      8: ("Q8_0", 32, 34),      9: ("Q8_1", 32, 36),
    10: ("Q2_K", 256, 84),    11: ("Q3_K", 256, 110),   12: ("Q4_K", 256, 144),   13: ("Q5_K", 256, 176),
    14: ("Q6_K", 256, 210),   15: ("Q8_K", 256, 292),   16: ("IQ2_XXS", 256, 66), 17: ("IQ2_XS", 256, 74),
    18: ("IQ3_XXS", 256, 98), 19: ("IQ1_S", 256, 50),   20: ("IQ4_NL", 32, 18),   21: ("IQ3_S", 256, 110),
    22: ("IQ2_S", 256, 82),   23: ("IQ4_XS", 256, 136), 24: ("I8", 1, 1),         25: ("I16", 1, 2),
    26: ("I32", 1, 4),        27: ("I64", 1, 8),        28: ("F64", 1, 8),        29: ("IQ1_M", 256, 56),
    30: ("BF16", 1, 2),       34: ("TQ1_0", 256, 54),   35: ("TQ2_0", 256, 66),   39: ("MXFP4", 32, 17),
    40: ("NVFP4", 64, 36),    41: ("Q1_0", 128, 18),    42: ("Q2_0", 64, 18),
}
# fmt: on

# ggml-cpu/repack.cpp:4925: the weight types the CPU backend repacks into CPU_REPACK on x86-64 with
# AVX2 (Q2_K needs AVX-512). A fact about types, read by the engine (what it loads) and the estimate.
REPACK_TYPES = frozenset({"Q4_0", "Q4_K", "IQ4_NL", "MXFP4"})

# GGUF value types, by id (gguf.h); the fixed-size ones with their struct format.
VALUE_TYPES = ("u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "str", "arr", "u64", "i64", "f64")
_UINT32, _STRING, _ARRAY = 4, 8, 9
_FIXED = {i: struct.Struct("<" + c) for i, c in enumerate("BbHhIif?..Qqd") if c != "."}
_U32, _I32, _U64, _I64 = (struct.Struct(f) for f in ("<I", "<i", "<Q", "<q"))
_CONTENT_RANGE = re.compile(r"bytes (?:(\d+)-\d+|\*)/(\d+|\*)")  # "bytes A-B/N", "bytes */N"


class GGUFError(InvalidModelFile):
    """A file that is not GGUF, or whose header is truncated or corrupt."""


@dataclass(frozen=True)
class Limits:
    """The most a header may declare; each bounds what parsing it can allocate."""

    max_tensors: int = 65_536  # large MoE files have ~3,000
    max_kv: int = 8_192  # models have ~50
    max_string_bytes: int = 16 << 20  # chat templates are tens of KB
    max_array_len: int = 4 << 20  # vocabularies reach 262k tokens, merges ~500k
    max_dims: int = 4  # GGML_MAX_DIMS
    max_header_bytes: int = 64 << 20  # everything before the tensor data; real ones: 2-15 MB


DEFAULT_LIMITS = Limits()


class RangeSource(Protocol):
    """Random access to the bytes of a file, local or remote."""

    name: str  # for messages

    def read_at(self, offset: int, size: int) -> bytes:
        """The bytes at [offset, offset + size); fewer at the end of the file."""
        ...

    @property
    def size(self) -> int | None:
        """The file's total size, when known."""
        ...


class BytesSource:
    """Header bytes already in memory; size_known=False acts like a server that gives no size."""

    def __init__(self, data: bytes, size_known: bool = True, name: str = "<bytes>") -> None:
        self.name = name
        self.data = data
        self.size_known = size_known

    @property
    def size(self) -> int | None:
        return len(self.data) if self.size_known else None

    def read_at(self, offset: int, size: int) -> bytes:
        return self.data[offset : offset + size]


class FileSource:
    """A local file."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.name = str(path)
        try:
            st = self.path.stat()
        except OSError:
            raise ModelNotFound(f"no such file: {self.name}") from None
        if stat.S_ISDIR(st.st_mode):
            raise ModelNotFound(f"no such file: {self.name} (it is a directory)")
        self.size: int = st.st_size
        self.stat = st

    def read_at(self, offset: int, size: int) -> bytes:
        try:
            with self.path.open("rb") as f:
                f.seek(offset)
                return f.read(size)
        except OSError as exc:
            raise GGUFError(f"cannot read {self.name}: {exc.strerror}") from exc


LAZY_STRINGS = 1024  # arrays of at least this many strings are decoded on first use


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
                j = i + 8 + _U64.unpack_from(data, i)[0] if i + 8 <= size else size + 1
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


class HTTPSource:
    """A remote file read with HTTP Range requests, in growing blocks that are cached.

    Uses huggingface_hub's HTTP session (its proxies, offline mode, redirects); a URL on
    the Hub endpoint gets the Hub's headers (HF_TOKEN) unless headers are given.
    """

    def __init__(self, url: str, headers: dict[str, str] | None = None, block_size: int = 1 << 20) -> None:
        self.name = url
        self.url = url
        self.headers = dict(_hub_headers(url) if headers is None else headers)
        self.headers["Accept-Encoding"] = "identity"  # offsets into the file, not into a gzip stream
        self.size: int | None = None  # known from the first response
        self._block = block_size
        self._max_block = 16 * block_size
        self._data = b""  # cached bytes of the file from _start on
        self._start = 0

    def read_at(self, offset: int, size: int) -> bytes:
        if self.size is not None:
            size = max(0, min(size, self.size - offset))
        cached_end = self._start + len(self._data)
        if size and not self._start <= offset <= offset + size <= cached_end:
            # Extend the cache when the read continues it, else start a new one at offset.
            extend = bool(self._data) and self._start <= offset <= cached_end
            begin = cached_end if extend else offset
            chunk = self._fetch(begin, max(offset + size - begin, self._block))
            self._block = min(2 * self._block, self._max_block)
            self._data, self._start = (self._data + chunk, self._start) if extend else (chunk, offset)
        i = offset - self._start
        return self._data[i : i + size]

    def _fetch(self, start: int, length: int) -> bytes:
        """Up to length bytes at start; records the file's size. A transient fault (runner.retry) is
        asked again for the bytes still missing, from where the cut body stopped."""
        import httpx2  # here, as huggingface_hub: ~0.1 s to import, paid only to read a URL
        from huggingface_hub import constants
        from huggingface_hub.errors import HfHubHTTPError
        from huggingface_hub.utils import get_session

        got = bytearray()
        backoff = retry.Backoff()
        transient = retry.transient_errors()
        while True:
            begin, before = start + len(got), len(got)
            headers = {**self.headers, "Range": f"bytes={begin}-{start + length - 1}"}
            timeout = constants.HF_HUB_DOWNLOAD_TIMEOUT
            try:
                with get_session().stream(
                    "GET", self.url, headers=headers, timeout=timeout, follow_redirects=True
                ) as resp:
                    retry.check_status(resp)
                    skip = self._body_skip(resp, begin)
                    for chunk in resp.iter_bytes():
                        if skip:  # a server that ignored Range sends the file from its start
                            cut = min(skip, len(chunk))
                            chunk, skip = chunk[cut:], skip - cut
                        got += chunk
                        if len(got) >= length:
                            break
                return bytes(got[:length])
            except transient as exc:
                if not backoff.again(exc, progressed=len(got) > before):
                    raise DownloadError(f"cannot read {self.name}: {exc or type(exc).__name__}") from exc
            except HfHubHTTPError:  # gated, a refused token: the hub layer says what to do
                raise
            except (httpx2.HTTPError, OSError) as exc:  # OSError includes the Hub's offline mode
                raise DownloadError(f"cannot read {self.name}: {exc}") from exc

    def _body_skip(self, resp: httpx2.Response, start: int) -> int:
        """Record the file's size; return how many body bytes come before start."""
        status = resp.status_code
        match = _CONTENT_RANGE.fullmatch(resp.headers.get("Content-Range", ""))
        total = int(match[2]) if match and match[2] != "*" else None
        if status == 206 and match and match[1] is not None and int(match[1]) == start:
            self.size = total
            return 0
        if status == 416:  # the range starts at or past the end: skip the whole body
            self.size = total
            return UINT64_MAX
        if status == 200:  # Range ignored: the body is the whole file
            length = resp.headers.get("Content-Length", "")
            self.size = int(length) if length.isdigit() else None
            return start
        if status == 404:
            raise ModelNotFound(f"no such file: {self.name} (HTTP 404)")
        if status in (401, 403):  # huggingface_hub's own errors (gated, ...): the hub layer words them
            from huggingface_hub.utils import hf_raise_for_status

            resp.read()
            hf_raise_for_status(resp)
        bad_range = " with a bad Content-Range" if status == 206 else ""
        raise DownloadError(f"cannot read {self.name}: HTTP {status} {resp.reason_phrase}{bad_range}")


def _hub_headers(url: str) -> dict[str, str]:
    """The Hub's headers (user agent, token) for a URL on the Hub endpoint, else none."""
    from huggingface_hub import constants
    from huggingface_hub.utils import build_hf_headers

    return build_hf_headers() if urlsplit(url).netloc == urlsplit(constants.ENDPOINT).netloc else {}


@dataclass(frozen=True, slots=True)
class TensorInfo:
    """One tensor as the header describes it; shape in ggml order (shape[0] is a row)."""

    name: str
    shape: tuple[int, ...]
    ggml_type: int
    offset: int  # relative to the start of the data section

    @property
    def nbytes(self) -> int:
        _, block, type_size = GGML_TYPES[self.ggml_type]
        return prod(self.shape) // block * type_size

    @property
    def type_name(self) -> str:
        return GGML_TYPES[self.ggml_type][0]


@dataclass(frozen=True)
class GGUFHeader:
    """Everything before the tensor data: metadata, tensor infos and layout."""

    source: str
    version: int
    metadata: dict[str, Any]
    tensors: tuple[TensorInfo, ...]
    alignment: int
    data_offset: int  # absolute offset where the tensor data begins
    file_size: int | None

    def get(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(key, default)

    @property
    def architecture(self) -> str | None:
        return self.metadata.get("general.architecture")

    def arch_get(self, suffix: str, default: Any = None) -> Any:
        """The architecture's own key, e.g. arch_get("block_count") is llama.block_count."""
        if self.architecture is None:
            return default
        return self.metadata.get(f"{self.architecture}.{suffix}", default)

    @property
    def data_size(self) -> int:
        """Where the last tensor's data ends, relative to data_offset."""
        return max((t.offset + t.nbytes for t in self.tensors), default=0)

    @property
    def expected_file_size(self) -> int:
        return self.data_offset + self.data_size

    def check_complete(self) -> None:
        """Raise GGUFError when the file is shorter than its header says."""
        if self.file_size is not None and self.file_size < self.expected_file_size:
            raise GGUFError(
                f"{self.source} is truncated: its header expects {self.expected_file_size} bytes, "
                f"file has {self.file_size}"
            )

    def tensor(self, name: str) -> TensorInfo | None:
        return next((t for t in self.tensors if t.name == name), None)


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

    def known(self, start: int, n: int, reader: _Reader) -> int | None:
        """The end of the n-string array at start, when remembered and the file still agrees."""
        entry = self.arrays.get(start)
        if entry is None or entry[0] != n or not start <= entry[1] <= entry[2] - 8:
            return None
        _, last, end = entry
        if end > reader.limits.max_header_bytes or not reader.fill(end - start):
            return None
        buf, base = reader.buf, reader.start
        first = _U64.unpack_from(buf, start - base)[0]
        tail = _U64.unpack_from(buf, last - base)[0]
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


class _Reader:
    """Sequential little-endian reads from a RangeSource, in blocks, within the header limit."""

    def __init__(self, source: RangeSource, limits: Limits, walks: Walks | None = None) -> None:
        self.source = source
        self.limits = limits
        self.buf = b""  # the bytes of the source from start on
        self.start = 0
        self.pos = 0  # the next byte to read
        self.walks = walks  # long string arrays' bounds, remembered from an earlier read of this file

    def fail(self, what: str, kind: str = "corrupt") -> NoReturn:
        raise GGUFError(f"{self.source.name} is {kind}: {what}")

    def fill(self, n: int) -> bool:
        """Have buf hold the n bytes at pos, reading a block more if needed; False at EOF."""
        if self.start + len(self.buf) - self.pos >= n:
            return True
        tail = self.buf[self.pos - self.start :]
        room = self.limits.max_header_bytes - self.pos - len(tail)
        more = self.source.read_at(self.pos + len(tail), min(max(n - len(tail), READ_BLOCK), room))
        self.buf, self.start = tail + more, self.pos
        return len(self.buf) >= n

    def take(self, n: int, what: str) -> int:
        """Consume the n bytes of `what`; return where they start in buf."""
        if self.pos + n > self.limits.max_header_bytes:
            limit = self.limits.max_header_bytes
            self.fail(f"{what} at byte {self.pos} runs past the header limit of {limit} bytes")
        if not self.fill(n):
            end = self.start + len(self.buf)
            self.fail(f"{what} at byte {self.pos} needs {n} bytes, the file ends at byte {end}", "truncated")
        self.pos += n
        return self.pos - n - self.start

    def unpack(self, fmt: struct.Struct, what: str) -> Any:
        i = self.take(fmt.size, what)  # before reading self.buf: take may replace it
        return fmt.unpack_from(self.buf, i)[0]

    def count(self, n: int, limit: int, item_bytes: int, what: str, at: int) -> int:
        """Check a count read at byte `at` against its limit and the bytes left."""
        if n < 0:
            self.fail(f"{what} {n} at byte {at} is negative")
        if n > limit:
            self.fail(f"{what} {n} at byte {at} exceeds the limit of {limit}")
        size = self.source.size
        if size is not None and n * item_bytes > size - self.pos:
            needs = f"{what} {n} at byte {at} needs {n * item_bytes} bytes, only {size - self.pos} remain"
            self.fail(needs, "truncated or corrupt")
        return n

    def string(self, limit: int, what: str) -> str:
        at = self.pos
        n = self.count(self.unpack(_U64, f"{what} length"), limit, 1, f"{what} length", at)
        i = self.take(n, what)
        return self.buf[i : i + n].decode("utf-8", "replace")

    def strings(self, n: int) -> Sequence[str]:
        """n strings. A long array wholly in buf (a vocabulary: ~50-150k tokens and merges) is walked
        for its lengths only and kept as bytes, decoded when something reads it (LazyStrings): the
        plan needs its length, not 100k decoded strings on every start. Else one by one."""
        if n >= LAZY_STRINGS:
            lazy = self._lazy_strings(n)
            if lazy is not None:
                return lazy
        out: list[str] = []
        limit = self.limits.max_string_bytes
        while len(out) < n:
            buf, i = self.buf, self.pos - self.start
            while len(out) < n and i + 8 <= len(buf):
                j = i + 8 + _U64.unpack_from(buf, i)[0]
                if j > len(buf) or j - i - 8 > limit:
                    break
                out.append(buf[i + 8 : j].decode("utf-8", "replace"))
                i = j
            self.pos = self.start + i
            if len(out) < n:
                out.append(self.string(limit, "string"))
        return out

    def _lazy_strings(self, n: int) -> LazyStrings | None:
        """The n strings at pos as LazyStrings, reading more blocks as the walk needs them (an array
        larger than a block is the rule: SmolLM2's 49k tokens take ~0.5 MB); None where one string is
        over the limit or the file ends: the slow path then fails with the right message."""
        unpack, limit = _U64.unpack_from, self.limits.max_string_bytes
        known = self.walks.known(self.pos, n, self) if self.walks is not None else None
        if known is not None:
            data = bytes(self.buf[self.pos - self.start : known - self.start])
            self.pos = known
            return LazyStrings(data, n)
        start, at, k, last = self.pos, self.pos, 0, self.pos  # in the file: the walk, the last string walked
        while k < n:
            buf, base = self.buf, self.start
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
                need = at - self.pos + 8 + (unpack(buf, i)[0] if i + 8 <= size else 0)
                if self.pos + need > self.limits.max_header_bytes or not self.fill(need):
                    return None
        data = bytes(self.buf[self.pos - self.start : at - self.start])
        self.pos = at
        if self.walks is not None:
            self.walks.walked(start, n, last, at)
        return LazyStrings(data, n)

    def value(self, vtype: int, key: str) -> Any:
        """The value of `key`, of GGUF type vtype."""
        limits = self.limits
        if vtype == _STRING:
            return self.string(limits.max_string_bytes, "string")
        if vtype in _FIXED:
            return self.unpack(_FIXED[vtype], f"value of {key!r}")
        if vtype != _ARRAY:
            self.fail(f"key {key!r} has invalid GGUF type {vtype}")
        etype = self.unpack(_I32, f"array type of {key!r}")
        at = self.pos
        n = self.unpack(_U64, f"array length of {key!r}")
        if etype == _STRING:
            return self.strings(self.count(n, limits.max_array_len, 8, "array length", at))
        if etype not in _FIXED:
            nested = " (llama.cpp reads no nested arrays)" if etype == _ARRAY else ""
            self.fail(f"key {key!r} is an array of invalid GGUF type {etype}{nested}")
        fmt = _FIXED[etype]
        nbytes = self.count(n, limits.max_array_len, fmt.size, "array length", at) * fmt.size
        i = self.take(nbytes, f"array {key!r}")
        return _numbers(fmt.format[-1], memoryview(self.buf)[i : i + nbytes])

    def tensor_info(self, seen: set[str]) -> TensorInfo:
        at = self.pos
        name = self.string(MAX_NAME - 1, "tensor name")
        if name in seen:
            self.fail(f"duplicate tensor name {name!r} at byte {at}")
        seen.add(name)
        n_dims = self.unpack(_U32, f"dimension count of {name!r}")
        if n_dims > self.limits.max_dims:
            self.fail(f"tensor {name!r} has {n_dims} dimensions, more than {self.limits.max_dims}")
        i = self.take(8 * n_dims, f"shape of {name!r}")
        shape = struct.unpack_from(f"<{n_dims}q", self.buf, i)
        if min(shape, default=0) < 0:
            self.fail(f"tensor {name!r} has a negative dimension: {shape}")
        # Like gguf.cpp: no running product of the dimensions may pass INT64_MAX.
        if max(accumulate(shape, mul), default=0) > INT64_MAX:
            self.fail(f"tensor {name!r} of shape {shape} has more than 2**63 - 1 elements")
        ggml_type = self.unpack(_I32, f"type of {name!r}")
        if ggml_type not in GGML_TYPES:
            self.fail(f"tensor {name!r} has unknown ggml type {ggml_type}")
        type_name, block, _ = GGML_TYPES[ggml_type]
        row = shape[0] if shape else 1
        if row % block:
            self.fail(
                f"tensor {name!r} of type {type_name} has {row} elements per row, "
                f"not a multiple of its block size {block}"
            )
        return TensorInfo(name, shape, ggml_type, self.unpack(_U64, f"data offset of {name!r}"))


def _numbers(code: str, raw: memoryview) -> list[Any]:
    """An array of fixed-size little-endian values, decoded in one go."""
    if code == "?":
        return [b != 0 for b in raw]
    values = array(code)
    values.frombytes(raw)
    if sys.byteorder == "big":
        values.byteswap()
    if values.itemsize > 2 or code == "B":
        return values.tolist()
    seen: dict[int, int] = {}  # equal small ints share one object: 8 bytes an element, not 36
    return [seen.setdefault(v, v) for v in values]


def _pad(n: int, alignment: int) -> int:
    return -(-n // alignment) * alignment


def _check_version(name: str, version: int) -> None:
    if version == 0:
        raise GGUFError(f"{name} is corrupt: GGUF version 0")
    if version & 0xFFFF == 0:  # a version written big-endian: 3 reads as 0x03000000
        raise GGUFError(
            f"{name} is a big-endian GGUF file; llama.cpp reads little-endian ones "
            "(convert it with gguf-convert-endian)"
        )
    if version == 1:
        raise GGUFError(f"{name} is GGUF version 1, which llama.cpp no longer reads")
    if version > 3:
        raise GGUFError(f"{name} is GGUF version {version}; llama.cpp reads versions 2 and 3")


def _open(source: str | os.PathLike[str] | RangeSource) -> RangeSource:
    if isinstance(source, str) and source.startswith(("http://", "https://")):
        return HTTPSource(source)
    if isinstance(source, (str, os.PathLike)):
        return FileSource(source)
    return source


def read_header(
    source: str | os.PathLike[str] | RangeSource, *, limits: Limits = DEFAULT_LIMITS
) -> GGUFHeader:
    """Read and check a GGUF header: a path, an http(s) URL or any RangeSource."""
    src = _open(source)
    walks = Walks(src) if isinstance(src, FileSource) else None
    r = _Reader(src, limits, walks)
    if not r.fill(4) or r.buf[:4] != GGUF_MAGIC:
        raise GGUFError(f"{src.name} is not a GGUF file")
    r.pos = 4
    version = r.unpack(_U32, "version")
    _check_version(src.name, version)
    # Each KV takes at least 14 bytes (a 1-byte key and value), each tensor info 24.
    n_tensors = r.count(r.unpack(_I64, "tensor count"), limits.max_tensors, 24, "tensor count", 8)
    n_kv = r.count(r.unpack(_I64, "key-value count"), limits.max_kv, 14, "key-value count", 16)

    metadata: dict[str, Any] = {}
    for _ in range(n_kv):
        at = r.pos
        key = r.string(limits.max_string_bytes, "key")
        if not key:
            r.fail(f"empty key at byte {at}")
        if key in metadata:
            r.fail(f"duplicate key {key!r} at byte {at}")
        vtype = r.unpack(_I32, f"type of {key!r}")
        metadata[key] = r.value(vtype, key)
        if key == ALIGNMENT_KEY and vtype != _UINT32:
            r.fail(f"{ALIGNMENT_KEY} must be of type u32, is {VALUE_TYPES[vtype]}")
    alignment = metadata.get(ALIGNMENT_KEY, DEFAULT_ALIGNMENT)
    if alignment == 0 or alignment & (alignment - 1):
        r.fail(f"{ALIGNMENT_KEY} {alignment} is not a power of two")

    seen: set[str] = set()
    tensors = tuple(r.tensor_info(seen) for _ in range(n_tensors))
    # With tensors, the data section starts at the next multiple of the alignment.
    data_offset = _pad(r.pos, alignment) if tensors else r.pos
    if src.size is not None and data_offset > src.size:
        r.fail(f"tensor data starts at byte {data_offset}, file has {src.size}", "truncated")
    expected = 0
    for t in tensors:
        if t.offset != expected:
            r.fail(f"tensor {t.name!r} has data offset {t.offset}, expected {expected}")
        expected += _pad(t.nbytes, alignment)
        if expected > UINT64_MAX:
            r.fail(f"tensor data overflows 64 bits at tensor {t.name!r}")
    if walks is not None:
        walks.save()  # only a header that passed every check
    return GGUFHeader(src.name, version, metadata, tensors, alignment, data_offset, src.size)
