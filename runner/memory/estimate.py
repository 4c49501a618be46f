"""How much memory llama.cpp will allocate for a model, before it loads it.

estimate() answers for exactly the context runner's engine creates (a Load):
llama_model_default_params() with n_gpu_layers, and llama_context_default_params() with
n_ctx, threads and (when asked) type_k/type_v/n_seq_max. Each figure is the size of a
buffer llama.cpp allocates, computed the way the pinned llama.cpp computes it (file:line
references are to vendor/llama.cpp of llama-cpp-python 0.3.36; see /tmp/memory_notes.md):

- weights (weights.py): the mmap'd range of the CPU tensors ("CPU_Mapped model buffer"), the
  CPU weights that are repacked for faster matmuls ("CPU_REPACK", CPU-only builds), and the
  offloaded layers ("CUDA0 model buffer");
- KV cache (kv.py): per layer, row(type_k, n_embd_k_gqa(il)) + row(type_v, n_embd_v_gqa(il)) per
  cell, n_ctx rounded up to 256 cells; sliding-window layers are full size too, because
  the default swa_full is true; recurrent layers keep one state per sequence instead;
- compute (compute.py): the worst-case graph llama_context reserves (n_ubatch tokens, n_ubatch
  logits), built as llama.cpp builds it (build.py) and placed by a replay of ggml-alloc
  (graph.py): to the byte on CPU;
- output: the host buffer for one row of logits per sequence (n_vocab * n_seq * 4).

Deciding whether it fits: on a GPU, device("gpu").total_bytes against the free VRAM (GPU
buffers are committed when allocated); in RAM, host_rss_bytes against the available memory
(a CPU compute buffer is only backed where batches write, and the engine writes one logits
row per batch, not n_ubatch). Estimate.exact is False where this module approximates: an
architecture without its own graph builder, or a CUDA device (compute buffers not measured).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any

from runner.gguf import REPACK_TYPES
from runner.memory.arch import Hparams, hparams_from_header
from runner.memory.compute import compute_bytes, host_inputs_bytes
from runner.memory.kv import (
    CUDA_FA_HEAD_DIMS,
    N_BATCH,
    N_UBATCH,
    OFFLOAD_KQV,
    Attention,
    ContextSize,
    check_kv_type,
    context_size,
    kv_per_layer,
)
from runner.memory.projector import ProjectorMemory
from runner.memory.split import across_workers
from runner.memory.weights import GPU_ALIGNMENT, cuda_size, gpu_start, place_weights, tensor_layer

# not in any buffer, but host memory the process needs (fitted to RSS measured here, see
# host_overhead): a fixed part, per vocabulary entry, per tokenizer string (token or merge)
HOST_OVERHEAD = 5 << 20
HOST_PER_TOKEN = 48
HOST_PER_STRING = 160
HOST_PER_CELL = 160  # llama_kv_cells: pos, shift, a 256-bit sequence set, and std::set nodes once used
GPU_OVERHEAD = 512 << 20  # CUDA context + cuBLAS workspace: a typical figure, not measured here
WORKER_BUFFER = re.compile(r"RPC\d+\[(.+)\]")  # a worker's buffer type, as llama.cpp's log names it
PROJECTOR_KINDS = ("mmproj", "mmproj compute")  # a vision projector's buffers: weights, encoder compute


@dataclass(frozen=True)
class Buffer:
    """One buffer llama.cpp allocates and logs, e.g. ("CPU_Mapped", "model", "cpu", n)."""

    name: str  # the buffer type name in llama.cpp's log: CPU, CPU_Mapped, CPU_REPACK, CUDA0, CUDA_Host
    kind: str  # model, KV, RS, compute, output
    device: str  # cpu or gpu
    nbytes: int


@dataclass(frozen=True)
class DeviceUsage:
    """What one device must hold. On "cpu", weights are the tensors read from the mapping and
    the repacked copies; output is host memory even when the output layer is offloaded."""

    device: str  # "cpu" or "gpu"
    weights_bytes: int
    kv_bytes: int  # KV cache and recurrent state
    compute_bytes: int
    output_bytes: int
    overhead_bytes: int = 0  # in no buffer: vocabulary, work buffer, CUDA context
    projector_bytes: int = 0  # a vision projector's weights, encoder compute and host memory (--mmproj)

    @property
    def total_bytes(self) -> int:
        parts = self.weights_bytes + self.kv_bytes + self.compute_bytes + self.output_bytes
        return parts + self.overhead_bytes + self.projector_bytes


@dataclass(frozen=True)
class Estimate:
    weights_bytes: int
    kv_bytes: int  # KV cache and recurrent state
    compute_bytes: int
    output_bytes: int
    overhead_bytes: int
    devices: tuple[DeviceUsage, ...]
    n_ctx: int  # the context llama.cpp will really have (padded to 256)
    n_gpu_layers: int  # layers on the GPU, the output layer counting as one
    n_layers: int  # repeating layers + 1 for the output layer: what n_gpu_layers counts up to
    buffers: tuple[Buffer, ...] = ()
    exact: bool = True  # False: an architecture or device this estimator only approximates
    # what the process's resident memory grows by: every host buffer, the mapped range whole
    # (mmap populates it), but of a CPU compute buffer only the pages the engine's batches
    # write (one logits row, not n_ubatch): on CPU, compare this with the RAM available
    host_rss_bytes: int = 0
    compute_from_engine: bool = False  # the compute buffers are llama.cpp's own (a dry run), not ours
    projector_bytes: int = 0  # --mmproj: what libmtmd holds for the projector, every device together

    @property
    def total_bytes(self) -> int:
        parts = self.weights_bytes + self.kv_bytes + self.compute_bytes + self.output_bytes
        return parts + self.overhead_bytes + self.projector_bytes

    def device(self, name: str) -> DeviceUsage | None:
        return next((d for d in self.devices if d.device == name), None)


@dataclass(frozen=True)
class Load:
    """What estimate() answers for: the load runner's engine asks llama.cpp for, the model's part
    (n_gpu_layers) and its context's (the rest). The machine's part, the weight types its CPU backend
    repacks and the --rpc workers, is estimate()'s own."""

    n_ctx: int  # every sequence's cells together
    n_gpu_layers: int = 0  # the output layer counting as the last one (n_layers in all); -1: all of them
    n_seq: int = 1
    type_k: str = "f16"
    type_v: str = "f16"
    flash_attn: bool | None = None  # None: llama.cpp's "auto"; False: off (the V cache is then transposed)
    gpu: bool | None = None  # whether llama.cpp has a GPU device; None: n_gpu_layers != 0
    # the most rows of logits one decode will ask for, where more than a row per sequence (a prompt
    # scored, `echo`; `bench --quality`'s chunk halves): llama.cpp grows the output buffer to that many
    # rows at that decode (output_reserve), and keeps it
    output_rows: int = 0
    # a vision projector libmtmd loads beside the model (runner.memory.projector), on the device of the
    # GPU layers where there are any (runner asks libmtmd for the GPU only then), else here
    projector: ProjectorMemory | None = None
    n_ubatch: int = N_UBATCH
    n_batch: int = N_BATCH


