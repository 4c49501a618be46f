"""runner.gguf: synthetic files with hand-picked layouts, the real model, bad inputs, HTTP and fuzzing."""

from __future__ import annotations

import dataclasses
import functools
import os
import re
import struct
import tempfile
import threading
import time
import tracemalloc
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType, GGUFWriter
from huggingface_hub import constants as hf_constants
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import runner.gguf.reader
import runner.gguf.strings
from runner.errors import DownloadError, InvalidModelFile, ModelNotFound, exit_code_for
from runner.gguf import (
    DEFAULT_LIMITS,
    GGML_TYPES,
    BytesSource,
    FileSource,
    GGUFError,
    GGUFHeader,
    HTTPSource,
    Limits,
    TensorInfo,
    read_header,
)
from runner.gguf.strings import LazyStrings, Walks

SMOLLM2_SIZE = 98_362_432
Q = GGMLQuantizationType

# --- synthetic files written by gguf-py -------------------------------------------------


def write_synthetic(path: Path, alignment: int | None = None) -> Path:
    """A small llama-like GGUF: every scalar type, arrays, and five tensors (three quantized)."""
    w = GGUFWriter(path, "llama")
    if alignment is not None:
        w.add_custom_alignment(alignment)
    w.add_block_count(2)
    w.add_uint8("t.u8", 200)
    w.add_int8("t.i8", -100)
    w.add_uint16("t.u16", 65535)
    w.add_int16("t.i16", -32768)
    w.add_uint32("t.u32", 4_000_000_000)
    w.add_int32("t.i32", -7)
    w.add_float32("t.f32", 0.5)
    w.add_uint64("t.u64", 2**64 - 1)
    w.add_int64("t.i64", -(2**63))
    w.add_float64("t.f64", 1.25)
    w.add_bool("t.bool", True)
    w.add_string("t.str", "héllo")
    w.add_array("t.strs", ["a", "bc", "ü"])
    w.add_array("t.ints", [1, -2, 3])
    w.add_array("t.floats", [0.25, -1.5])
    w.add_array("t.bools", [True, False, True])
    w.add_key_value("t.u16s", [1, 2, 65535], GGUFValueType.ARRAY, sub_type=GGUFValueType.UINT16)
    w.add_key_value("t.i8s", [-128, 127, -128], GGUFValueType.ARRAY, sub_type=GGUFValueType.INT8)
    w.add_key_value("t.u64s", [2**64 - 1], GGUFValueType.ARRAY, sub_type=GGUFValueType.UINT64)
    w.add_tensor("f32", np.arange(6, dtype=np.float32).reshape(2, 3))  # ggml shape (3, 2): 24 bytes
    w.add_tensor("f16", np.zeros(4, dtype=np.float16))  # 8 bytes
    # Quantized tensors from raw bytes: numpy shape (rows, bytes per row).
    w.add_tensor("q4_0", np.zeros((2, 36), dtype=np.uint8), raw_dtype=Q.Q4_0)  # 2 rows of 64: 72 bytes
    w.add_tensor("q8_0", np.zeros((3, 34), dtype=np.uint8), raw_dtype=Q.Q8_0)  # 3 rows of 32: 102 bytes
    w.add_tensor("q4_k", np.zeros((1, 144), dtype=np.uint8), raw_dtype=Q.Q4_K)  # 1 row of 256: 144 bytes
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_synthetic(tmp_path_factory.mktemp("gguf") / "synthetic.gguf")


@pytest.mark.fast
def test_synthetic_metadata(synthetic: Path) -> None:
    h = read_header(synthetic)
    assert h.source == str(synthetic)
    assert h.version == 3
    assert h.architecture == "llama"
    assert h.arch_get("block_count") == 2
    assert h.arch_get("context_length", 4096) == 4096
    expected = {
        "t.u8": 200,
        "t.i8": -100,
        "t.u16": 65535,
        "t.i16": -32768,
        "t.u32": 4_000_000_000,
        "t.i32": -7,
        "t.f32": 0.5,
        "t.u64": 2**64 - 1,
        "t.i64": -(2**63),
        "t.f64": 1.25,
        "t.bool": True,
        "t.str": "héllo",
        "t.strs": ["a", "bc", "ü"],
        "t.ints": [1, -2, 3],
        "t.floats": [0.25, -1.5],
        "t.bools": [True, False, True],
        "t.u16s": [1, 2, 65535],
        "t.i8s": [-128, 127, -128],
        "t.u64s": [2**64 - 1],
    }
    assert {k: v for k, v in h.metadata.items() if k.startswith("t.")} == expected
    assert h.get("t.bool") is True
    assert read_header(FileSource(synthetic)) == h
    assert h.get("missing", "x") == "x"


