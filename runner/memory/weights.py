"""Where llama.cpp puts each weight tensor as it loads a model, and what it costs there.

A tensor belongs to a layer (the input embeddings to none, the output to one past the last);
layers from gpu_start() on are offloaded, into CUDA buffers whose quantized rows are padded;
on a CPU-only build, the matmul weights of a repackable type are copied into CPU_REPACK; the
rest are read from the mapping. place_weights() sorts a header's tensors that way.
"""

from __future__ import annotations

from typing import Any

from runner.gguf import GGML_TYPES, REPACK_TYPES
from runner.memory.arch import Hparams
from runner.memory.graph import pad
from runner.memory.kv import CPU_ALIGNMENT

GPU_ALIGNMENT = 128  # CUDA buffer alignment
CUDA_ROW_PADDING = 512  # MATRIX_ROW_PADDING: quantized rows are padded in CUDA buffers


def tensor_layer(name: str, n_layer: int) -> int:
    """The "layer" llama.cpp assigns a tensor to: -1 input (always CPU), n_layer for the output."""
    if name.startswith("blk."):
        return int(name.split(".")[1])
    if name.startswith(("output", "cls", "enc.output", "dec.output")):
        return n_layer
    if name.startswith("rope_"):
        return 0
    return -1


def gpu_start(n_layer: int, n_gpu_layers: int) -> int:
    """The first layer on the GPU (llama-model.cpp:1589: i_gpu_start); n_layer is the output."""
    n_gpu = n_layer + 1 if n_gpu_layers < 0 else min(n_gpu_layers, n_layer + 1)
    return n_layer + 1 - n_gpu


def repacked(t: Any, layer: int, types: frozenset[str]) -> bool:
    """A CPU weight that CPU_REPACK takes: a matmul weight of a repackable type (repack.cpp:4974)."""
    if layer < 0 or t.type_name not in types or not t.name.endswith(".weight"):
        return False
    return len(t.shape) in (2, 3) and t.shape[1] % 8 == 0 and "norm" not in t.name


def cuda_size(t: Any) -> int:
    """ggml_backend_cuda_buffer_type_get_alloc_size(): quantized rows padded to 512 elements."""
    size = t.nbytes
    name, block, type_size = GGML_TYPES[t.ggml_type]
    if name not in ("F32", "F16", "BF16") and t.shape[0] % CUDA_ROW_PADDING:
        size += (CUDA_ROW_PADDING - t.shape[0] % CUDA_ROW_PADDING) // block * type_size
    return pad(size, GPU_ALIGNMENT)


def place_weights(
    header: Any, hp: Hparams, start: int, gpu: bool, repack_types: frozenset[str] = REPACK_TYPES
) -> tuple[list[Any], int, int]:
    """(the tensors read from the mapping, bytes repacked, bytes on the GPU), as
    llama_model::load_tensors() places them (llama-model.cpp:1930).

    start is the first layer on the GPU (hp.n_layer + 1: none). With a GPU device, CPU
    weights are never repacked: the host buffer type comes first in the CPU list and becomes
    plain CPU memory under mmap (llama-model.cpp:1093-1107, llama-model-loader.cpp:1270).
    """
    mapped: list[Any] = []
    repack, on_gpu = 0, 0
    tied = header.tensor("output.weight") is None
    for t in header.tensors:
        layer = tensor_layer(t.name, hp.n_layer)
        if layer >= start:
            on_gpu += cuda_size(t)
        elif not gpu and repacked(t, layer, repack_types):
            repack += pad(t.nbytes, CPU_ALIGNMENT)
        else:
            mapped.append(t)
        if tied and t.name == "token_embd.weight":  # the output layer uses a duplicate of it
            if start <= hp.n_layer:
                on_gpu += cuda_size(t)
            elif not gpu and repacked(t, hp.n_layer, repack_types):
                repack += pad(t.nbytes, CPU_ALIGNMENT)
    return mapped, repack, on_gpu
