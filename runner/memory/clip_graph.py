"""The graph clip.cpp builds for one image through a vision projector, node for node, for graph.py's
replay of ggml-alloc (projector.py sizes the compute buffer with it).

Line numbers are the pinned clip.cpp's (tools/mtmd/clip.cpp of llama-cpp-python 0.3.36) and its
models/*.cpp's:

- build_inp (572): the patch embedding as ggml_conv_2d (im2col and a matmul, ggml.c 4762);
- mlp: models/llava.cpp (n_layer - 1 blocks, the llava projector mm.0 -> GELU -> mm.2);
- gemma3 and idefics3: build_vit (337) with models/siglip.cpp's pooling and projection (gemma3) or
  its pixel shuffle (build_patch_merge_permute 901) and mm.model.fc (idefics3);
- qwen2vl_merger and qwen2.5vl_merger: models/qwen2vl.cpp, which both share: two patch kernels
  added, each 2 x 2 patches put next to each other, Q and K M-RoPE'd by each patch's row and column,
  for Qwen2.5-VL RMS norms and window attention (a mask over every pair of patches, all but every
  n_wa_pattern-th block), then mm.0 -> GELU -> mm.2 over each 2 x 2 patches. These take an image at
  its own size (mtmd-image.cpp 772: rounded to 2 x 2 patches, at most 4096 tokens: clip.cpp 1678), so
  their Vit is for the largest image libmtmd lets through (vit_of), and ClipGraph takes any other.

ggml visits a node's sources in order (ggml_visit_parents_graph, ggml.c 7245) and build_attn (770)
orders Q, K and V first; the order of the C++ calls that made the tensors does not matter.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import isqrt
from typing import Any

from runner.memory.graph import Ctx, Graph, Tensor

# clip.projector_type -> the kind the graph is built for
MROPE_KINDS = {"qwen2vl_merger": "qwen2vl", "qwen2.5vl_merger": "qwen25vl"}
MROPE_MAX_TOKENS = 4096  # clip.cpp 1678: set_limit_image_tokens(8, 4096), a square of 64 x 64 tokens


@dataclass(frozen=True)
class Vit:
    """What the graph of one image depends on, from the projector's header."""

    kind: str  # mlp, gemma3, idefics3, qwen2vl or qwen25vl
    image: int  # the side of the image the plan counts (M-RoPE kinds: the largest libmtmd takes)
    patch: int
    n_embd: int
    n_head: int
    n_head_kv: int
    d_head: int
    n_ff: int
    n_layer: int
    width: int  # the projection's output: the text model's n_embd
    merge: int  # gemma3's pooling kernel, idefics3's pixel shuffle, Qwen's spatial merge (2)
    feature_layers: tuple[int, ...]
    present: frozenset[str]  # tensor names, for the optional biases and norms
    conv_type: str  # the patch embedding's type ("f16" or "f32"): im2col writes f16 unless bf16
    proj_type: str  # gemma3's input projection's type: its transposed copy is that type
    mlp_hidden: int  # mlp and Qwen: mm.0's output width
    wa_pattern: int = 0  # qwen25vl: every wa_pattern-th block attends to all patches, the rest in windows

    @property
    def mrope(self) -> bool:
        return self.kind in MROPE_KINDS.values()


def vit_of(header: Any, info: Any) -> Vit:
    meta = header.metadata
    e, n_head = meta["clip.vision.embedding_length"], meta["clip.vision.attention.head_count"]
    d_head = meta.get("clip.vision.attention.head_dim") or e // n_head
    kind = MROPE_KINDS.get(info.projector_type, info.projector_type)
    image, n_ff, merge = info.image_size, meta["clip.vision.feed_forward_length"], 1
    if kind in MROPE_KINDS.values():
        # the largest image: max_pixels = 4096 tokens of (patch x merge)^2 px, a square of 64 tokens a
        # side (calc_size_preserved_ratio, mtmd-image.cpp 122, rounds no image past max_pixels but one
        # narrower than a token once scaled down, which it widens to one:
        # an aspect ratio past about 1:4000, not counted)
        merge = meta.get("clip.vision.spatial_merge_size", 2)
        image = isqrt(MROPE_MAX_TOKENS) * info.patch_size * merge
        up = header.tensor("v.blk.0.ffn_up.weight")  # converters may write n_ff 0 (clip.cpp 2334)
        n_ff = up.shape[1] if up.shape[0] == e else up.shape[0]  # or up and down swapped (2350)
    elif kind in ("gemma3", "idefics3"):
        merge = meta.get("clip.vision.projector.scale_factor", 4 if kind == "gemma3" else 1)

    def type_of(name: str) -> str:
        t = header.tensor(name)
        return t.type_name.lower() if t is not None else "f32"

    return Vit(
        kind=kind,
        image=image,
        patch=info.patch_size,
        n_embd=e,
        n_head=n_head,
        n_head_kv=meta.get("clip.vision.attention.head_count_kv", n_head),
        d_head=d_head,
        n_ff=n_ff,
        n_layer=meta["clip.vision.block_count"],
        width=info.projection_width,
        merge=merge,
        feature_layers=tuple(meta.get("clip.vision.feature_layer") or ()),
        present=frozenset(t.name for t in header.tensors),
        conv_type=type_of("v.patch_embd.weight"),
        proj_type=type_of("mm.input_projection.weight"),
        mlp_hidden=mm0.shape[1] if (mm0 := header.tensor("mm.0.weight")) is not None else 0,
        wa_pattern=meta.get("clip.vision.n_wa_pattern", 0) if kind == "qwen25vl" else 0,
    )


