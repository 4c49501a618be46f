"""A model split by layers over the --rpc workers, as the pinned llama.cpp splits it.

llama_model::load_tensors() (llama-model.cpp:1556-1614) turns tensor_split into cumulative split points
and gives offloaded layer il (counted from the first offloaded one, the output layer last) to the
first device whose point exceeds il / n_offloaded, in float arithmetic; the input embeddings stay on
the CPU. Each layer's weights and KV cache live with the layer (offload_kqv). runner passes the split
it planned as tensor_split, so the load places every layer where this module says.

A worker's buffers are its backend's: a CPU worker's weights unpadded (32-byte aligned, as a local
CPU buffer), and no repacking (ggml-rpc serves no extra buffer types). Its compute buffer is the whole
graph's here, an over-estimate; the loader's dry run of the load replaces it with llama.cpp's figure
for each worker (plan.confirm).
"""

from __future__ import annotations

import bisect
import struct
from typing import Any

from runner.memory.arch import Hparams
from runner.memory.compute import compute_bytes
from runner.memory.graph import pad
from runner.memory.kv import CPU_ALIGNMENT, Attention, ContextSize, kv_per_layer
from runner.memory.weights import tensor_layer


def f32(x: float) -> float:
    """x rounded to a C float, as llama.cpp computes split points."""
    return float(struct.unpack("f", struct.pack("f", x))[0])


def split_points(shares: list[float]) -> list[float]:
    """Normalized cumulative shares (llama-model.cpp:1579-1587), in float."""
    total, points = 0.0, []
    for share in shares:
        total = f32(total + f32(share))
        points.append(total)
    return [f32(p / total) for p in points]


def layer_owners(n_layer: int, start: int, shares: list[float]) -> dict[int, int]:
    """Offloaded layer (n_layer is the output layer) -> index of the worker that holds it."""
    points = split_points(shares)
    n_offloaded = n_layer + 1 - start
    owners = {}
    for il in range(start, n_layer + 1):
        at = bisect.bisect_right(points, f32((il - start) / n_offloaded))  # std::upper_bound
        owners[il] = min(at, len(points) - 1)
    return owners


def buffer_name(endpoint: str) -> str:
    """The buffer type a worker's buffers are logged under (its first device: one per worker)."""
    return f"RPC0[{endpoint}]"


def across_workers(
    header: Any,
    hp: Hparams,
    cs: ContextSize,
    start: int,
    workers: tuple[tuple[str, float], ...],
    attn: Attention,
) -> tuple[list[tuple[str, str, str, int]], dict[str, int]]:
    """The workers' buffers, as (buffer type, kind, device, bytes): the offloaded layers' weights and
    KV cache per worker, a compute buffer on each; and the weight bytes each holds. attn: the
    context's attention settings (runner.memory.kv.Attention)."""
    endpoints = [w for w, _ in workers]
    owners = layer_owners(hp.n_layer, start, [share for _, share in workers])
    weights = dict.fromkeys(endpoints, 0)
    tied = header.tensor("output.weight") is None
    for t in header.tensors:
        layer = tensor_layer(t.name, hp.n_layer)
        if layer in owners:
            weights[endpoints[owners[layer]]] += pad(t.nbytes, CPU_ALIGNMENT)
        if tied and t.name == "token_embd.weight" and hp.n_layer in owners:  # the output's duplicate
            weights[endpoints[owners[hp.n_layer]]] += pad(t.nbytes, CPU_ALIGNMENT)
    kv: dict[tuple[str, str], int] = {}
    state = kv_per_layer(hp, cs, type_k=attn.type_k, type_v=attn.type_v, v_trans=attn.v_trans)
    for il, cache, nbytes in state:
        if il in owners:
            key = (endpoints[owners[il]], cache[:2])
            kv[key] = kv.get(key, 0) + nbytes
    compute = compute_bytes(hp, cs, attn)
    out = []
    for endpoint in endpoints:
        name = buffer_name(endpoint)
        if weights[endpoint]:
            out.append((name, "model", endpoint, weights[endpoint]))
        out += [(name, kind, endpoint, n) for (e, kind), n in kv.items() if e == endpoint]
        out.append((name, "compute", endpoint, compute))
    return out, weights
