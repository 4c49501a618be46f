"""What libmtmd allocates for a vision projector (an mmproj GGUF): its weights and its encoder's compute
buffer, on the device it puts them, before anything loads.

The pinned clip.cpp (tools/mtmd/clip.cpp of llama-cpp-python 0.3.36; line numbers are its):

- where: clip_ctx (181-222) takes the first GPU device when asked to use the GPU (runner asks where the
  plan put layers on the GPU: runner.engine.engine.Engine.attach_projector), else the CPU; the weights
  all go into one buffer of that device's default type (load_tensors 3642: ggml_backend_alloc_ctx_
  tensors_from_buft, each tensor padded to the buffer's alignment). The log's "model size" (1244,
  2125) is every tensor's bytes, unpadded.
- the compute buffer: ggml_backend_sched over [that device, the CPU] (221) reserves the graph of one
  image (reserve_compute_meta 3805) at the first encode when warmup is off, as runner has it
  (clip_encode 4474 -> warmup 3737), else at init (4016) for the warmup image, which for the fixed-size
  projectors is the same image_size x image_size (1373). Flash attention "auto" is tried first
  (3741) and kept where the backend runs it (the CPU always does). A Qwen projector takes each image at
  its own size, and a larger one later grows the buffer (ggml_backend_sched_alloc_graph, 4487): the
  estimate is for the largest (estimate_projector says why).
- the graph: clip_graph.py builds it node for node, for each kind as clip.cpp does, in the order
  ggml visits it, and graph.py replays ggml-alloc's placement over it, as for the text model's
  compute buffer. idefics3's every tile and the whole image are each one image_size graph.

Beside the buffers, on the host: the graph's metadata buffer clip_ctx keeps (max_nodes 8192 tensors'
overhead and a graph: buf_compute_meta, init_ctx 3724), the preprocessed image (f32) and its copy as
the graph's input, Qwen2.5-VL's window mask as clip_encode fills it, the image's output embeddings
(mtmd.cpp 1791), and where the CPU runs the encoder ggml-cpu's work buffer (work_bytes).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from runner.memory.clip_graph import ClipGraph, Vit, vit_of
from runner.memory.graph import Graph, compute_buffer_size, pad
from runner.memory.kv import CPU_ALIGNMENT, CUDA_FA_HEAD_DIMS
from runner.memory.weights import GPU_ALIGNMENT, cuda_size

COMPUTE_META = 8192 * 368 + 330_192  # clip_ctx's buf_compute_meta: ggml_tensor_overhead(), graph overhead
HOST_FIXED = 768 << 10  # the rest of libmtmd's first load and encode: fitted to the test projectors' RSS


@dataclass(frozen=True)
class ProjectorMemory:
    """A projector's memory, for either place the plan may put it (on_gpu: the device of the plan's
    GPU layers, else the CPU). Weights are the buffer's bytes (padded); tensor_bytes what libmtmd logs."""

    projector_type: str
    image_tokens: int  # one image of image_size x image_size px (idefics3: one tile of it)
    image_size: int
    tensor_bytes: int  # every tensor, unpadded: libmtmd's "model size"
    weights_cpu: int  # the weights' buffer on the CPU
    weights_gpu: int  # the same in a CUDA buffer
    compute_cpu: int  # the encoder's compute buffer, CPU only
    compute_gpu: int  # on the GPU (approximate: not measured on one)
    inputs_gpu_host: int  # with the GPU, the CPU's compute buffer: the graph's inputs (the image)
    host_bytes: int  # in no buffer: graph metadata, the image (twice, f32), its embeddings
    work_cpu: int = 0  # in no buffer, where the CPU runs the encoder: ggml-cpu's work buffer
    inputs_host: int = 0  # in no buffer until the inputs are set (Qwen2.5-VL's window mask)
    tiles: int = 0  # idefics3: the most tiles an image is cut into, each image_tokens, and the whole image
    sized: bool = False  # each image at its own size (Qwen's): image_size and image_tokens are the most
    audio_tokens: int = 0  # an audio encoder's (an audio or omni projector): what 30 s of audio cost
    minute_tokens: int = 0  # and what a minute costs (not always twice 30 s: qwen3a's 8 s windows)

    @property
    def most_tokens(self) -> int:
        """The most image tokens one image becomes (idefics3: its tiles and the whole image)."""
        return self.image_tokens * (self.tiles + 1 if self.tiles else 1)

    def per_image(self) -> str:
        """What one image (or, with no vision encoder, 30 s and a minute of audio) costs in the text
        model's context, as fit and show say it; an omni projector's: both."""
        return costs(self.image_tokens, self.image_size, self.tiles, self.sized, self.minute_tokens)

    def host(self, on_gpu: bool) -> int:
        """Host memory in no buffer: the work buffer only where the CPU runs the graph. inputs_host
        lives while clip_encode sets the inputs: beside the CPU's buffer with the GPU; on the CPU alone
        beside only the inputs' pages of the compute buffer (the rest untouched yet), and gone before
        the graph writes the rest and the work buffer: the peak is the larger of the two moments."""
        if on_gpu:
            return self.host_bytes + self.inputs_host
        setting = self.inputs_gpu_host + self.inputs_host - self.compute_cpu  # the inputs: in the buffer
        return self.host_bytes + max(self.work_cpu, setting)

    @property
    def weights_bytes(self) -> int:
        return self.weights_cpu

    @property
    def compute_bytes(self) -> int:
        return self.compute_cpu

    def placed(self, on_gpu: bool) -> dict[str, tuple[int, int]]:
        """(weights, compute) by device, "cpu" and "gpu" (the caller names the offload device)."""
        if not on_gpu:
            return {"cpu": (self.weights_cpu, self.compute_cpu)}
        return {"cpu": (0, self.inputs_gpu_host), "gpu": (self.weights_gpu, self.compute_gpu)}