# -- the estimate -------------------------------------------------------------------------------


def auto_flash_attn(hp: Hparams, gpu: bool) -> bool:
    """What flash_attn_type "auto" resolves to (llama-context.cpp:506, resolve_fused_ops)."""
    if not gpu:
        return True  # the CPU backend supports FLASH_ATTN_EXT for every head size
    heads = {hp.head_k, hp.head_v, hp.head_k_swa, hp.head_v_swa}
    return heads <= CUDA_FA_HEAD_DIMS


@dataclass(frozen=True)
class _Resolved:
    """A load as llama.cpp makes it: the header and its hparams, the context's sizes, the first layer
    on the GPU (n_layer + 1: none), whether there is a GPU device, and the attention settings."""

    header: Any
    hp: Hparams
    cs: ContextSize
    start: int
    gpu: bool
    attn: Attention


def estimate(
    header: Any,
    load: Load,
    *,
    repack_types: frozenset[str] = REPACK_TYPES,
    workers: tuple[tuple[str, float], ...] = (),
) -> Estimate:
    """Memory llama.cpp allocates to load this model and create the context `load` asks for (Load:
    the offload, the context and its cache, flash attention, the output rows, a vision projector).

    repack_types: the weight types the CPU backend repacks on this machine (REPACK_TYPES:
    x86-64 with AVX2; add "Q2_K" with AVX-512).
    workers: (endpoint, share) of the --rpc workers the offloaded layers are split over, in llama.cpp's
    device order, in place of a GPU (runner.memory.split).
    """
    hp = hparams_from_header(header)
    cs = context_size(hp, load.n_ctx, n_seq=load.n_seq, n_batch=load.n_batch, n_ubatch=load.n_ubatch)
    gpu = load.n_gpu_layers != 0 if load.gpu is None else load.gpu
    start = gpu_start(hp.n_layer, load.n_gpu_layers) if gpu else hp.n_layer + 1
    at = _Resolved(header, hp, cs, start, gpu, _attention(hp, gpu, load))
    buffers, resident, touched = _local_buffers(at, bool(workers), repack_types, load.output_rows)
    if gpu and workers:  # the workers' buffers for the GPU's; the host's named as without a GPU
        buffers, resident = _onto_workers(at, workers, buffers, resident)
    projector, offload = load.projector, None  # offload: where a projector's weights go, other than here
    if projector is not None:  # the first GPU-type device: the GPU, else the first worker (ggml-rpc's type)
        offload = (workers[0][0] if workers else "gpu") if gpu and start <= hp.n_layer else None
        buffers += projector_buffers(projector, offload)
    host_extra = host_overhead(hp, cs, flash_attn=at.attn.flash_attn, type_v=at.attn.type_v)
    held = _Held(buffers, resident, projector, offload)
    offloaded = [held.usage(w, 0) for w, _ in workers] if workers else [held.usage("gpu", GPU_OVERHEAD)]
    devices = [held.usage("cpu", host_extra)] + (offloaded if gpu else [])
    return _summed(at, held, devices, touched + host_extra)


