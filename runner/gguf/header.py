"""What a GGUF header is, as runner reads it: the format's constants, the ggml type tables, the
limits a header must stay within, the error for one that does not, and the dataclasses a read
header becomes (GGUFHeader, TensorInfo). No I/O: the sources, the string arrays and the reader
build on this.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from math import prod
from typing import Any

from runner.errors import InvalidModelFile

GGUF_MAGIC = b"GGUF"
ALIGNMENT_KEY = "general.alignment"
DEFAULT_ALIGNMENT = 32  # GGUF_DEFAULT_ALIGNMENT
MAX_NAME = 64  # GGML_MAX_NAME: a tensor name has at most 63 bytes
INT64_MAX = (1 << 63) - 1
UINT64_MAX = (1 << 64) - 1
U64 = struct.Struct("<Q")  # every length and count: a string's, an array's

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
    def vocab_size(self) -> int | None:
        """How many tokens the vocabulary has: its token list's length (what llama.cpp counts; a long
        list is a LazyStrings, whose len() decodes nothing), else {arch}.vocab_size, which some
        architectures' files (gemma) leave out; None when the header says neither."""
        tokens = self.metadata.get("tokenizer.ggml.tokens")
        if tokens:
            return len(tokens)
        size = self.arch_get("vocab_size")
        return None if size is None else int(size)

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