@pytest.mark.fast
def test_synthetic_tensors(synthetic: Path) -> None:
    h = read_header(synthetic)
    assert h.alignment == 32
    assert h.tensors == (
        TensorInfo("f32", (3, 2), Q.F32, 0),
        TensorInfo("f16", (4,), Q.F16, 32),
        TensorInfo("q4_0", (64, 2), Q.Q4_0, 64),
        TensorInfo("q8_0", (32, 3), Q.Q8_0, 160),
        TensorInfo("q4_k", (256, 1), Q.Q4_K, 288),
    )
    assert [t.nbytes for t in h.tensors] == [24, 8, 72, 102, 144]
    assert [t.type_name for t in h.tensors] == ["F32", "F16", "Q4_0", "Q8_0", "Q4_K"]
    assert h.tensor("q8_0") == h.tensors[3]
    assert h.tensor("nope") is None
    assert h.data_size == 288 + 144
    assert h.data_offset % 32 == 0
    assert h.expected_file_size == h.data_offset + 432
    assert h.file_size == synthetic.stat().st_size >= h.expected_file_size
    h.check_complete()


@pytest.mark.fast
def test_custom_alignment(tmp_path: Path) -> None:
    h = read_header(write_synthetic(tmp_path / "a64.gguf", alignment=64))
    assert h.alignment == 64
    assert [t.offset for t in h.tensors] == [0, 64, 128, 256, 384]
    assert h.data_offset % 64 == 0
    assert h.data_size == 384 + 144


@pytest.mark.fast
def test_type_table_matches_gguf_py() -> None:
    # gguf 0.19.0 still says Q8_1 blocks are 40 bytes; the engine's block_q8_1 is 2 halves + 32 = 36.
    ours = {i: sizes for i, (_, *sizes) in GGML_TYPES.items() if i != Q.Q8_1}
    theirs = {t.value: sizes for t, sizes in GGML_QUANT_SIZES.items() if t != Q.Q8_1}
    assert {i: tuple(s) for i, s in ours.items() if i in theirs} == theirs
    assert GGML_TYPES[Q.Q8_1] == ("Q8_1", 32, 36)
    assert all(GGML_TYPES[t.value][0] == t.name for t in GGMLQuantizationType)


# --- hand-built files: exact layouts and every check ------------------------------------


def _s(text: str | bytes) -> bytes:
    data = text.encode() if isinstance(text, str) else text
    return struct.pack("<Q", len(data)) + data


def _kv(key: str, vtype: int, payload: bytes) -> bytes:
    return _s(key) + struct.pack("<i", vtype) + payload


def _u32(key: str, value: int) -> bytes:
    return _kv(key, GGUFValueType.UINT32, struct.pack("<I", value))


def _ti(name: str, shape: tuple[int, ...], ggml_type: int = Q.F32, offset: int = 0) -> bytes:
    return _s(name) + struct.pack(f"<I{len(shape)}qiQ", len(shape), *shape, ggml_type, offset)


def _gguf(
    kvs: tuple[bytes, ...] = (),
    tis: tuple[bytes, ...] = (),
    *,
    version: int = 3,
    n_tensors: int | None = None,
    n_kv: int | None = None,
) -> bytes:
    counts = (len(tis) if n_tensors is None else n_tensors, len(kvs) if n_kv is None else n_kv)
    return b"GGUF" + struct.pack("<Iqq", version, *counts) + b"".join(kvs) + b"".join(tis)


def _write(tmp_path: Path, data: bytes) -> Path:
    path = tmp_path / "model.gguf"
    path.write_bytes(data)
    return path


@pytest.mark.fast
def test_minimal_layout_by_hand(tmp_path: Path) -> None:
    # 24-byte preamble, KV "a" (8+1+4+4 = 17), tensor info "t" (8+1+4+8+4+8 = 33): 74 bytes, padded to 96.
    header = _gguf((_u32("a", 7),), (_ti("t", (32,)),))
    assert len(header) == 74
    h = read_header(_write(tmp_path, header + bytes(22) + bytes(128)))
    assert h.metadata == {"a": 7}
    assert h.tensors == (TensorInfo("t", (32,), Q.F32, 0),)
    assert (h.data_offset, h.data_size, h.expected_file_size, h.file_size) == (96, 128, 224, 224)
    assert h.architecture is None
    assert h.arch_get("block_count", 0) == 0