def _attention(hp: Hparams, gpu: bool, load: Load) -> Attention:
    """The attention settings the context is made with: flash_attn resolved, whether the V cache is
    transposed, and the cache types checked."""
    type_k, type_v = check_kv_type(load.type_k), check_kv_type(load.type_v)
    fa = auto_flash_attn(hp, gpu) if load.flash_attn is None else load.flash_attn
    v_trans = load.flash_attn is False  # the cache is made before "auto" is resolved (llama-context.cpp:230)
    if type_v not in ("f32", "f16", "bf16") and not fa:
        raise ValueError("a quantized V cache needs flash attention (llama-context.cpp:466)")
    return Attention(flash_attn=fa, v_trans=v_trans, type_k=type_k, type_v=type_v)


def _summed(at: _Resolved, held: _Held, devices: list[DeviceUsage], host: int) -> Estimate:
    """The estimate: every device's parts summed. host: the host's compute bytes a batch touches and
    its memory in no buffer."""
    hp = at.hp
    return Estimate(
        weights_bytes=sum(d.weights_bytes for d in devices),
        kv_bytes=sum(d.kv_bytes for d in devices),
        compute_bytes=sum(d.compute_bytes for d in devices),
        output_bytes=sum(d.output_bytes for d in devices),
        overhead_bytes=sum(d.overhead_bytes for d in devices),
        devices=tuple(devices),
        n_ctx=at.cs.n_ctx,
        n_gpu_layers=hp.n_layer + 1 - at.start if at.gpu else 0,
        n_layers=hp.n_layer + 1,
        buffers=tuple(held.buffers),
        exact=hp.exact_graph and not at.gpu,  # with workers too: each one's compute buffer is approximated
        host_rss_bytes=held.total("cpu", "model", "KV", "RS", "output") + host + devices[0].projector_bytes,
        projector_bytes=sum(d.projector_bytes for d in devices),
    )