def costs(image_tokens: int, image_size: int, tiles: int, sized: bool, minute_tokens: int = 0) -> str:
    """ProjectorMemory.per_image from its numbers (show --json carries them): an image's cost; an
    audio projector's (image_size 0: image_tokens are 30 s of audio, runner.memory.audio_projector)
    what 30 s and a minute cost; an omni projector's both."""
    if image_size == 0:
        minute = minute_tokens or 2 * image_tokens
        return f"{image_tokens:,} audio tokens every 30 s of audio, {minute:,} a minute"
    image = per_image(image_tokens, image_size, tiles, sized)
    return f"{image}; {minute_tokens:,} audio tokens a minute of audio" if minute_tokens else image


def per_image(image_tokens: int, image_size: int, tiles: int, sized: bool) -> str:
    """What one image costs through an image projector."""
    side = f"{image_size} x {image_size} px"
    if sized:
        return f"up to {image_tokens:,} image tokens an image (sized as it comes, up to {side})"
    if tiles:
        most = image_tokens * (tiles + 1)
        cut = f"{tiles} tiles" if tiles > 1 else "1 tile"
        whole = f"the whole image, {image_tokens:,} each"
        return f"up to {most:,} image tokens an image (up to {cut} of {side} and {whole})"
    return f"{image_tokens:,} image tokens an image of {side}"


def weight_bytes(header: Any, gpu: bool) -> int:
    """The weights' buffer: every tensor, padded as its buffer type pads (CPU: 32 bytes; CUDA: 128,
    quantized rows to 512 elements)."""
    if gpu:
        return sum(cuda_size(t) for t in header.tensors)
    return sum(pad(t.nbytes, CPU_ALIGNMENT) for t in header.tensors)


def work_bytes(header: Any, n_pos: int, merge: int = 1, merged: tuple[str, ...] = ("mm.model.fc.",)) -> int:
    """ggml-cpu's work buffer for the encoder (ggml_graph_plan, ggml-cpu.c): a matmul converts its
    input to the weight's dot-product type (f16 and bf16: 2 bytes an element; a quantized weight's
    Q8_0/Q8_1/Q8_K: at most 1.14), for the widest input of n_pos rows (the merged: n_pos / merge**2
    rows, merge**2 times as wide: idefics3's mm.model.fc, Qwen's merger mm.*); f32 weights convert
    nothing."""
    widest = 0.0
    for t in header.tensors:
        if len(t.shape) != 2 or t.type_name == "F32" or not t.name.startswith(("v.blk.", "mm.")):
            continue
        rows = n_pos // (merge * merge) if t.name.startswith(merged) else n_pos
        widest = max(widest, t.shape[0] * rows * (2 if t.type_name in ("F16", "BF16") else 292 / 256))
    return int(widest)