@pytest.mark.fast
def test_no_tensors_no_padding(tmp_path: Path) -> None:
    h = read_header(_write(tmp_path, _gguf((_u32("a", 1),))))
    assert (h.tensors, h.data_offset, h.data_size) == ((), 41, 0)


@pytest.mark.fast
def test_version_2_and_zero_sized_tensor(tmp_path: Path) -> None:
    # gguf.cpp allows 0 in a dimension (an empty tensor) and a scalar (n_dims 0).
    header = _gguf(tis=(_ti("empty", (0, 5), Q.Q4_0), _ti("scalar", ())), version=2)
    h = read_header(_write(tmp_path, header + bytes(-len(header) % 32 + 4)))
    assert h.version == 2
    assert [(t.shape, t.offset, t.nbytes) for t in h.tensors] == [((0, 5), 0, 0), ((), 0, 4)]


@pytest.mark.fast
def test_invalid_utf8_is_replaced(tmp_path: Path) -> None:
    h = read_header(_write(tmp_path, _gguf((_kv("s", GGUFValueType.STRING, _s(b"a\xffb")),))))
    assert h.metadata == {"s": "a\ufffdb"}


def _string_array(n: int) -> bytes:
    return struct.pack("<iQ", GGUFValueType.STRING, n)


BAD_HEADERS: list[tuple[str, bytes, str]] = [
    ("empty", b"", "is not a GGUF file"),
    ("short", b"GG", "is not a GGUF file"),
    ("text", b"hello, this is not a model\n", "is not a GGUF file"),
    ("version 0", _gguf(version=0), "is corrupt: GGUF version 0"),
    ("version 1", _gguf(version=1), "is GGUF version 1, which llama.cpp no longer reads"),
    ("version 4", _gguf(version=4), "is GGUF version 4; llama.cpp reads versions 2 and 3"),
    ("big-endian", b"GGUF" + struct.pack(">Iqq", 3, 0, 0), "is a big-endian GGUF file"),
    (
        "preamble cut",
        _gguf()[:20],
        "is truncated: key-value count at byte 16 needs 8 bytes, the file ends at byte 20",
    ),
    (
        "absurd string length",
        _gguf((_kv("k", GGUFValueType.STRING, struct.pack("<Q", 1 << 40)),)),
        "is corrupt: string length 1099511627776 at byte 37 exceeds the limit of 16777216",
    ),
    (
        "string past the end",
        _gguf((_kv("k", GGUFValueType.STRING, _s("x" * 1000)[:20]),)),
        "is truncated or corrupt: string length 1000 at byte 37 needs 1000 bytes, only 12 remain",
    ),
    (
        "absurd array length",
        _gguf((_kv("k", GGUFValueType.ARRAY, struct.pack("<iQ", GGUFValueType.UINT32, 1 << 40)),)),
        "is corrupt: array length 1099511627776 at byte 41 exceeds the limit of 4194304",
    ),
    (
        "array past the end",
        _gguf((_kv("k", GGUFValueType.ARRAY, struct.pack("<iQ", GGUFValueType.UINT32, 1_000_000)),)),
        "is truncated or corrupt: array length 1000000 at byte 41 needs 4000000 bytes, only 0 remain",
    ),
    (
        "string array past the end",
        _gguf((_kv("k", GGUFValueType.ARRAY, _string_array(1_000_000)),)),
        "is truncated or corrupt: array length 1000000 at byte 41 needs 8000000 bytes, only 0 remain",
    ),
    (
        "absurd tensor count",
        _gguf(n_tensors=1 << 40),
        "is corrupt: tensor count 1099511627776 at byte 8 exceeds the limit of 65536",
    ),
    ("negative tensor count", _gguf(n_tensors=-1), "is corrupt: tensor count -1 at byte 8 is negative"),
    (
        "tensor count past the end",
        _gguf(n_tensors=1000),
        "is truncated or corrupt: tensor count 1000 at byte 8 needs 24000 bytes, only 8 remain",
    ),
    (
        "absurd key-value count",
        _gguf(n_kv=1 << 62),
        "is corrupt: key-value count 4611686018427387904 at byte 16 exceeds the limit of 8192",
    ),
    ("empty key", _gguf((_u32("", 1),)), "is corrupt: empty key at byte 24"),
    ("duplicate key", _gguf((_u32("a", 1), _u32("a", 2))), "is corrupt: duplicate key 'a' at byte 41"),
    ("invalid value type", _gguf((_kv("k", 13, b"\0"),)), "is corrupt: key 'k' has invalid GGUF type 13"),
    (
        "nested array",
        _gguf((_kv("k", GGUFValueType.ARRAY, struct.pack("<iQ", GGUFValueType.ARRAY, 1)),)),
        "is corrupt: key 'k' is an array of invalid GGUF type 9 (llama.cpp reads no nested arrays)",
    ),
    (
        "alignment not a power of two",
        _gguf((_u32("general.alignment", 48),)),
        "is corrupt: general.alignment 48 is not a power of two",
    ),
    ("alignment zero", _gguf((_u32("general.alignment", 0),)), "general.alignment 0 is not a power of two"),
    (
        "alignment of the wrong type",
        _gguf((_kv("general.alignment", GGUFValueType.UINT64, struct.pack("<Q", 64)),)),
        "is corrupt: general.alignment must be of type u32, is u64",
    ),
    (
        "tensor name too long",
        _gguf(tis=(_ti("n" * 64, (32,)),)),
        "is corrupt: tensor name length 64 at byte 24 exceeds the limit of 63",
    ),
    (
        "duplicate tensor name",
        _gguf(tis=(_ti("t", (32,)), _ti("t", (32,), offset=128))),
        "is corrupt: duplicate tensor name 't' at byte 57",
    ),
    (
        "too many dims",
        _gguf(tis=(_ti("t", (1, 1, 1, 1, 1)),)),
        "is corrupt: tensor 't' has 5 dimensions, more than 4",
    ),
    (
        "negative dim",
        _gguf(tis=(_ti("t", (32, -1)),)),
        "is corrupt: tensor 't' has a negative dimension: (32, -1)",
    ),
    (
        "element count overflow",
        _gguf(tis=(_ti("t", (1 << 32, 1 << 31)),)),
        "is corrupt: tensor 't' of shape (4294967296, 2147483648) has more than 2**63 - 1 elements",
    ),
    ("removed ggml type", _gguf(tis=(_ti("t", (32,), 4),)), "is corrupt: tensor 't' has unknown ggml type 4"),
    (
        "unknown ggml type",
        _gguf(tis=(_ti("t", (32,), 43),)),
        "is corrupt: tensor 't' has unknown ggml type 43",
    ),
    (
        "row not a multiple of the block",
        _gguf(tis=(_ti("t", (33, 2), Q.Q4_0),)),
        "is corrupt: tensor 't' of type Q4_0 has 33 elements per row, not a multiple of its block size 32",
    ),
    (
        "tensor offset not where gguf.cpp expects it",
        _gguf(tis=(_ti("t", (32,)), _ti("u", (32,), offset=0))) + bytes(64),
        "is corrupt: tensor 'u' has data offset 0, expected 128",
    ),
    (
        "data section past the end",
        _gguf(tis=(_ti("t", (32,)),)),
        "is truncated: tensor data starts at byte 64, file has 57",
    ),
]