def _local_buffers(
    at: _Resolved, workers: bool, repack_types: frozenset[str], output_rows: int
) -> tuple[list[Buffer], dict[str, int], int]:
    """The buffers of this machine's devices (the host and a GPU): weights, state, output and compute;
    the weight bytes each device holds; and the bytes of the host's compute buffers a batch touches."""
    hp, cs, start, attn = at.hp, at.cs, at.start, at.attn
    # a GPU's host buffer type comes first in the CPU's list and stops repacking; ggml-rpc has none,
    # so with workers the layers kept here are repacked as on a CPU-only load (llama-model.cpp:1093)
    buffers, resident = weight_buffers(at.header, hp, start, at.gpu and not workers, repack_types)
    buffers += state_buffers(hp, cs, start, type_k=attn.type_k, type_v=attn.type_v, v_trans=attn.v_trans)
    # output_reserve(n_seq_max) at creation (llama-context.cpp:377, 2116): host memory, pinned
    # when the output layer is offloaded
    out_on_gpu = start <= hp.n_layer
    rows = max(cs.n_seq, output_rows)
    buffers.append(Buffer("CUDA_Host" if out_on_gpu else "CPU", "output", "cpu", hp.n_vocab * rows * 4))
    if at.gpu:
        buffers += _gpu_compute(at)
        touched = sum(b.nbytes for b in buffers if b.kind == "compute" and b.device == "cpu")
    else:
        buffers.append(Buffer("CPU", "compute", "cpu", compute_bytes(hp, cs, attn)))
        touched = compute_bytes(hp, cs, attn, touched=True)
    return buffers, resident, touched


def _onto_workers(
    at: _Resolved, workers: tuple[tuple[str, float], ...], buffers: list[Buffer], resident: dict[str, int]
) -> tuple[list[Buffer], dict[str, int]]:
    """The buffers and resident weights with --rpc workers in place of the GPU (runner.memory.split):
    the workers' buffers for the GPU's, the host's named as without a GPU."""
    on_workers, held = across_workers(at.header, at.hp, at.cs, at.start, workers, at.attn)
    host = [replace(b, name="CPU") if b.name.endswith("_Host") else b for b in buffers if b.device == "cpu"]
    return host + [Buffer(*b) for b in on_workers], {"cpu": resident["cpu"], **held}


@dataclass(frozen=True)
class _Held:
    """Every buffer and the resident weights by device, and a vision projector with where its weights
    go (None: here): what each device holds."""

    buffers: list[Buffer]
    resident: dict[str, int]
    projector: ProjectorMemory | None
    offload: str | None

    def total(self, device: str, *kinds: str) -> int:
        return sum(b.nbytes for b in self.buffers if b.device == device and b.kind in kinds)

    def usage(self, device: str, overhead: int) -> DeviceUsage:
        total = self.total
        state, compute, out = total(device, "KV", "RS"), total(device, "compute"), total(device, "output")
        vision = total(device, *PROJECTOR_KINDS)
        if self.projector is not None and device == "cpu":  # its graph's metadata, an image, its embeddings
            vision += self.projector.host(on_gpu=self.offload is not None)
        return DeviceUsage(device, self.resident[device], state, compute, out, overhead, vision)


def projector_buffers(projector: ProjectorMemory, offload: str | None) -> list[Buffer]:
    """A projector's weights and encoder compute buffers (kinds "mmproj", "mmproj compute"): on the
    offload device (the GPU or a worker) with the image's inputs in a CPU compute buffer, or all here."""
    out = []
    for device, (weights, compute) in projector.placed(offload is not None).items():
        where = offload if device == "gpu" and offload else device
        name = "CPU" if where == "cpu" else "CUDA0" if where == "gpu" else "RPC0"
        out += [Buffer(name, "mmproj", where, weights), Buffer(name, "mmproj compute", where, compute)]
    return [b for b in out if b.nbytes]


