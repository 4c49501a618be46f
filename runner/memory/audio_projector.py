"""What libmtmd allocates for an audio projector, before anything loads: its weights exactly (as for a
vision projector: runner.memory.projector.weight_bytes) and its encoder's compute buffer for one
window.

The whisper encoders' window (models/whisper-enc.cpp): 3000 mel frames in, two 1-D convolutions
(ggml_conv_1d writes its im2col in F16: frames x mel x 3, then positions x width x 3), then `blocks`
transformer blocks over 1500 positions. ggml-alloc frees a tensor after its last use, so the buffer
is the largest of three moments: the input beside the first im2col; the first convolution's output
beside the second im2col; and one block (the attention's scores, heads x 1500 x 1500 f32, where flash
attention is off, beside Q, K, V and the output, or the FFN's activations). Not a node-for-node
replay, but fitted to libmtmd's own log for the test projector (tests/test_audio.py: 3.66 MiB with
flash attention, 18.08 MiB without).

qwen3a's (models/qwen3a.cpp) is replayed node for node (qwen3a_graph, over runner.memory.clip_graph's
pieces and graph.py's ggml-alloc): its windows differ in length (up to 8 chunks of 100 frames) and
ggml-alloc grows the buffer to the largest one encoded, so the plan is the 8-chunk window's. A
qwen2.5o file holds both encoders, each in its own clip context with its own buffer
(estimate_omni_projector adds the audio one's to the vision one's).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from runner.memory.clip_graph import ClipGraph, Vit
from runner.memory.graph import Graph, Tensor, compute_buffer_size, pad
from runner.memory.kv import CPU_ALIGNMENT
from runner.memory.projector import COMPUTE_META, HOST_FIXED, ProjectorMemory, weight_bytes
from runner.memory.weights import cuda_size

QWEN3A_WINDOW, QWEN3A_CHUNK = 800, 100  # mel frames: runner.gguf.audio_projector's


def window_compute_bytes(info: Any, flash_attn: bool) -> int:
    """The encoder's compute buffer for one window (AudioProjectorInfo `info`)."""
    frames, pos, mel, e, f = 3000, 1500, info.n_mel, info.width, info.n_ff
    conv1 = frames * mel * 4 + frames * mel * 3 * 2  # the input, and its im2col (F16)
    conv2 = frames * e * 4 + pos * e * 3 * 2  # the first convolution's output, and the second im2col
    scores = 0 if flash_attn else info.heads * pos * pos * 4
    block = scores + max(4 * pos * e * 4, pos * f * 4 + 2 * pos * e * 4)
    return pad(max(conv1, conv2, block), CPU_ALIGNMENT)


def estimate_audio_projector(header: Any, info: Any) -> ProjectorMemory:
    """A ProjectorMemory for an audio projector: image_tokens are one window's embeddings, image_size
    0 (no image); host memory holds a window's mel spectrogram (kept in its chunk, then copied as the
    input), its embeddings, and the graph's metadata."""
    qwen3a = info.projector_type == "qwen3a"
    if qwen3a:  # replayed node for node, for its largest window (ggml-alloc grows to it)
        cpu = compute_buffer_size(qwen3a_graph(header, info, flash_attn=True), CPU_ALIGNMENT)
        gpu = compute_buffer_size(qwen3a_graph(header, info, flash_attn=False), CPU_ALIGNMENT)
    else:
        cpu = window_compute_bytes(info, flash_attn=True)
        gpu = window_compute_bytes(info, flash_attn=False)
    mel = (QWEN3A_WINDOW if qwen3a else 3000) * info.n_mel * 4
    host = 2 * mel + info.window_tokens * info.projection_width * 4 + COMPUTE_META + HOST_FIXED
    return ProjectorMemory(
        projector_type=info.projector_type,
        image_tokens=info.clip_tokens(30) if qwen3a else info.window_tokens,  # what 30 s cost
        audio_tokens=info.clip_tokens(30) if qwen3a else info.window_tokens,
        minute_tokens=info.clip_tokens(60) if qwen3a else info.clip_tokens(59.9),  # 59.9: two windows
        image_size=0,
        tensor_bytes=sum(t.nbytes for t in header.tensors),
        weights_cpu=weight_bytes(header, gpu=False),
        weights_gpu=weight_bytes(header, gpu=True),
        compute_cpu=cpu,
        compute_gpu=gpu,
        inputs_gpu_host=pad(mel, CPU_ALIGNMENT),
        host_bytes=host,
    )


def estimate_omni_projector(header: Any, vision: ProjectorMemory, info: Any) -> ProjectorMemory:
    """A file with both encoders (qwen2.5o): libmtmd opens it twice, a clip context for each, and
    each reserves its own compute buffer; `vision` is the vision half's ProjectorMemory (every tensor
    counted once), to which the audio encoder's buffers and host memory are added, and the patch
    kernels the audio context loads too (clip.cpp load_tensors takes v.patch_embd.* whatever the
    modality)."""
    audio = estimate_audio_projector(header, info)
    twice = [t for t in header.tensors if t.name.startswith("v.patch_embd.")]
    return replace(
        vision,
        projector_type=info.projector_type,  # qwen2.5o, whose images cost what the vision half says
        weights_cpu=vision.weights_cpu + sum(pad(t.nbytes, CPU_ALIGNMENT) for t in twice),
        weights_gpu=vision.weights_gpu + sum(cuda_size(t) for t in twice),
        compute_cpu=vision.compute_cpu + audio.compute_cpu,
        compute_gpu=vision.compute_gpu + audio.compute_gpu,
        inputs_gpu_host=vision.inputs_gpu_host + audio.inputs_gpu_host,
        host_bytes=vision.host_bytes + audio.host_bytes,
        audio_tokens=audio.audio_tokens,
        minute_tokens=audio.minute_tokens,
    )