@pytest.mark.fast
@pytest.mark.parametrize(("data", "message"), [c[1:] for c in BAD_HEADERS], ids=[c[0] for c in BAD_HEADERS])
def test_bad_header(tmp_path: Path, data: bytes, message: str) -> None:
    path = _write(tmp_path, data)
    with pytest.raises(GGUFError, match=re.escape(message)) as info:
        read_header(path)
    assert str(info.value).startswith(f"{path} ")
    assert isinstance(info.value, InvalidModelFile)
    assert exit_code_for(info.value) == 2


@pytest.mark.fast
def test_truncated_header(synthetic: Path, tmp_path: Path) -> None:
    data = synthetic.read_bytes()
    cut = read_header(synthetic).data_offset - 40  # in the last tensor info
    with pytest.raises(
        GGUFError,
        match=rf"model\.gguf is truncated: .* at byte \d+ needs \d+ bytes, the file ends at byte {cut}",
    ):
        read_header(_write(tmp_path, data[:cut]))
    # Cut early, the counts already promise more than is left.
    with pytest.raises(
        GGUFError,
        match=r"is truncated or corrupt: key-value count 21 at byte 16 needs 294 bytes, only 276 remain",
    ):
        read_header(_write(tmp_path, data[:300]))


@pytest.mark.fast
def test_truncated_data(synthetic: Path, tmp_path: Path) -> None:
    full = read_header(synthetic)
    cut = full.data_offset + 100
    h = read_header(_write(tmp_path, synthetic.read_bytes()[:cut]))  # the header itself is whole
    expected = f"is truncated: its header expects {full.expected_file_size} bytes, file has {cut}"
    with pytest.raises(GGUFError, match=expected):
        h.check_complete()