def vit_graph(vit: Vit, flash_attn: bool = True, image: tuple[int, int] | None = None) -> Graph:
    """The graph clip.cpp reserves for one image through this projector: by default the image the
    plan counts (vit.image square), else an image of (width, height) pixels as preprocessed (a Qwen
    projector's are any multiple of 2 x 2 patches: scripts/bench_projector_memory.py qwen_size)."""
    return ClipGraph(vit, flash_attn, *(image or (0, 0))).build()


def estimate_projector(header: Any, info: Any) -> ProjectorMemory:
    """What libmtmd allocates for this projector (header: runner.gguf.read_header's; info: its
    runner.gguf.check_projector), on the CPU and on a GPU.

    A Qwen (M-RoPE) projector takes each image at its own size, and its compute buffer grows with it:
    with warmup off, ggml_backend_sched reserves for the first image encoded and grows for a larger
    one. So the estimate (image_tokens, image_size, the buffers, the host's share) is for the largest
    image libmtmd lets through, 4,096 tokens (vit_of: 1792 x 1792 px for patches of 14): what a user
    needs to know fits, whichever image comes first or is largest. For Qwen2.5-VL the window
    attention's mask of every pair of patches dominates it (n_patches**2 f32, then f16 copies: 1.5 GiB
    at 16,384 patches whatever the model's width), and its host copy adds 1 GiB while it is set
    (ProjectorMemory.host counts it where it coincides with the rest). A 1024 x 768 photo
    (37 x 27 tokens) takes about a quarter of the largest's buffer for Qwen2-VL, 1/9 (width 1280) to
    1/16 (width 32) for Qwen2.5-VL: scripts/bench_projector_memory.py measures both.
    """
    vit = vit_of(header, info)
    cpu = compute_buffer_size(vit_graph(vit), CPU_ALIGNMENT)
    fa_on_gpu = vit.d_head in CUDA_FA_HEAD_DIMS  # else warmup falls back to softmax(KQ)V (3746-3762)
    gpu = compute_buffer_size(vit_graph(vit, flash_attn=fa_on_gpu), GPU_ALIGNMENT)
    n_patches = (vit.image // vit.patch) ** 2
    n_pos = n_patches + (vit.kind == "mlp" and "v.class_embd" in vit.present)
    image = 3 * vit.image * vit.image * 4  # the preprocessed image, f32: the graph's input inp_raw
    inputs = [image, n_pos * 4, n_patches * 4] if vit.kind == "mlp" else [image]  # mlp: positions, patches
    image_tokens, windows = info.image_tokens, 0
    if vit.mrope:  # 4 positions a patch; Qwen2.5-VL: the window order both ways and the mask (4937-4994)
        image_tokens = n_patches // (vit.merge * vit.merge)
        windows = n_patches * n_patches * 4 if vit.wa_pattern else 0
        inputs += [n_patches * 16] + ([windows, image_tokens * 4, image_tokens * 4] if windows else [])
    # idefics3: the whole image and up to ceil(preproc_image_size / image_size)**2 tiles of it, each
    # preprocessed and kept in its chunk (mtmd-image.cpp 1076)
    longest = header.metadata.get("clip.vision.preproc_image_size", 0) if vit.kind == "idefics3" else 0
    tiles = (-(-longest // vit.image)) ** 2 if longest else 0
    # the image preprocessed (kept in its chunk) and copied plane by plane for the input (clip_encode
    # 4596), the embeddings the encode writes (mtmd.cpp 1791), the graph's metadata, the fixed rest
    embeddings = image_tokens * info.projection_width * 4
    host = (2 + tiles) * image + embeddings + COMPUTE_META + HOST_FIXED
    merged = ("mm.",) if vit.mrope else ("mm.model.fc.",)
    return ProjectorMemory(
        projector_type=info.projector_type,
        image_tokens=image_tokens,
        image_size=vit.image,
        tensor_bytes=sum(t.nbytes for t in header.tensors),
        weights_cpu=weight_bytes(header, gpu=False),
        weights_gpu=weight_bytes(header, gpu=True),
        compute_cpu=cpu,
        compute_gpu=gpu,
        inputs_gpu_host=sum(pad(n, CPU_ALIGNMENT) for n in inputs),
        host_bytes=host,
        work_cpu=work_bytes(header, n_pos, vit.merge, merged),
        inputs_host=windows,  # Qwen2.5-VL's mask as clip_encode fills it (4961), until it is set
        tiles=tiles,
        sized=vit.mrope,
    )