class ClipGraph:
    """One clip_graph for an image of nx x ny pixels: the shared pieces of clip.cpp's builders, over
    graph.py's ops."""

    def __init__(self, vit: Vit, flash_attn: bool, nx: int = 0, ny: int = 0) -> None:
        self.v, self.fa = vit, flash_attn
        self.c, self.g = Ctx(), Graph()
        self.nx, self.ny = nx or vit.image, ny or vit.image
        self.px, self.py = self.nx // vit.patch, self.ny // vit.patch  # n_patches_x, n_patches_y (247)
        self.n_side = self.px  # the fixed-size kinds' square
        self.n_patches = self.px * self.py

    def w(self, name: str, *ne: int) -> Tensor | None:
        return self.c.weight(ne, name=name) if name in self.v.present else None

    def add(self, x: Tensor, b: Tensor | None) -> Tensor:
        return self.c.unary("ADD", x, b) if b is not None else x

    def norm(self, x: Tensor, prefix: str) -> Tensor:
        """build_norm (589): the norm (RMS for Qwen2.5-VL), times its weight, plus its bias, where the
        file has them."""
        e = x.ne[0]
        x = self.c.unary("RMS_NORM" if self.v.kind == "qwen25vl" else "NORM", x)
        if (w := self.w(f"{prefix}.weight", e)) is not None:
            x = self.c.unary("MUL", x, w)
        return self.add(x, self.w(f"{prefix}.bias", e))

    def linear(self, prefix: str, x: Tensor, n_out: int) -> Tensor:
        w = self.c.weight((x.ne[0], n_out), name=f"{prefix}.weight")
        return self.add(self.c.mul_mat(w, x), self.w(f"{prefix}.bias", n_out))

    def conv(self, raw: Tensor, name: str) -> Tensor:
        """ggml_conv_2d (ggml.c 4762) by the patch kernel `name`, stride a patch: [px, py, E, 1]."""
        c, v, p = self.c, self.v, self.v.patch
        kernel = c.weight((p, p, 3, v.n_embd), dtype=v.conv_type, name=name)
        cols = c.new(
            "f32" if v.conv_type == "bf16" else "f16",
            (3 * p * p, self.px, self.py, 1),
            "IM2COL",
            (kernel, raw),
        )
        out = c.mul_mat(c.reshape(cols, 3 * p * p, self.n_patches), c.reshape(kernel, 3 * p * p, v.n_embd))
        out = c.reshape(out, self.px, self.py, 1, v.n_embd)
        return c.cont(c.permute(out, 0, 1, 3, 2))

    def raw(self) -> Tensor:
        """build_inp_raw (584): the preprocessed image, f32."""
        return self.c.input("f32", (self.nx, self.ny, 3, 1), name="inp_raw")

    def inp(self) -> Tensor:
        """build_inp (572): the image, im2col'd into patches, times the patch embedding, transposed."""
        c, v = self.c, self.v
        out = c.reshape(self.conv(self.raw(), "v.patch_embd.weight"), self.n_patches, v.n_embd, 1)
        out = c.cont(c.transpose(out))
        return self.add(out, self.w("v.patch_embd.bias", v.n_embd))

    def attn(
        self, blk: str, x: Tensor, n_pos: int, positions: Tensor | None = None, mask: Tensor | None = None
    ) -> Tensor:
        """Q, K, V (M-RoPE'd by positions where given), then build_attn (770): flash attention with K,
        V and the mask cast to f16, or softmax(KQ + mask)V."""
        c, v = self.c, self.v
        heads_kv = v.n_head_kv if v.kind in ("gemma3", "idefics3") else v.n_head
        q = self.linear(f"{blk}.attn_q", x, v.n_head * v.d_head)
        k = self.linear(f"{blk}.attn_k", x, heads_kv * v.d_head)
        val = self.linear(f"{blk}.attn_v", x, heads_kv * v.d_head)
        q = c.reshape(q, v.d_head, v.n_head, n_pos, 1)
        k = c.reshape(k, v.d_head, heads_kv, n_pos, 1)
        val = c.reshape(val, v.d_head, heads_kv, n_pos, 1)
        if positions is not None:  # ggml_rope_multi (qwen2vl.cpp 130)
            q, k = c.unary("ROPE", q, positions), c.unary("ROPE", k, positions)
        for t in (q, k, val):  # ggml_build_forward_order: these three first, in this order
            self.g.expand(t)
        q, k = c.permute(q, 0, 2, 1, 3), c.permute(k, 0, 2, 1, 3)
        if self.fa:
            val = self.cast(c.permute(val, 0, 2, 1, 3))
            k = self.cast(k)
            kq_mask = self.cast(mask) if mask is not None else None  # f16 to f16 too: a copy a block
            out = c.new("f32", (val.ne[0], q.ne[2], q.ne[1], 1), "FLASH_ATTN_EXT", (q, k, val, kq_mask))
            out = c.reshape(out, out.ne[0] * out.ne[1], out.ne[2] * out.ne[3])
        else:
            val = c.cont(c.permute(val, 1, 2, 0, 3))
            kq = c.unary("SOFT_MAX", c.mul_mat(k, q), mask)
            kqv = c.permute(c.mul_mat(val, kq), 0, 2, 1, 3)
            out = c.cont(kqv, (kqv.ne[0] * kqv.ne[1], kqv.ne[2] * kqv.ne[3]))
        return self.linear(f"{blk}.attn_out", out, v.n_embd)

    def cast(self, a: Tensor) -> Tensor:
        """ggml_cast to f16: a new tensor whose second source is itself (ggml.c ggml_cast)."""
        t = self.c.new("f16", a.ne, "CPY", (a,))
        t.src = (a, t)
        return t

    def ffn(
        self, blk: str, x: Tensor, n_ff: int = 0, n_out: int = 0, up: str = "ffn_up", down: str = "ffn_down"
    ) -> Tensor:
        """build_ffn (617): up, the gate where there is one, the activation, down."""
        c, v = self.c, self.v
        tmp = self.linear(f"{blk}.{up}", x, n_ff or v.n_ff)
        if f"{blk}.ffn_gate.weight" in v.present:
            gate = self.linear(f"{blk}.ffn_gate", x, n_ff or v.n_ff)
            cur = c.new("f32", gate.ne, "GLU", (gate, tmp))
        else:
            cur = c.unary("UNARY", tmp)
        return self.linear(f"{blk}.{down}", cur, n_out or v.n_embd)

    def block(
        self, il: int, x: Tensor, n_pos: int, positions: Tensor | None = None, mask: Tensor | None = None
    ) -> Tensor:
        blk = f"v.blk.{il}"
        cur = self.c.unary("ADD", self.attn(blk, self.norm(x, f"{blk}.ln1"), n_pos, positions, mask), x)
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

    def qwen2vl(self) -> Tensor:
        """models/qwen2vl.cpp (build 32) for both Qwen kinds: the two frames' kernels over the one image,
        each 2 x 2 patches' rows made adjacent, the blocks with M-RoPE (and windows), the merger."""
        c, v, e, n = self.c, self.v, self.v.n_embd, self.n_patches
        raw = self.raw()
        x = c.unary("ADD", self.conv(raw, "v.patch_embd.weight"), self.conv(raw, "v.patch_embd.weight.1"))
        x = c.permute(x, 1, 2, 0, 3)  # [E, px, py, 1]
        x = c.reshape(c.cont(x, (e * 2, self.px // 2, self.py, 1)), e * 2, self.px // 2, 2, self.py // 2)
        x = c.cont(c.permute(x, 0, 2, 1, 3), (e, n, 1))
        positions = c.input("i32", (n * 4,), name="positions")
        if "v.pre_ln.weight" in v.present:
            x = self.norm(x, "v.pre_ln")
        mask = None
        if v.wa_pattern > 0:  # the patches in window order, and the mask of each window (79-98)
            inv_window_idx = c.input("i32", (n // 4,), name="inv_window_idx")
            mask = c.input("f32", (n, n), name="window_mask")
            if self.fa:
                mask = self.cast(mask)
            x = c.reshape(c.get_rows(c.reshape(x, e * 4, n // 4), inv_window_idx), e, n, 1)
        for il in range(v.n_layer):
            full = v.wa_pattern == 0 or (il + 1) % v.wa_pattern == 0
            x = self.block(il, x, n, positions, None if full else mask)
        if "v.post_ln.weight" in v.present:
            x = self.norm(x, "v.post_ln")
        x = self.ffn("mm", c.reshape(x, e * 4, n // 4, 1), v.mlp_hidden, v.width, up="0", down="2")
        if v.wa_pattern > 0:  # back in the image's order (189-197)
            window_idx = c.input("i32", (n // 4,), name="window_idx")
            x = c.reshape(c.get_rows(c.reshape(x, v.width, n // 4), window_idx), v.width, n // 4, 1)
        return x

    def build(self) -> Graph:
        builders = {"mlp": self.llava, "gemma3": self.siglip, "idefics3": self.idefics3}
        out = (self.qwen2vl if self.v.mrope else builders[self.v.kind])()
        self.g.expand(out)
        return self.g