@pytest.mark.fast
@pytest.mark.parametrize("block", [1, 7, 100])
def test_any_read_block_gives_the_same_header(
    synthetic: Path, monkeypatch: pytest.MonkeyPatch, block: int
) -> None:
    expected = read_header(synthetic)
    monkeypatch.setattr(runner.gguf.reader, "READ_BLOCK", block)  # every field straddles a block boundary
    assert read_header(synthetic) == expected


@pytest.mark.fast
def test_header_limit(synthetic: Path) -> None:
    with pytest.raises(GGUFError, match="runs past the header limit of 200 bytes"):
        read_header(synthetic, limits=Limits(max_header_bytes=200))


@pytest.mark.fast
def test_missing_file_and_directory(tmp_path: Path) -> None:
    with pytest.raises(ModelNotFound, match=re.escape(f"no such file: {tmp_path / 'nope.gguf'}")):
        read_header(tmp_path / "nope.gguf")
    with pytest.raises(ModelNotFound) as refused:  # it is there: never "no such file"
        read_header(str(tmp_path))
    assert str(refused.value) == f"{tmp_path} is a directory, not a model file (a .gguf)"


# --- the real model ----------------------------------------------------------------------


@pytest.mark.model
def test_real_model(smollm2_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    start = time.perf_counter()
    h = read_header(smollm2_path)
    elapsed = time.perf_counter() - start
    assert h.architecture == "llama"
    assert h.arch_get("block_count") == 30
    assert len(h.get("tokenizer.ggml.tokens")) == 49152
    assert len(h.get("tokenizer.ggml.merges")) == 48900
    assert "<|im_start|>" in h.get("tokenizer.chat_template")
    assert len(h.tensors) == 272
    assert h.tensor("token_embd.weight") == TensorInfo("token_embd.weight", (576, 49152), Q.Q8_0, 0)
    assert h.data_offset == 1_785_664
    assert h.expected_file_size == h.file_size == SMOLLM2_SIZE
    h.check_complete()
    assert elapsed < 1.0  # ~0.04 s here
    monkeypatch.setattr(runner.gguf.reader, "READ_BLOCK", 4093)  # ~440 reads, fields straddling boundaries
    assert read_header(smollm2_path) == h


# --- HTTP range reads -------------------------------------------------------------------


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    files: dict[str, Path]
    served: int
    last_headers: dict[str, str]


class _RangeHandler(BaseHTTPRequestHandler):
    """Serves files with single-range requests (206); /redirect/X sends to /X, /norange/X ignores Range."""

    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self.server.last_headers = {k.lower(): v for k, v in self.headers.items()}
        name = self.path.lstrip("/")
        if name.startswith("redirect/"):
            self.send_response(302)
            self.send_header("Location", "/" + name.removeprefix("redirect/"))
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        ignore_range = name.startswith("norange/")
        path = self.server.files.get(name.removeprefix("norange/"))
        if path is None:
            self.send_error(404)
            return
        size = path.stat().st_size
        match = re.fullmatch(r"bytes=(\d+)-(\d+)", self.headers.get("Range", ""))
        start, end = (0, size - 1) if ignore_range or not match else (int(match[1]), int(match[2]))
        if start >= size:
            self.send_response(416)
            self.send_header("Content-Range", f"bytes */{size}")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        end = min(end, size - 1)
        self.send_response(200 if ignore_range or not match else 206)
        if match and not ignore_range:
            self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
        self.send_header("Content-Length", str(end - start + 1))
        self.end_headers()
        with path.open("rb") as f:
            f.seek(start)
            left = end - start + 1
            try:
                while left:
                    chunk = f.read(min(left, 1 << 16))
                    self.server.served += len(chunk)  # counted before the client can see it
                    self.wfile.write(chunk)
                    left -= len(chunk)
            except ConnectionError:  # the client stopped reading
                pass


@pytest.fixture(scope="module")
def _http(synthetic: Path, smollm2_path: Path) -> Iterator[_Server]:
    server = _Server(("127.0.0.1", 0), _RangeHandler)
    server.files = {"synthetic.gguf": synthetic, "smollm2.gguf": smollm2_path}
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.fixture
def http(_http: _Server, monkeypatch: pytest.MonkeyPatch) -> _Server:
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", False)
    _http.served = 0
    return _http


def _url(server: _Server, name: str, host: str = "127.0.0.1") -> str:
    return f"http://{host}:{server.server_address[1]}/{name}"


def _same(a: GGUFHeader, b: GGUFHeader) -> bool:
    return dataclasses.replace(a, source="") == dataclasses.replace(b, source="")


@pytest.mark.model
def test_http_synthetic_matches_file(http: _Server, synthetic: Path) -> None:
    url = _url(http, "synthetic.gguf")
    h = read_header(url)
    assert h.source == url
    assert _same(h, read_header(synthetic))
    assert h.file_size == synthetic.stat().st_size


@pytest.mark.model
def test_http_real_model_reads_a_few_mb(http: _Server, smollm2_path: Path) -> None:
    h = read_header(HTTPSource(_url(http, "smollm2.gguf")))
    assert _same(h, read_header(smollm2_path))
    h.check_complete()
    assert http.served <= 3 << 20  # blocks of 1 + 2 MiB for a 1.7 MB header, of a 98 MB file


@pytest.mark.model
def test_http_redirect_and_range_ignored(http: _Server, synthetic: Path) -> None:
    expected = read_header(synthetic)
    assert _same(read_header(_url(http, "redirect/synthetic.gguf")), expected)
    assert _same(read_header(_url(http, "norange/synthetic.gguf")), expected)


@pytest.mark.model
def test_http_cache_and_end_of_file(http: _Server, synthetic: Path) -> None:
    src = HTTPSource(_url(http, "synthetic.gguf"), block_size=256)
    data = synthetic.read_bytes()
    assert src.size is None
    assert src.read_at(10, 20) == data[10:30]
    assert src.size == len(data)
    assert http.served == 256
    assert src.read_at(100, 100) == data[100:200]  # cached
    assert src.read_at(200, 200) == data[200:400]  # continues the cache with a 512-byte block
    assert http.served == 256 + 512
    assert src.read_at(len(data) - 5, 100) == data[-5:]
    assert src.read_at(len(data) + 10, 10) == b""
    assert HTTPSource(_url(http, "synthetic.gguf")).read_at(len(data) + 10, 10) == b""  # HTTP 416


@pytest.mark.model
def test_http_errors(http: _Server, monkeypatch: pytest.MonkeyPatch) -> None:
    url = _url(http, "missing.gguf")
    with pytest.raises(ModelNotFound, match=re.escape(f"no such file: {url} (HTTP 404)")):
        read_header(url)
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(DownloadError, match="offline mode is enabled"):
        read_header(_url(http, "synthetic.gguf"))


@pytest.mark.model
def test_http_token_only_for_the_hub(http: _Server, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    monkeypatch.setattr(hf_constants, "ENDPOINT", f"http://127.0.0.1:{http.server_address[1]}")
    HTTPSource(_url(http, "synthetic.gguf")).read_at(0, 4)
    assert http.last_headers.get("authorization") == "Bearer hf_secret"
    HTTPSource(_url(http, "synthetic.gguf", host="localhost")).read_at(0, 4)
    assert "authorization" not in http.last_headers
    HTTPSource(_url(http, "synthetic.gguf", host="localhost"), headers={"Authorization": "Bearer x"}).read_at(
        0, 4
    )
    assert http.last_headers.get("authorization") == "Bearer x"


# --- bounds and fuzzing -----------------------------------------------------------------


def _peak_allocation(source: BytesSource) -> int:
    tracemalloc.start()
    try:
        read_header(source)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.fast
def test_hostile_but_valid_header_stays_within_the_stated_bound() -> None:
    # 200,000 one-byte invalid-UTF-8 strings: the costliest Python objects per header byte.
    data = _gguf((_kv("k", GGUFValueType.ARRAY, _string_array(200_000) + _s(b"\xff") * 200_000),))
    assert _peak_allocation(BytesSource(data)) < 10 * len(data)


@functools.cache
def _sample() -> bytes:
    with tempfile.TemporaryDirectory() as tmp:
        return write_synthetic(Path(tmp) / "s.gguf").read_bytes()[:1200]  # the header and a little data


@functools.cache
def _length_fields() -> list[int]:
    """Offsets in the sample where a small u64 (a length or a count) is stored."""
    data = _sample()
    return [i for i in range(len(data) - 8) if 0 < int.from_bytes(data[i : i + 8], "little") < 1 << 16]


_HUGE = [1 << 31, (1 << 32) - 1, 1 << 40, 1 << 62, (1 << 63) - 1, (1 << 64) - 1]
_POS = st.integers(0, 1199)
_MUTATION = st.one_of(
    st.tuples(st.just("flip"), _POS, st.integers(0, 7)),
    st.tuples(st.just("byte"), _POS, st.integers(0, 255)),
    st.tuples(st.just("huge"), st.sampled_from(_length_fields()), st.sampled_from(_HUGE)),
    st.tuples(st.just("cut"), st.integers(0, 1200), st.just(0)),
)
FUZZ_PEAK_BOUND = 256 << 10  # for a 1.2 KB input: a hostile count must not turn into an allocation


def _mutate(data: bytes, mutations: list[tuple[str, int, int]]) -> bytes:
    out = bytearray(data)
    for kind, pos, arg in mutations:
        if kind == "cut":
            del out[pos:]
        elif pos < len(out) and kind == "flip":
            out[pos] ^= 1 << arg
        elif pos < len(out) and kind == "byte":
            out[pos] = arg
        elif kind == "huge":
            out[pos : pos + 8] = arg.to_bytes(8, "little")
    return bytes(out)


def _outcome(source: BytesSource, read_block: int) -> str:
    """read_header's header (repr) or GGUFError message; any other exception propagates."""
    with mock.patch.object(runner.gguf.reader, "READ_BLOCK", read_block):
        try:
            return repr(read_header(source))
        except GGUFError as exc:
            return f"GGUFError: {exc}"


@pytest.mark.fast
@settings(max_examples=300, deadline=2000, suppress_health_check=[HealthCheck.too_slow])
@given(
    mutations=st.lists(_MUTATION, min_size=1, max_size=4),
    size_known=st.booleans(),
    small_block=st.sampled_from([1, 13, 256]),
)
def test_fuzz_mutated_header(
    mutations: list[tuple[str, int, int]], size_known: bool, small_block: int
) -> None:
    source = BytesSource(_mutate(_sample(), mutations), size_known)
    tracemalloc.start()
    try:
        result = _outcome(source, 1 << 20)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert result.startswith(("GGUFHeader(", "GGUFError: <bytes> is "))
    assert peak < FUZZ_PEAK_BOUND
    # Fields across block boundaries: reading in small blocks gives the very same result.
    assert _outcome(source, small_block) == result


@pytest.mark.fast
def test_default_limits_fit_real_models() -> None:
    assert Limits() == DEFAULT_LIMITS
    assert DEFAULT_LIMITS.max_array_len >= 500_000  # merges of the largest BPE vocabularies
    assert DEFAULT_LIMITS.max_tensors >= 3_000  # MoE models
    assert DEFAULT_LIMITS.max_string_bytes >= 1 << 20  # chat templates are tens of KB


@pytest.mark.model
def test_a_vocabulary_is_decoded_on_first_use_and_matches_an_eager_read(smollm2_path, monkeypatch) -> None:
    lazy = read_header(smollm2_path).get("tokenizer.ggml.tokens")
    assert isinstance(lazy, LazyStrings) and len(lazy) == 49152
    monkeypatch.setattr(runner.gguf.strings, "LAZY_STRINGS", 10**9)  # every array decoded as it is read
    eager = read_header(smollm2_path).get("tokenizer.ggml.tokens")
    assert isinstance(eager, list) and lazy == eager and lazy[100] == eager[100] and list(lazy) == eager


# --- remembered walks of long string arrays (runner.gguf.strings.Walks) -----------------------


def _vocab_file(tmp_path: Path, lengths: list[int]) -> Path:
    """A header with a string array of len(lengths) strings (over LAZY_STRINGS) and a key after it."""
    strings = b"".join(_s(bytes([97 + i % 26]) * n) for i, n in enumerate(lengths))
    array = _kv("tokenizer.ggml.tokens", GGUFValueType.ARRAY, _string_array(len(lengths)) + strings)
    return _write(tmp_path, _gguf((array, _u32("after", 42))))


def _walk_uses(monkeypatch: pytest.MonkeyPatch) -> list[int | None]:
    uses: list[int | None] = []
    known = Walks.known

    def spy(self: Walks, start: int, n: int, reader: Any) -> int | None:
        uses.append(known(self, start, n, reader))
        return uses[-1]

    monkeypatch.setattr(Walks, "known", spy)
    return uses


@pytest.mark.fast
def test_a_long_array_is_walked_once_then_its_end_is_remembered(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("RUNNER_HOME", str(tmp_path / "home"))
    lengths = [1 + i % 7 for i in range(3000)]
    path = _vocab_file(tmp_path, lengths)
    uses = _walk_uses(monkeypatch)
    first = read_header(path)
    assert uses == [None] and len(list((tmp_path / "home" / "cache" / "headers").glob("*.json"))) == 1
    second = read_header(path)
    assert uses[1] is not None  # the end came from the cache, not from a walk
    tokens = second.get("tokenizer.ggml.tokens")
    assert isinstance(tokens, LazyStrings) and second.get("after") == 42
    assert (
        list(tokens)
        == list(first.get("tokenizer.ggml.tokens"))
        == [chr(97 + i % 26) * n for i, n in enumerate(lengths)]
    )


@pytest.mark.fast
def test_a_rewritten_file_or_a_stale_entry_is_walked_again(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("RUNNER_HOME", str(tmp_path / "home"))
    path = _vocab_file(tmp_path, [3] * 2000)
    read_header(path)
    # the same size and count, other string bounds, the old modification time: the change time differs
    stat = path.stat()
    _vocab_file(tmp_path, [2, 4] * 1000)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert read_header(path).get("tokenizer.ggml.tokens")[:2] == ["a" * 2, "b" * 4]
    # an entry for this very file with wrong bounds (a stale or edited cache) is checked, not trusted
    walks = Walks(FileSource(path))
    ((start, (n, last, end)),) = walks.arrays.items()
    for wrong in ((n, last + 2, end + 2), (n, last - 1, end), (n, start, end)):
        walks.arrays = {start: wrong}
        walks.changed = True
        walks.save()
        uses = _walk_uses(monkeypatch)
        header = read_header(path)
        assert uses == [None] and header.get("after") == 42
        assert header.get("tokenizer.ggml.tokens")[-1] == chr(97 + 1999 % 26) * 4
        monkeypatch.undo()
        monkeypatch.setenv("RUNNER_HOME", str(tmp_path / "home"))


@pytest.mark.fast
def test_a_corrupt_or_unwritable_walk_cache_is_no_cache(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("RUNNER_HOME", str(tmp_path / "home"))
    path = _vocab_file(tmp_path, [5] * 1500)
    read_header(path)
    (entry,) = (tmp_path / "home" / "cache" / "headers").glob("*.json")
    for junk in ("", "{", '{"arrays": 7}', '{"arrays": [["x"]]}', '{"arrays": [[1, 2]]}'):
        entry.write_text(junk)
        assert len(read_header(path).get("tokenizer.ggml.tokens")) == 1500
    monkeypatch.setenv("RUNNER_HOME", str(tmp_path / "file"))
    (tmp_path / "file").write_text("not a folder")
    assert read_header(path).get("after") == 42


@pytest.mark.fast
def test_lazy_strings_that_do_not_fill_their_bytes_fail_as_a_changed_file() -> None:
    good = _s("ab") + _s("c")
    assert list(LazyStrings(good, 2)) == ["ab", "c"]
    for data, n in ((good, 3), (good, 1), (good[:-1], 2), (good + b"\0", 2), (struct.pack("<Q", 99), 1)):
        with pytest.raises(GGUFError, match="the file changed"):
            list(LazyStrings(data, n))


@pytest.mark.fast
def test_the_vocabulary_size_is_the_token_count_else_the_architecture_key() -> None:
    def header(metadata: dict[str, Any]) -> GGUFHeader:
        return GGUFHeader("h", 3, {"general.architecture": "gemma3", **metadata}, (), 32, 0, None)

    lazy = LazyStrings(_s("ab") * 3000, 3000)
    assert header({"tokenizer.ggml.tokens": lazy}).vocab_size == 3000  # gemma: no gemma3.vocab_size
    assert header({"tokenizer.ggml.tokens": ["a", "b"], "gemma3.vocab_size": 7}).vocab_size == 2
    assert header({"gemma3.vocab_size": 7}).vocab_size == 7  # the "none" tokenizer: no token list
    assert header({}).vocab_size is None
