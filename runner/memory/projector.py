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
  (clip_encode 4474 -> warmup 3737), else at init (4016) for the warmup image, which for these fixed-size
  projectors is the same image_size x image_size (1373). Flash attention "auto" is tried first
  (3741) and kept where the backend runs it (the CPU always does).
- the graph: build_inp (572: the patch embedding as im2col and a matmul) then the ViT, as models/
  llava.cpp builds it for mlp (n_layer - 1 blocks, the llava projector mm.0 -> GELU -> mm.2) and
  build_vit (337) with models/siglip.cpp's pooling and projection for gemma3, and its pixel shuffle
  (build_patch_merge_permute 901) and mm.model.fc for idefics3, whose every tile and the whole image
  are each one such image_size graph (the warmup size is image_size, 1373). vit_graph() builds it
  node for node in the order ggml visits it (build_attn 770 fixes Q, K, V in that order), and
  graph.py replays ggml-alloc's placement over it, as for the text model's compute buffer.

Beside the buffers, on the host: the graph's metadata buffer clip_ctx keeps (max_nodes 8192 tensors'
overhead and a graph: buf_compute_meta, init_ctx 3724), the preprocessed image (f32) and its copy as
the graph's input, the image's output embeddings (mtmd.cpp 1791), and where the CPU runs the encoder
ggml-cpu's work buffer (work_bytes).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from runner.memory.graph import Ctx, Graph, Tensor, compute_buffer_size, pad
from runner.memory.kv import CPU_ALIGNMENT, CUDA_FA_HEAD_DIMS
from runner.memory.weights import GPU_ALIGNMENT, cuda_size

COMPUTE_META = 8192 * 368 + 330_192  # clip_ctx's buf_compute_meta: ggml_tensor_overhead(), graph overhead
HOST_FIXED = 768 << 10  # the rest of libmtmd's first load and encode: fitted to the test projectors' RSS


@dataclass(frozen=True)
class ProjectorMemory:
    """A projector's memory, for either place the plan may put it (on_gpu: the device of the plan's
    GPU layers, else the CPU). Weights are the buffer's bytes (padded); tensor_bytes what libmtmd logs."""

    projector_type: str
    image_tokens: int
    image_size: int
    tensor_bytes: int  # every tensor, unpadded: libmtmd's "model size"
    weights_cpu: int  # the weights' buffer on the CPU
    weights_gpu: int  # the same in a CUDA buffer
    compute_cpu: int  # the encoder's compute buffer, CPU only
    compute_gpu: int  # on the GPU (approximate: not measured on one)
    inputs_gpu_host: int  # with the GPU, the CPU's compute buffer: the graph's inputs (the image)
    host_bytes: int  # in no buffer: graph metadata, the image (twice, f32), its embeddings
    work_cpu: int = 0  # in no buffer, where the CPU runs the encoder: ggml-cpu's work buffer

    def host(self, on_gpu: bool) -> int:
        """Host memory in no buffer: the work buffer only where the CPU runs the graph."""
        return self.host_bytes + (0 if on_gpu else self.work_cpu)

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


@dataclass(frozen=True)
class Vit:
    """What the graph of one image depends on, from the projector's header."""

    kind: str  # mlp, gemma3 or idefics3
    image: int
    patch: int
    n_embd: int
    n_head: int
    n_head_kv: int
    d_head: int
    n_ff: int
    n_layer: int
    width: int  # the projection's output: the text model's n_embd
    merge: int  # gemma3's pooling kernel, idefics3's pixel shuffle
    feature_layers: tuple[int, ...]
    present: frozenset[str]  # tensor names, for the optional biases and norms
    conv_type: str  # the patch embedding's type ("f16" or "f32"): im2col writes f16 unless bf16
    proj_type: str  # gemma3's input projection's type: its transposed copy is that type
    mlp_hidden: int  # mlp: mm.0's output width


def vit_of(header: Any, info: Any) -> Vit:
    meta = header.metadata
    e, n_head = meta["clip.vision.embedding_length"], meta["clip.vision.attention.head_count"]
    d_head = meta.get("clip.vision.attention.head_dim") or e // n_head

    def type_of(name: str) -> str:
        t = header.tensor(name)
        return t.type_name.lower() if t is not None else "f32"

    return Vit(
        kind=info.projector_type,
        image=info.image_size,
        patch=info.patch_size,
        n_embd=e,
        n_head=n_head,
        n_head_kv=meta.get("clip.vision.attention.head_count_kv", n_head),
        d_head=d_head,
        n_ff=meta["clip.vision.feed_forward_length"],
        n_layer=meta["clip.vision.block_count"],
        width=info.projection_width,
        merge=meta.get("clip.vision.projector.scale_factor", 4 if info.projector_type == "gemma3" else 1),
        feature_layers=tuple(meta.get("clip.vision.feature_layer") or ()),
        present=frozenset(t.name for t in header.tensors),
        conv_type=type_of("v.patch_embd.weight"),
        proj_type=type_of("mm.input_projection.weight"),
        mlp_hidden=mm0.shape[1] if (mm0 := header.tensor("mm.0.weight")) is not None else 0,
    )