def embedding_context_bytes(header: Any, *, n_ctx: int, n_seq: int, flash_attn: bool = False) -> int:
    """What a model's embedding context holds beside its generation context (runner serve creates one
    at the first embedding request: runner.engine.embed.Embedder): a KV cache of n_ctx cells shared by
    every sequence (kv_unified), the compute buffer of an n_ctx-token batch, and the output buffer for
    n_seq sequences (a row of logits and an embedding each: llama-context.cpp output_reserve). Within
    3% of llama.cpp's own figures for SmolLM2 (11.25 + 100.51 + 48.56 MiB)."""
    hp = hparams_from_header(header)
    est = estimate(header, Load(n_ctx=n_ctx, flash_attn=flash_attn))
    output = (hp.n_vocab + hp.n_embd) * n_seq * 4
    return est.kv_bytes + est.compute_bytes + output


def with_compute(est: Estimate, compute: dict[str, int]) -> Estimate:
    """est with llama.cpp's compute buffers (buffer type name -> bytes, as a dry run logs them) in
    place of its own; host buffer types (CPU, CUDA_Host ...) count on "cpu", the others on "gpu".
    The host's resident memory moves by the host compute's change (all of it: a conservative bound
    where only some pages would be touched)."""

    def device_of(name: str) -> str:
        if name == "CPU" or name.endswith("_Host"):
            return "cpu"
        worker = WORKER_BUFFER.fullmatch(name)  # RPC0[127.0.0.1:50052]
        return worker.group(1) if worker else "gpu"

    have = {d.device for d in est.devices}
    mine = [Buffer(n, "compute", device_of(n), size) for n, size in compute.items() if device_of(n) in have]
    buffers = [b for b in est.buffers if b.kind != "compute"] + mine

    def on(device: str) -> int:
        return sum(b.nbytes for b in mine if b.device == device)

    devices = tuple(replace(d, compute_bytes=on(d.device)) for d in est.devices)
    cpu = est.device("cpu")
    moved = on("cpu") - (cpu.compute_bytes if cpu else 0)
    return replace(
        est,
        buffers=tuple(buffers),
        devices=devices,
        compute_bytes=sum(d.compute_bytes for d in devices),
        host_rss_bytes=est.host_rss_bytes + moved if est.host_rss_bytes else 0,
        compute_from_engine=True,
    )


# -- llama.cpp's buffers by device, and the host memory in none ---------------------------------


def weight_buffers(
    header: Any, hp: Hparams, start: int, gpu: bool, repack_types: frozenset[str] = REPACK_TYPES
) -> tuple[list[Buffer], dict[str, int]]:
    """The model buffers llama_model::load_tensors() logs (llama-model.cpp:1930), and the weight
    bytes each device must hold: of CPU_Mapped only the tensors read from the mapping, since
    its range also spans the repacked and offloaded tensors, pages the kernel can drop."""
    mapped, repack, on_gpu = place_weights(header, hp, start, gpu, repack_types)
    buffers = []
    if mapped:
        first = min(t.offset for t in mapped)
        last = max(t.offset + t.nbytes for t in mapped)
        buffers.append(Buffer("CPU_Mapped", "model", "cpu", last - first))
    if repack:
        buffers.append(Buffer("CPU_REPACK", "model", "cpu", repack))
    if on_gpu:
        buffers.append(Buffer("CUDA0", "model", "gpu", on_gpu))
    resident = {"cpu": sum(t.nbytes for t in mapped) + repack, "gpu": on_gpu}
    return buffers, resident


