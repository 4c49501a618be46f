"""read_header and its bounded _Reader: metadata and tensor infos, never the tensor data. The checks
mirror gguf_init_from_reader() in the pinned llama.cpp (ggml/src/gguf.cpp): a header accepted here is
one that gguf.cpp accepts too.

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

import os
import struct
import sys
from array import array
from collections.abc import Sequence
from itertools import accumulate
from operator import mul
from typing import Any, NoReturn

from runner.gguf.header import (
    ALIGNMENT_KEY,
    DEFAULT_ALIGNMENT,
    DEFAULT_LIMITS,
    GGML_TYPES,
    GGUF_MAGIC,
    INT64_MAX,
    MAX_NAME,
    U64,
    UINT64_MAX,
    GGUFError,
    GGUFHeader,
    Limits,
    TensorInfo,
)
from runner.gguf.sources import FileSource, RangeSource, open_source
from runner.gguf.strings import Walks, lazy_strings

READ_BLOCK = 1 << 20

# GGUF value types, by id (gguf.h); the fixed-size ones with their struct format.
VALUE_TYPES = ("u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "str", "arr", "u64", "i64", "f64")
_UINT32, _STRING, _ARRAY = 4, 8, 9
_FIXED = {i: struct.Struct("<" + c) for i, c in enumerate("BbHhIif?..Qqd") if c != "."}
_U32, _I32, _I64 = (struct.Struct(f) for f in ("<I", "<i", "<q"))


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
        n = self.count(self.unpack(U64, f"{what} length"), limit, 1, f"{what} length", at)
        i = self.take(n, what)
        return self.buf[i : i + n].decode("utf-8", "replace")

    def strings(self, n: int) -> Sequence[str]:
        """n strings. A long array wholly in buf (a vocabulary: ~50-150k tokens and merges) is walked
        for its lengths only and kept as bytes, decoded when something reads it (LazyStrings): the
        plan needs its length, not 100k decoded strings on every start. Else one by one."""
        lazy = lazy_strings(self, n)
        if lazy is not None:
            return lazy
        out: list[str] = []
        limit = self.limits.max_string_bytes
        while len(out) < n:
            buf, i = self.buf, self.pos - self.start
            while len(out) < n and i + 8 <= len(buf):
                j = i + 8 + U64.unpack_from(buf, i)[0]
                if j > len(buf) or j - i - 8 > limit:
                    break
                out.append(buf[i + 8 : j].decode("utf-8", "replace"))
                i = j
            self.pos = self.start + i
            if len(out) < n:
                out.append(self.string(limit, "string"))
        return out

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
        n = self.unpack(U64, f"array length of {key!r}")
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
        return TensorInfo(name, shape, ggml_type, self.unpack(U64, f"data offset of {name!r}"))


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


def read_header(
    source: str | os.PathLike[str] | RangeSource, *, limits: Limits = DEFAULT_LIMITS
) -> GGUFHeader:
    """Read and check a GGUF header: a path, an http(s) URL or any RangeSource."""
    src = open_source(source)
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