class _Vit:
    """One clip_graph: the shared pieces of clip.cpp's builders, over graph.py's ops."""

    def __init__(self, vit: Vit, flash_attn: bool) -> None:
        self.v, self.fa = vit, flash_attn
        self.c, self.g = Ctx(), Graph()
        self.n_side = vit.image // vit.patch
        self.n_patches = self.n_side * self.n_side

    def w(self, name: str, *ne: int) -> Tensor | None:
        return self.c.weight(ne, name=name) if name in self.v.present else None

    def add(self, x: Tensor, b: Tensor | None) -> Tensor:
        return self.c.unary("ADD", x, b) if b is not None else x

    def norm(self, x: Tensor, prefix: str) -> Tensor:
        """build_norm (589, NORM_TYPE_NORMAL): the norm, times its weight, plus its bias, where the file
        has them."""
        e = x.ne[0]
        x = self.c.unary("NORM", x)
        if (w := self.w(f"{prefix}.weight", e)) is not None:
            x = self.c.unary("MUL", x, w)
        return self.add(x, self.w(f"{prefix}.bias", e))

    def linear(self, prefix: str, x: Tensor, n_out: int) -> Tensor:
        w = self.c.weight((x.ne[0], n_out), name=f"{prefix}.weight")
        return self.add(self.c.mul_mat(w, x), self.w(f"{prefix}.bias", n_out))

    def inp(self) -> Tensor:
        """build_inp (572): the image, im2col'd into patches, times the patch embedding, transposed."""
        c, v, p, n = self.c, self.v, self.v.patch, self.n_side
        raw = c.input("f32", (v.image, v.image, 3, 1), name="inp_raw")
        kernel = c.weight((p, p, 3, v.n_embd), dtype=v.conv_type, name="v.patch_embd.weight")
        cols = c.new("f32" if v.conv_type == "bf16" else "f16", (3 * p * p, n, n, 1), "IM2COL", (kernel, raw))
        out = c.mul_mat(c.reshape(cols, 3 * p * p, n * n), c.reshape(kernel, 3 * p * p, v.n_embd))
        out = c.reshape(out, n, n, 1, v.n_embd)
        out = c.cont(c.permute(out, 0, 1, 3, 2))  # conv_2d's result [n, n, E, 1]
        out = c.reshape(out, self.n_patches, v.n_embd, 1)
        out = c.cont(c.transpose(out))
        return self.add(out, self.w("v.patch_embd.bias", v.n_embd))

    def attn(self, blk: str, x: Tensor, n_pos: int) -> Tensor:
        """Q, K, V, then build_attn (770): flash attention with K and V cast to f16, or softmax(KQ)V."""
        c, v = self.c, self.v
        heads_kv = v.n_head_kv if v.kind != "mlp" else v.n_head
        q = self.linear(f"{blk}.attn_q", x, v.n_head * v.d_head)
        k = self.linear(f"{blk}.attn_k", x, heads_kv * v.d_head)
        val = self.linear(f"{blk}.attn_v", x, heads_kv * v.d_head)
        q = c.reshape(q, v.d_head, v.n_head, n_pos, 1)
        k = c.reshape(k, v.d_head, heads_kv, n_pos, 1)
        val = c.reshape(val, v.d_head, heads_kv, n_pos, 1)
        for t in (q, k, val):  # ggml_build_forward_order: these three first, in this order
            self.g.expand(t)
        q, k = c.permute(q, 0, 2, 1, 3), c.permute(k, 0, 2, 1, 3)
        if self.fa:
            val = self.cast(c.permute(val, 0, 2, 1, 3))
            k = self.cast(k)
            out = c.new("f32", (val.ne[0], q.ne[2], q.ne[1], 1), "FLASH_ATTN_EXT", (q, k, val))
            out = c.reshape(out, out.ne[0] * out.ne[1], out.ne[2] * out.ne[3])
        else:
            val = c.cont(c.permute(val, 1, 2, 0, 3))
            kq = c.unary("SOFT_MAX", c.mul_mat(k, q))
            kqv = c.permute(c.mul_mat(val, kq), 0, 2, 1, 3)
            out = c.cont(kqv, (kqv.ne[0] * kqv.ne[1], kqv.ne[2] * kqv.ne[3]))
        return self.linear(f"{blk}.attn_out", out, v.n_embd)

    def cast(self, a: Tensor) -> Tensor:
        """ggml_cast to f16: a new tensor whose second source is itself (ggml.c ggml_cast)."""
        t = self.c.new("f16", a.ne, "CPY", (a,))
        t.src = (a, t)
        return t

    def ffn(self, blk: str, x: Tensor) -> Tensor:
        """build_ffn (617): up, the gate where there is one, the activation, down."""
        c, v = self.c, self.v
        up = self.linear(f"{blk}.ffn_up", x, v.n_ff)
        if f"{blk}.ffn_gate.weight" in v.present:
            gate = self.linear(f"{blk}.ffn_gate", x, v.n_ff)
            cur = c.new("f32", gate.ne, "GLU", (gate, up))
        else:
            cur = c.unary("UNARY", up)
        return self.linear(f"{blk}.ffn_down", cur, v.n_embd)

    def block(self, il: int, x: Tensor, n_pos: int) -> Tensor:
        blk = f"v.blk.{il}"
        cur = self.c.unary("ADD", self.attn(blk, self.norm(x, f"{blk}.ln1"), n_pos), x)
        return self.c.unary("ADD", cur, self.ffn(blk, self.norm(cur, f"{blk}.ln2")))

    def llava(self) -> Tensor:
        """models/llava.cpp for the mlp projector."""
        c, v = self.c, self.v
        x = self.inp()
        cls = self.w("v.class_embd", v.n_embd)
        if cls is not None:
            x = c.new("f32", (v.n_embd, x.ne[1] + 1), "CONCAT", (x, cls))
        n_pos = x.ne[1]
        positions = c.input("i32", (n_pos,), name="positions")
        pos_rows = c.weight((v.n_embd, n_pos), name="v.position_embd.weight")
        x = c.unary("ADD", x, c.get_rows(pos_rows, positions))
        if "v.pre_ln.weight" in v.present:
            x = self.norm(x, "v.pre_ln")
        deepest = max(v.feature_layers, default=-1)
        last = deepest if deepest >= 0 else v.n_layer - 1
        stack = []
        for il in range(last):
            if il in v.feature_layers:
                stack.append(x)
            x = self.block(il, x, n_pos)
        if "v.post_ln.weight" in v.present:
            x = self.norm(x, "v.post_ln")
        if last in v.feature_layers:
            stack.append(x)
        if stack:
            x = stack[0]
            for more in stack[1:]:
                x = c.new("f32", (x.ne[0] + more.ne[0], x.ne[1]), "CONCAT", (x, more))
        x = c.reshape(x, x.ne[0], x.ne[1])
        patches = c.input("i32", (self.n_patches,), name="patches")
        x = c.get_rows(x, patches)
        x = c.unary("UNARY", self.linear("mm.0", x, v.mlp_hidden))  # GELU
        return self.linear("mm.2", x, v.width)

    def vit(self) -> Tensor:
        """build_vit (337), with the learned position embeddings added as they are."""
        c, v = self.c, self.v
        x = c.unary("ADD", self.inp(), c.weight((v.n_embd, self.n_patches), name="v.position_embd.weight"))
        x = c.reshape(x, v.n_embd, self.n_patches)
        if "v.pre_ln.weight" in v.present:
            x = self.norm(x, "v.pre_ln")
        for il in range(v.n_layer):
            x = self.block(il, x, self.n_patches)
        if "v.post_ln.weight" in v.present:
            x = self.norm(x, "v.post_ln")
        return c.reshape(x, v.n_embd, self.n_patches, 1)

    def idefics3(self) -> Tensor:
        """models/siglip.cpp's idefics3: the pixel shuffle (build_patch_merge_permute 901; check_projector
        made the side a multiple of the scale, so nothing is padded), then mm.model.fc."""
        c, v, n, s = self.c, self.v, self.n_side, self.v.merge
        x = c.reshape(self.vit(), v.n_embd, n, n)
        x = c.permute(c.reshape(x, v.n_embd * s, n // s, n), 0, 2, 1, 3)
        x = c.permute(c.cont(x, (v.n_embd * s * s, n // s, n // s)), 0, 2, 1, 3)
        x = c.cont(x, (x.ne[0], x.ne[1] * x.ne[2]))
        return c.mul_mat(c.weight((x.ne[0], v.width), name="mm.model.fc.weight"), x)

    def siglip(self) -> Tensor:
        """build_vit (337) and models/siglip.cpp's gemma3 projection."""
        c, v, n = self.c, self.v, self.n_side
        x = self.vit()
        x = c.cont(c.transpose(x), (n, n, v.n_embd, 1))
        side = (n - v.merge) // v.merge + 1
        x = c.new("f32", (side, side, v.n_embd, 1), "POOL_2D", (x,))
        x = c.reshape(x, side * side, v.n_embd, 1)
        x = c.cont(c.transpose(x))
        x = c.unary("MUL", c.unary("RMS_NORM", x), c.weight((v.n_embd,), name="mm.soft_emb_norm.weight"))
        proj = c.weight((v.width, v.n_embd), dtype=self.v.proj_type, name="mm.input_projection.weight")
        return c.mul_mat(c.cont(c.transpose(proj)), x)

    def build(self) -> Graph:
        builders = {"mlp": self.llava, "gemma3": self.siglip, "idefics3": self.idefics3}
        out = builders[self.v.kind]()
        self.g.expand(out)
        return self.g


def vit_graph(vit: Vit, flash_attn: bool = True) -> Graph:
    """The graph clip.cpp reserves for one image through this projector."""
    return _Vit(vit, flash_attn).build()


def weight_bytes(header: Any, gpu: bool) -> int:
    """The weights' buffer: every tensor, padded as its buffer type pads (CPU: 32 bytes; CUDA: 128,
    quantized rows to 512 elements)."""
    if gpu:
        return sum(cuda_size(t) for t in header.tensors)
    return sum(pad(t.nbytes, CPU_ALIGNMENT) for t in header.tensors)


def work_bytes(header: Any, n_pos: int, merge: int = 1) -> int:
    """ggml-cpu's work buffer for the encoder (ggml_graph_plan, ggml-cpu.c): a matmul converts its
    input to the weight's dot-product type (f16 and bf16: 2 bytes an element; a quantized weight's
    Q8_0/Q8_1/Q8_K: at most 1.14), for the widest input of n_pos rows (idefics3's mm.model.fc: n_pos /
    merge**2 rows, merge**2 times as wide); f32 weights convert nothing."""
    widest = 0.0
    for t in header.tensors:
        if len(t.shape) != 2 or t.type_name == "F32" or not t.name.startswith(("v.blk.", "mm.")):
            continue
        rows = n_pos // (merge * merge) if t.name == "mm.model.fc.weight" else n_pos
        widest = max(widest, t.shape[0] * rows * (2 if t.type_name in ("F16", "BF16") else 292 / 256))
    return int(widest)


def estimate_projector(header: Any, info: Any) -> ProjectorMemory:
    """What libmtmd allocates for this projector (header: runner.gguf.read_header's; info: its
    runner.gguf.check_projector), on the CPU and on a GPU."""
    vit = vit_of(header, info)
    cpu = compute_buffer_size(vit_graph(vit), CPU_ALIGNMENT)
    fa_on_gpu = vit.d_head in CUDA_FA_HEAD_DIMS  # else warmup falls back to softmax(KQ)V (3746-3762)
    gpu = compute_buffer_size(vit_graph(vit, flash_attn=fa_on_gpu), GPU_ALIGNMENT)
    n_patches = (vit.image // vit.patch) ** 2
    n_pos = n_patches + (vit.kind == "mlp" and "v.class_embd" in vit.present)
    image = 3 * vit.image * vit.image * 4  # the preprocessed image, f32: the graph's input inp_raw
    inputs = [image, n_pos * 4, n_patches * 4] if vit.kind == "mlp" else [image]  # mlp: positions, patches
    # idefics3: the whole image and up to ceil(preproc_image_size / image_size)**2 tiles of it, each
    # preprocessed and kept in its chunk (mtmd-image.cpp 1076)
    longest = header.metadata.get("clip.vision.preproc_image_size", 0) if vit.kind == "idefics3" else 0
    tiles = (-(-longest // vit.image)) ** 2 if longest else 0
    # the image preprocessed (kept in its chunk) and copied plane by plane for the input (clip_encode
    # 4596), the embeddings the encode writes (mtmd.cpp 1791), the graph's metadata, the fixed rest
    host = (2 + tiles) * image + info.image_tokens * info.projection_width * 4 + COMPUTE_META + HOST_FIXED
    return ProjectorMemory(
        projector_type=info.projector_type,
        image_tokens=info.image_tokens,
        image_size=info.image_size,
        tensor_bytes=sum(t.nbytes for t in header.tensors),
        weights_cpu=weight_bytes(header, gpu=False),
        weights_gpu=weight_bytes(header, gpu=True),
        compute_cpu=cpu,
        compute_gpu=gpu,
        inputs_gpu_host=sum(pad(n, CPU_ALIGNMENT) for n in inputs),
        host_bytes=host,
        work_cpu=work_bytes(header, n_pos, vit.merge if vit.kind == "idefics3" else 1),
    )