def state_buffers(
    hp: Hparams, cs: ContextSize, start: int, *, type_k: str, type_v: str, v_trans: bool
) -> list[Buffer]:
    """The KV cache and recurrent state buffers, one per cache and device as llama.cpp logs them:
    a layer's state lives with the layer (offload_kqv), layers from start on the GPU."""
    entries = kv_per_layer(hp, cs, type_k=type_k, type_v=type_v, v_trans=v_trans)
    buffers = []
    for cache in ("KV", "KV_SWA", "RS"):
        for name, device in (("CPU", "cpu"), ("CUDA0", "gpu")):
            sizes = [
                b
                for il, c, b in entries
                if c == cache and ((il >= start and OFFLOAD_KQV) == (device == "gpu"))
            ]
            if sizes:
                buffers.append(Buffer(name, cache[:2], device, sum(sizes)))
    return buffers


def host_overhead(hp: Hparams, cs: ContextSize, *, flash_attn: bool = True, type_v: str = "f16") -> int:
    """Host memory in no llama.cpp buffer: tensor metadata, the vocabulary (ids, strings, merge
    ranks, piece cache), the KV cells' bookkeeping, and the CPU backend's work buffer
    (ggml_graph_plan, ggml-cpu.c): a matmul's input converted to the weight's dot-product type,
    for the widest input of a ubatch, or without flash attention the softmaxed KQ converted
    to f16 for the multiplication by V. Fitted to the RSS of SmolLM2 and the synthetic
    models at full contexts (scripts/bench_memory.py)."""
    n_tokens = min(cs.n_ctx, cs.n_ubatch)
    widest = max([hp.n_embd, *hp.n_ff, hp.n_ff_exp * max(hp.n_expert_used, 1)])
    work = int(widest * n_tokens * hp.dot_bytes)
    if not flash_attn and type_v != "f32" and hp.attn_layers():
        work = max(work, cs.n_ctx_seq * n_tokens * max(hp.n_head) * 2)
    n_caches = (1 if hp.attn_layers() else 0) + (1 if hp.swa_any else 0)
    cells = n_caches * cs.n_ctx * HOST_PER_CELL  # a full context: every cell in use
    return HOST_OVERHEAD + work + cells + hp.n_vocab * HOST_PER_TOKEN + hp.vocab_strings * HOST_PER_STRING


def _gpu_compute(at: _Resolved) -> list[Buffer]:
    """Compute buffers with a CUDA device: an approximation, not checked against a GPU.

    The layers on the GPU run there, the graph inputs and the token embeddings stay in
    pinned host memory (CUDA_Host) and are copied over. With op_offload (default on) a
    ubatch of 32 tokens or more also runs the matmuls of CPU layers on the GPU, copying
    their weights into the GPU compute buffer: the largest such weight is added to it.
    """
    header, hp, cs, start = at.header, at.hp, at.cs, at.start
    host = host_inputs_bytes(hp, cs, flash_attn=at.attn.flash_attn, v_trans=at.attn.v_trans)
    full = compute_bytes(hp, cs, at.attn, alignment=GPU_ALIGNMENT)
    buffers = []
    if start <= hp.n_layer:
        gpu = full
        cpu_weights = [t.nbytes for t in header.tensors if 0 <= tensor_layer(t.name, hp.n_layer) < start]
        if cpu_weights and min(cs.n_ctx, cs.n_ubatch) >= 32:
            gpu += max(cpu_weights)
        buffers.append(Buffer("CUDA0", "compute", "gpu", gpu))
        if start > 0:  # CPU layers: their activations on the host
            host += full - hp.n_vocab_out * min(cs.n_ctx, cs.n_ubatch) * 4
    else:  # the output layer and every repeating layer on the CPU
        host = full
        out = header.tensor("output.weight") or header.tensor("token_embd.weight")
        if min(cs.n_ctx, cs.n_ubatch) >= 32 and out is not None:
            n_out = min(cs.n_ctx, cs.n_ubatch)
            buffers.append(Buffer("CUDA0", "compute", "gpu", cuda_size(out) + hp.n_vocab_out * n_out * 4))
    buffers.append(Buffer("CUDA_Host", "compute", "cpu", host))
    return buffers
