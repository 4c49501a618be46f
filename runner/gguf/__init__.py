"""Bounded GGUF header reader: metadata and tensor infos, never the tensor data.

Reads a local file (FileSource) or a remote one through HTTP range requests (HTTPSource),
so a 40 GB model is judged from the few MB of its header, and rejects what llama.cpp's
gguf.cpp would reject, within Limits that bound what a hostile file can make it allocate.
header.py says what a header is (the type tables, Limits, GGUFHeader); sources.py where
its bytes come from; strings.py keeps a vocabulary's long string arrays as bytes until
read; reader.py reads and checks; projector.py checks a vision projector's header against what
libmtmd reads. The names below are the ones the rest of runner uses.
"""

from runner.gguf.header import (
    DEFAULT_LIMITS,
    GGML_TYPES,
    REPACK_TYPES,
    GGUFError,
    GGUFHeader,
    Limits,
    TensorInfo,
)
from runner.gguf.projector import ProjectorInfo, check_projector, read_key_types
from runner.gguf.reader import read_header
from runner.gguf.sources import BytesSource, FileSource, HTTPSource, RangeSource

__all__ = [
    "DEFAULT_LIMITS",
    "GGML_TYPES",
    "REPACK_TYPES",
    "BytesSource",
    "FileSource",
    "GGUFError",
    "GGUFHeader",
    "HTTPSource",
    "Limits",
    "ProjectorInfo",
    "RangeSource",
    "TensorInfo",
    "check_projector",
    "read_header",
    "read_key_types",
]