class _Qwen3aGraph(ClipGraph):
    """models/qwen3a.cpp over clip_graph.py's pieces: its blocks are build_vit's, named a.blk.N."""

    def __init__(self, vit: Vit, flash_attn: bool, header: Any, n_mel: int) -> None:
        super().__init__(vit, flash_attn)
        self.shapes = {t.name: tuple(t.shape) for t in header.tensors}
        self.types = {t.name: t.type_name.lower() for t in header.tensors}
        self.n_mel = n_mel

    def block(
        self, il: int, x: Tensor, n_pos: int, positions: Tensor | None = None, mask: Tensor | None = None
    ) -> Tensor:
        blk = f"a.blk.{il}"
        cur = self.c.unary("ADD", self.attn(blk, self.norm(x, f"{blk}.ln1"), n_pos), x)
        return self.c.unary("ADD", cur, self.ffn(blk, self.norm(cur, f"{blk}.ln2")))

    def conv(self, x: Tensor, name: str) -> Tensor:
        """One of the three convolutions: ggml_conv_2d (im2col, a matmul, a permuted copy; ggml.c
        4762), stride 2, padding 1, then its bias and GELU."""
        c = self.c
        kernel = c.weight(self.shapes[f"{name}.weight"], dtype=self.types[f"{name}.weight"], name=name)
        c_in, c_out = kernel.ne[2], kernel.ne[3]
        ow, oh, n = (x.ne[0] - 1) // 2 + 1, (x.ne[1] - 1) // 2 + 1, x.ne[3]
        cols_type = "f32" if kernel.dtype == "bf16" else "f16"
        cols = c.new(cols_type, (9 * c_in, ow, oh, n), "IM2COL", (kernel, x))
        out = c.mul_mat(c.reshape(cols, 9 * c_in, n * oh * ow), c.reshape(kernel, 9 * c_in, c_out))
        out = c.cont(c.permute(c.reshape(out, ow, oh, n, c_out), 0, 1, 3, 2))
        bias = c.weight(self.shapes[f"{name}.bias"], name=f"{name}.bias")
        return c.unary("UNARY", c.unary("ADD", out, c.reshape(bias, 1, 1, c_out, 1)))  # GELU (erf)

    def qwen3a(self, n_chunks: int) -> Tensor:
        c, v, e = self.c, self.v, self.v.n_embd
        frames, mel = n_chunks * QWEN3A_CHUNK, self.n_mel
        raw = c.input("f32", (frames, mel, 1), name="inp_raw")
        x = c.cont(
            c.view(raw, (QWEN3A_CHUNK, mel, 1, n_chunks), (frames * 4, QWEN3A_CHUNK * 4, QWEN3A_CHUNK * 4))
        )
        for i in (1, 2, 3):
            x = self.conv(x, f"a.conv2d.{i}")
        x = c.cont(c.permute(x, 2, 0, 1, 3))  # [rows, channels, 13, chunks]
        x = c.reshape(x, x.ne[0] * x.ne[1], x.ne[2] * x.ne[3])
        out = c.weight(
            self.shapes["a.conv_out.weight"], dtype=self.types["a.conv_out.weight"], name="a.conv_out"
        )
        x = c.mul_mat(out, x)
        n_pos = x.ne[1]
        pos = c.weight(self.shapes["a.position_embd.weight"], name="a.position_embd.weight")
        rows = c.view(pos, (e, n_pos // n_chunks), (pos.nb[1],))
        x = c.unary("ADD", x, c.new(pos.dtype, (e, n_pos), "REPEAT", (rows,)))  # ggml_repeat: a's source only
        x = c.reshape(x, e, n_pos)
        if "a.pre_ln.weight" in v.present:
            x = self.norm(x, "a.pre_ln")
        for il in range(v.n_layer):
            x = self.block(il, x, n_pos)
        if "a.post_ln.weight" in v.present:
            x = self.norm(x, "a.post_ln")
        x = c.unary("UNARY", self.linear("mm.a.mlp.1", x, v.mlp_hidden))  # GELU (erf)
        return self.linear("mm.a.mlp.2", x, v.width)


def qwen3a_graph(
    header: Any, info: Any, flash_attn: bool, n_chunks: int = QWEN3A_WINDOW // QWEN3A_CHUNK
) -> Graph:
    """The graph libmtmd builds for a qwen3a window of n_chunks chunks of 100 mel frames (an 8-second
    window: 8; llama-server's warmup, 3000 frames: 30), for graph.py's replay of ggml-alloc."""
    names = frozenset(t.name for t in header.tensors)
    up, conv = header.tensor("mm.a.mlp.1.weight"), header.tensor("a.conv2d.1.weight")
    e, heads = info.width, info.heads
    vit = Vit(
        kind="qwen3a", image=0, patch=1, n_embd=e, n_head=heads, n_head_kv=heads, d_head=e // heads,
        n_ff=info.n_ff, n_layer=info.blocks, width=info.projection_width, merge=1, feature_layers=(),
        present=names, conv_type=conv.type_name.lower(), proj_type="f32", mlp_hidden=up.shape[1],
    )  # fmt: skip
    g = _Qwen3aGraph(vit, flash_attn, header, info.n_mel)
    g.g.expand(g.qwen3a(n_chunks))
    return g.g
